"""Operator overrides: a limit an operator sets for one quota key, in place of the
declared (or per-start) one, without a deploy.

An override belongs to a key's tag (``concurrency:<key>`` or ``rate:<key>``) and to a
``scope``: the namespace of the engine that set it when that engine's reads are scoped
to its namespace, else ``""`` (the starts that count every namespace), so that it
applies to exactly the starts that count the runs it limits (:func:`scope_of`). It is in
force from when it is stored until ``until`` (for good when ``None``), and a start reads
it under its keys' locks, beside their units: the next start in every process uses it,
and a run admitted before keeps its place. :func:`in_force` applies the limits read to a
start's quotas before the admission rule decides (``admission.decide``); the SQL paths
read the same row the same way (``start_text.override_limit``, the MariaDB procedure).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .._core.limits import MAX_LIMIT, RATE_TAG_PREFIX, TAG_PREFIX
from .concurrency import Quota, quota_tag, rate_tag, validate_key

__all__ = [
    "KINDS",
    "Override",
    "check_override_limit",
    "check_until",
    "checked",
    "in_force",
    "override_tag",
    "scope_of",
]

Kind = Literal["concurrency", "rate"]

#: The kinds of key an override applies to, by the prefix of their tag.
KINDS: dict[str, str] = {"concurrency": TAG_PREFIX, "rate": RATE_TAG_PREFIX}


@dataclass(frozen=True, slots=True)
class Override:
    """An operator's limit for a key (``kind`` ``"concurrency"`` or ``"rate"``), in force
    until ``until`` (for good when ``None``) for the starts of ``scope`` (a namespace, or
    ``""``: the starts that count every namespace); ``changed_at`` is when it was set."""

    key: str
    kind: Kind
    limit: int
    until: datetime.datetime | None = None
    scope: str = ""
    changed_at: datetime.datetime | None = None

    @property
    def tag(self) -> str:
        """The tag of the key's runs, which the override is stored under."""
        return override_tag(self.key, self.kind)

    @property
    def paused(self) -> bool:
        """Whether it refuses every start of the key (a limit of 0)."""
        return self.limit == 0

    def live(self, now: datetime.datetime) -> bool:
        """Whether it is in force at ``now``: ``until`` not reached."""
        return self.until is None or self.until > now

    @classmethod
    def from_tag(
        cls,
        tag: str,
        limit: int,
        until: datetime.datetime | None,
        scope: str,
        changed_at: datetime.datetime | None = None,
    ) -> Override:
        """The override stored under ``tag``."""
        for kind, prefix in KINDS.items():
            if tag.startswith(prefix):
                return cls(tag[len(prefix) :], kind, limit, until, scope, changed_at)  # type: ignore[arg-type]
        raise ValueError(f"{tag!r} is not the tag of a quota key")


def override_tag(key: str, kind: str) -> str:
    """The tag of ``key`` for an override of ``kind``; ``ValueError`` for another kind."""
    if kind == "concurrency":
        return quota_tag(key)
    if kind == "rate":
        return rate_tag(key)
    raise ValueError(f"an override's kind is 'concurrency' or 'rate', not {kind!r}")


def scope_of(read_namespace: str | None) -> str:
    """The scope of the overrides a start reading ``read_namespace`` obeys (and an
    engine reading it sets): that namespace, or ``""`` when it reads every namespace."""
    return read_namespace or ""


def check_override_limit(limit: object) -> int:
    """``limit`` if it is an override's limit: an int from 0 (which pauses the key) to the
    highest limit; else ``TypeError`` or ``ValueError`` naming what is wrong."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"an override's limit must be an int, not {type(limit).__name__}")
    if not 0 <= limit <= MAX_LIMIT:
        raise ValueError(f"an override's limit must be between 0 and {MAX_LIMIT}, not {limit}")
    return limit


def check_until(until: object, now: datetime.datetime) -> datetime.datetime | None:
    """``until`` if it can end an override: ``None``, or an aware datetime after ``now``."""
    if until is None:
        return None
    if not isinstance(until, datetime.datetime):
        raise TypeError(f"until must be a datetime or None, not {type(until).__name__}")
    if until.tzinfo is None or until.utcoffset() is None:
        raise ValueError("until must be an aware datetime (with its time zone)")
    if until <= now:
        raise ValueError(f"until ({until.isoformat()}) is not in the future")
    return until


def checked(key: object, kind: str, limit: object, until: object, now: datetime.datetime) -> None:
    """Refuse an override that cannot be stored, naming what is wrong."""
    validate_key(key, f"{kind} key")
    check_override_limit(limit)
    check_until(until, now)


def in_force(quotas: Sequence[Quota], limits: Mapping[str, int]) -> tuple[Quota, ...]:
    """``quotas`` with each key's limit replaced by its override's, ``limits`` (by tag)
    being the overrides in force read under the keys' locks; the others as they are."""
    if not limits:
        return tuple(quotas)
    return tuple(
        dataclasses.replace(quota, limit=limits[quota.tag]) if quota.tag in limits else quota
        for quota in quotas
    )
