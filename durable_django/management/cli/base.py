"""What every ``manage.py durable`` subcommand shares: its interface and its output."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any, ClassVar, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...engines import Engine, default_engine
from ...errors import ConcurrencyLimitError
from ...stores.base import RunRecord, StepRecord

#: The exit status of a start refused by the quota: a temporary failure (sysexits'
#: EX_TEMPFAIL), worth trying again once a run of the key has ended.
EXIT_REFUSED = 75


class Subcommand:
    """One subcommand: a ``name``, a one-line ``help``, its arguments and ``handle``.

    Output goes through :meth:`write` (for people), :meth:`table` (aligned columns) and
    :meth:`emit_json` (``--json``, for scripts); failures raise ``CommandError``.
    """

    name: ClassVar[str]
    help: ClassVar[str]

    def __init__(self, command: BaseCommand, *, as_json: bool, engine: Engine | None = None):
        self.command = command
        self.as_json = as_json
        self.engine = engine if engine is not None else default_engine

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        """Add the subcommand's own arguments (``--json`` is added for every one)."""

    def handle(self, **options: Any) -> None:
        """Do the work and write the result."""
        raise NotImplementedError

    # output -----------------------------------------------------------------------------

    def write(self, text: str = "") -> None:
        """A line for people."""
        self.command.stdout.write(text)

    def emit_json(self, data: Any) -> None:
        """One JSON document (one line)."""
        self.command.stdout.write(json.dumps(data, default=_json_default, ensure_ascii=False))

    def refuse(self, error: ConcurrencyLimitError, message: str, **context: Any) -> NoReturn:
        """End with exit status 75 (``EX_TEMPFAIL``) for a start the quota refused: the
        message on stderr, and with ``--json`` the refusal on stdout as
        ``{"refused": "quota", "workflow", "key", "limit", "active", **context}``."""
        if self.as_json:
            self.emit_json(
                {
                    "refused": "quota",
                    "workflow": error.workflow,
                    "key": error.key,
                    "limit": error.limit,
                    "active": error.active,
                    **context,
                }
            )
        raise CommandError(message, returncode=EXIT_REFUSED) from error

    def table(
        self, headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Iterable[int] = ()
    ) -> None:
        """Rows in aligned columns under ``headers``; columns in ``right`` align right."""
        right = set(right)
        cells = [list(headers)] + [[_cell(value) for value in row] for row in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        for row in cells:
            line = "  ".join(
                cell.rjust(width) if i in right else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
            self.write(line.rstrip())


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime.datetime):
        return when(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def when(value: datetime.datetime | None) -> str:
    """A time for people, in the current time zone, to the second."""
    if value is None:
        return "-"
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def run_data(run: RunRecord) -> dict[str, Any]:
    """A run as a JSON object (times in ISO 8601)."""
    return asdict(run)


def step_data(step: StepRecord) -> dict[str, Any]:
    """A recorded step as a JSON object."""
    return asdict(step)


def pretty(value: Any) -> str:
    """A JSON value, indented, for people."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=_json_default)


def short(value: Any, width: int = 60) -> str:
    """A JSON value on one line, cut to ``width`` characters."""
    text = json.dumps(value, ensure_ascii=False, default=_json_default)
    return text if len(text) <= width else text[: width - 3] + "..."
