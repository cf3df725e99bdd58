"""``manage.py durable quota [KEY]``: quota usage, for every busy key or one."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ...usage import QuotaUsage
from .base import Subcommand

BAR_WIDTH = 10


class QuotaSubcommand(Subcommand):
    name = "quota"
    help = (
        "Quota usage: every key holding active runs (or KEY): active runs, the limit "
        "declared for it (by its workflows or a schedule), and the workflows."
    )

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument("key", nargs="?", metavar="KEY", help="One quota key, busy or not.")

    def handle(self, **options: Any) -> None:
        usage = self.engine.quota_usage(options["key"])
        if self.as_json:
            self.emit_json(
                [
                    {
                        "key": u.key,
                        "tag": u.tag,
                        "active": u.active,
                        "limit": u.limit,
                        "full": u.full,
                        "workflows": list(u.workflows),
                        "limit_computed": u.limit_computed,
                        "limit_error": u.limit_error,
                    }
                    for u in usage
                ]
            )
            return
        if not usage:
            self.write("No quota key holds active runs.")
            return
        self.table(
            ["KEY", "ACTIVE", "LIMIT", "USE", "WORKFLOWS"],
            ([u.key, u.active, limit_cell(u), bar(u.active, u.limit), u.workflows] for u in usage),
            right=[1, 2],
        )
        notes = limit_notes(usage)
        if notes:
            self.write("")
            for note in notes:
                self.write(note)


def limit_cell(usage: QuotaUsage) -> str | int | None:
    """The LIMIT column: the limit, ``*`` marking one computed per key, ``!`` a limit
    function that failed, nothing when no limit is declared."""
    if usage.limit is not None:
        return f"{usage.limit}*" if usage.limit_computed else usage.limit
    return "!" if usage.limit_error is not None else None


def limit_notes(usage: list[QuotaUsage]) -> list[str]:
    """What the ``*`` and ``!`` of the LIMIT column mean, under the table."""
    notes = []
    if any(u.limit is not None and u.limit_computed for u in usage):
        notes.append("* computed per key (the workflow's limit function, called with the key)")
    notes.extend(
        f"! {u.key}: limit function failed: {u.limit_error}"
        for u in usage
        if u.limit_error is not None
    )
    return notes


def bar(active: int, limit: int | None) -> str:
    """``[#####-----]  50%``; ``full`` at the limit; nothing when the limit is unknown."""
    if limit is None:
        return ""
    if limit <= 0:
        return f"[{'#' * BAR_WIDTH}] full"
    filled = min(BAR_WIDTH, round(active * BAR_WIDTH / limit))
    shown = f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}]"
    return f"{shown} full" if active >= limit else f"{shown} {round(active * 100 / limit):>3}%"


subcommand = QuotaSubcommand
