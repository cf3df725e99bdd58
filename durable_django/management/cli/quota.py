"""``manage.py durable quota [KEY]``: quota usage, for every busy key or one."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from .base import Subcommand

BAR_WIDTH = 10


class QuotaSubcommand(Subcommand):
    name = "quota"
    help = (
        "Quota usage: every key holding active runs (or KEY): active runs, the limit its "
        "workflows declare, and the workflows."
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
            ([u.key, u.active, u.limit, bar(u.active, u.limit), u.workflows] for u in usage),
            right=[1, 2],
        )


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
