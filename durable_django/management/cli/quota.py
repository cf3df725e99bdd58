"""``manage.py durable quota [KEY]``: quota usage, for every busy key or one, then the
rate limit keys' windows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandParser

from ..._runtime import estimates
from ..._runtime.estimates import Estimate
from ..._runtime.usage import QuotaUsage, RateUsage, estimate_for, has_window
from ...tasks_backend import shown_usage
from .base import Subcommand

BAR_WIDTH = 10


class QuotaSubcommand(Subcommand):
    name = "quota"
    help = (
        "Quota usage: every key holding active runs (or KEY): active runs, the limit "
        "declared for it (by its workflows or a schedule), and the workflows; then "
        "every rate limit key with runs in its window (or KEY's): units used against "
        "the limit per window, and when the next unit frees."
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
        rates = [u for u in self.engine.rate_usage(options["key"]) if has_window(u)]
        found = {u.key: estimate_for(self.engine, u) for u in usage} if options["estimate"] else {}
        if self.as_json:
            self.emit_json(
                [{**usage_json(u), **estimate_json(u, found)} for u in usage]
                + [rate_json(u) for u in rates]
            )
            return
        if usage:
            self.quota_table(usage, found, options["estimate"])
        else:
            self.write("No quota key holds active runs.")
        if rates:
            self.write("")
            self.rate_table(rates)
        notes = limit_notes([*usage, *rates])
        if notes:
            self.write("")
            for note in notes:
                self.write(note)

    def quota_table(
        self, usage: list[QuotaUsage], found: dict[str, Estimate | None], estimate: bool
    ) -> None:
        """The concurrency keys' table (with ``--estimate``, OLDEST and NEXT SLOT)."""
        headers = ["KEY", "ACTIVE", "LIMIT", "USE", "WORKFLOWS"]
        rows = [
            [u.key, u.active, limit_cell(u), bar(u.active, u.limit), u.workflows] for u in usage
        ]
        if estimate:
            headers[4:4] = ["OLDEST", "NEXT SLOT"]
            for row, u in zip(rows, usage, strict=True):
                row[4:4] = estimate_cells(u, found[u.key])
        self.table(headers, rows, right=[1, 2])

    def rate_table(self, rates: list[RateUsage]) -> None:
        """The rate limit keys' table: units used in the window against the limit per
        window, and when a start of weight 1 next fits."""
        headers = ["RATE KEY", "USED", "LIMIT", "PER", "USE", "NEXT UNIT", "WORKFLOWS"]
        rows = [
            [
                u.key,
                u.used,
                limit_cell(u),
                f"{u.per:g}s" if u.per is not None else None,
                bar(u.used, u.limit),
                next_unit_cell(u),
                u.workflows,
            ]
            for u in rates
        ]
        self.table(headers, rows, right=[1, 2, 3])


def usage_json(u: QuotaUsage) -> dict[str, Any]:
    """One key's usage, for scripts."""
    return {
        "kind": "concurrency",
        "key": u.key,
        "tag": u.tag,
        "active": u.active,
        "limit": u.limit,
        "full": u.full,
        "workflows": list(u.workflows),
        "limit_computed": u.limit_computed,
        "limit_error": u.limit_error,
    }


def rate_json(u: RateUsage) -> dict[str, Any]:
    """One rate limit key's window, for scripts (``"kind": "rate"``)."""
    return {
        "kind": "rate",
        "key": u.key,
        "tag": u.tag,
        "used": u.used,
        "limit": u.limit,
        "per": u.per,
        "full": u.full,
        "retry_after": u.retry_after,
        "workflows": list(u.workflows),
        "limit_computed": u.limit_computed,
        "limit_error": u.limit_error,
    }


def next_unit_cell(u: RateUsage) -> str | None:
    """The NEXT UNIT column: ``free`` while a start of weight 1 fits, else in how long;
    nothing when the limit is unknown."""
    if u.retry_after is None:
        return None
    return f"in {u.retry_after:.1f}s" if u.full else "free"


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


def limit_cell(usage: QuotaUsage | RateUsage) -> str | int | None:
    """The LIMIT column: the limit, ``*`` marking one computed per key, ``!`` a limit
    function that failed, nothing when no limit is declared."""
    if usage.limit is not None:
        return f"{usage.limit}*" if usage.limit_computed else usage.limit
    return "!" if usage.limit_error is not None else None


def limit_notes(usage: Sequence[QuotaUsage | RateUsage]) -> list[str]:
    """What the ``*`` and ``!`` of the LIMIT columns mean, under the tables (a rate
    limit key's failure named ``rate KEY``)."""
    notes = []
    if any(u.limit is not None and u.limit_computed for u in usage):
        notes.append("* computed per key (the workflow's limit function, called with the key)")
    notes.extend(
        f"! {'rate ' if isinstance(u, RateUsage) else ''}{u.key}: limit function failed: "
        f"{u.limit_error}"
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
