"""``manage.py durable quota [KEY]``: quota usage, for every busy key or one."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ..._runtime import estimates
from ..._runtime.estimates import Estimate
from ..._runtime.usage import QuotaUsage, estimate_for
from ...tasks_backend import shown_usage
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
        parser.add_argument(
            "--estimate",
            action="store_true",
            help="Also the age of each key's oldest holder and when its next slot likely "
            "frees, estimated as a refused start's retry_after is.",
        )

    def handle(self, **options: Any) -> None:
        usage = [shown_usage(self.engine, u) for u in self.engine.quota_usage(options["key"])]
        found = {u.key: estimate_for(self.engine, u) for u in usage} if options["estimate"] else {}
        if self.as_json:
            self.emit_json([{**usage_json(u), **estimate_json(u, found)} for u in usage])
            return
        if not usage:
            self.write("No quota key holds active runs.")
            return
        headers = ["KEY", "ACTIVE", "LIMIT", "USE", "WORKFLOWS"]
        rows = [
            [u.key, u.active, limit_cell(u), bar(u.active, u.limit), u.workflows] for u in usage
        ]
        if options["estimate"]:
            headers[4:4] = ["OLDEST", "NEXT SLOT"]
            for row, u in zip(rows, usage, strict=True):
                row[4:4] = estimate_cells(u, found[u.key])
        self.table(headers, rows, right=[1, 2])
        notes = limit_notes(usage)
        if notes:
            self.write("")
            for note in notes:
                self.write(note)


def usage_json(u: QuotaUsage) -> dict[str, Any]:
    """One key's usage, for scripts."""
    return {
        "key": u.key,
        "tag": u.tag,
        "active": u.active,
        "limit": u.limit,
        "full": u.full,
        "workflows": list(u.workflows),
        "limit_computed": u.limit_computed,
        "limit_error": u.limit_error,
    }


def estimate_json(u: QuotaUsage, found: dict[str, Estimate | None]) -> dict[str, Any]:
    """With ``--estimate``: the oldest holder's age, and the next slot's estimate (``None``
    while a slot is free or nothing holds the key) with what it is based on."""
    if u.key not in found:
        return {}
    estimate = found[u.key]
    if estimate is None:
        return {"oldest_age": None, "retry_after": None, "basis": None}
    free = u.limit is not None and not u.full
    return {
        "oldest_age": estimate.oldest_age,
        "retry_after": None if free else estimate.seconds,
        "basis": estimate.basis,
    }


def estimate_cells(u: QuotaUsage, estimate: Estimate | None) -> list[str]:
    """The OLDEST and NEXT SLOT columns: ``free`` while a slot is; ``?`` without history."""
    if estimate is None:
        return ["", ""]
    oldest = f"{estimate.oldest_age:.1f}s" if estimate.oldest_age is not None else ""
    if u.limit is not None and not u.full:
        return [oldest, "free"]
    if estimate.basis != estimates.HISTORY:
        return [oldest, "?"]
    return [oldest, f"~{estimate.seconds:.1f}s"]


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
