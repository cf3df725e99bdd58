"""A turn's failures as stored JSON: an error, a quota refusal (read back as the same
refusal on a replay), and the end of a turn the database refused to store."""

from __future__ import annotations

import traceback
from typing import Any

from ..._core.limits import MAX_ERROR_MESSAGE, MAX_ERROR_TRACEBACK
from ..._core.serialization import storable_text
from ...errors import ConcurrencyLimitError, RateLimitError, UnstorableValueError


def error_payload(error: BaseException) -> dict[str, Any]:
    """A failure as JSON any store holds: its type, message and traceback, with the
    characters a database refuses replaced and their length bounded. For a value that
    could not be stored, also which value (``value``), where in it (``path``) and why
    (``rule``)."""
    try:
        message = str(error)
    except Exception:
        message = f"<str() of {type(error).__name__} failed>"
    try:
        trace = "".join(traceback.format_exception(error))
    except Exception:
        trace = ""
    payload = {
        "type": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": message,
        "traceback": trace,
    }
    if isinstance(error, UnstorableValueError):
        payload.update(value=error.what, path=error.path, rule=error.rule)
    return {
        name: storable_text(
            text,
            MAX_ERROR_TRACEBACK if name == "traceback" else MAX_ERROR_MESSAGE,
            keep_end=name == "traceback",
        )
        for name, text in payload.items()
    }


def refusal_payload(error: ConcurrencyLimitError) -> dict[str, Any]:
    """A quota refusal as JSON, so a replay can raise the same refusal."""
    return {
        **error_payload(error),
        "workflow": error.workflow,
        "key": error.key,
        "limit": error.limit,
        "active": error.active,
        "retry_after": error.retry_after,
        **({"per": error.per} if isinstance(error, RateLimitError) else {}),
    }


def refusal_from(payload: dict[str, Any]) -> ConcurrencyLimitError:
    """The refusal a :func:`refusal_payload` recorded, raised again on a replay."""
    # retry_after is recorded so that every replay sees the same; older records lack it.
    if "per" in payload:
        return RateLimitError(
            payload["workflow"],
            payload["key"],
            payload["limit"],
            payload["active"],
            payload["per"],
            payload["retry_after"],
        )
    return ConcurrencyLimitError(
        payload["workflow"],
        payload["key"],
        payload["limit"],
        payload["active"],
        payload.get("retry_after", 0),
    )


def unwritten_payload(status: str, error: Exception) -> dict[str, Any]:
    """The error record of a run whose turn's end the database refused: ASCII text of
    bounded length, which every database and character set holds."""

    def ascii_text(text: str) -> str:
        return text.encode("ascii", "backslashreplace").decode("ascii")

    refused = error_payload(error)
    message = f"the end of the turn ({status}) could not be stored: {refused['message']}"
    return {
        "type": ascii_text(refused["type"][:200]),
        "message": ascii_text(message[:2000]),
        "traceback": ascii_text(refused["traceback"][-10_000:]),
        "unwritten": status,
    }


__all__ = ["error_payload", "refusal_from", "refusal_payload", "unwritten_payload"]
