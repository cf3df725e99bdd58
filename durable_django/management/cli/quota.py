"""``manage.py durable quota [KEY]``: quota usage, for every busy key or one, then the
rate limit keys' windows, each with the operator's override in force; and
``--set KEY=LIMIT`` / ``--pause KEY`` / ``--clear KEY`` (``--rate``: of a rate limit key,
``--until``: when it ends) to set or clear an override."""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from ..._rules.overrides import Kind, Override
from ..._runtime import estimates
from ..._runtime.estimates import Estimate
from ..._runtime.usage import QuotaUsage, RateUsage, estimate_for, has_window
from ...tasks_backend import shown_usage
from .base import Subcommand, when

BAR_WIDTH = 10

#: A duration for ``--until``: ``90s``, ``30m``, ``2h``, ``1d``, or several, ``1h30m``.
DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")

#: The options that write an override.
WRITES = ("set", "pause", "clear")


class QuotaSubcommand(Subcommand):
    name = "quota"
    help = (
        "Quota usage: every key holding active runs or overridden (or KEY): active "
        "runs, the limit declared for it (by its workflows or a schedule), its override, "
        "and the workflows; then every rate limit key with runs in its window or "
        "overridden (or KEY's): units used against the limit per window, and when the "
        "next unit frees. --set KEY=LIMIT, --pause KEY and --clear KEY (--rate for a "
        "rate limit key) write an override."
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
        writes = parser.add_mutually_exclusive_group()
        writes.add_argument(
            "--set",
            metavar="KEY=LIMIT",
            help="Limit KEY to LIMIT (0 pauses it) in place of its declared limit, for the "
            "next start in every process, until --until or --clear.",
        )
        writes.add_argument(
            "--pause", metavar="KEY", help="Refuse every start of KEY (an override of 0)."
        )
        writes.add_argument(
            "--clear", metavar="KEY", help="End KEY's override: its declared limit applies again."
        )
        parser.add_argument(
            "--rate",
            action="store_true",
            help="--set, --pause or --clear a rate limit key's override (a limit per its "
            "declared window) instead of a concurrency key's.",
        )
        parser.add_argument(
            "--until",
            metavar="WHEN",
            help="When the override of --set or --pause ends by itself: a duration from now "
            "(90s, 30m, 2h, 1d, 1h30m) or an ISO 8601 time with its offset "
            "(2026-12-07T08:00:00+00:00). Without it, it lasts until --clear.",
        )

    def handle(self, **options: Any) -> None:
        write = next((name for name in WRITES if options.get(name) is not None), None)
        if write is not None:
            self.change(write, options)
            return
        for name in ("rate", "until"):
            if options.get(name):
                raise CommandError(f"--{name} goes with --set, --pause or --clear")
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

    def change(self, write: str, options: dict[str, Any]) -> None:
        """Set, pause or clear the override of one key, and say what was done."""
        for name in ("key", "estimate"):
            if options.get(name):
                shown = "KEY" if name == "key" else f"--{name}"
                raise CommandError(f"{shown} does not go with --{write}")
        kind: Kind = "rate" if options["rate"] else "concurrency"
        if write == "clear":
            if options["until"] is not None:
                raise CommandError("--until goes with --set or --pause, not --clear")
            self.clear(options["clear"], kind)
            return
        if write == "set":
            key, limit = parse_setting(options["set"])
        else:
            key, limit = options["pause"], 0
        until = parse_until(options["until"], timezone.now())
        setter = self.engine.set_rate_limit if kind == "rate" else self.engine.set_limit
        try:
            override = setter(key, limit, until)
        except (TypeError, ValueError) as error:
            raise CommandError(str(error)) from error
        if self.as_json:
            self.emit_json(
                {"action": write, "kind": kind, "key": key, "override": override_json(override)}
            )
        else:
            self.write(f"{set_text(override)}.")

    def clear(self, key: str, kind: Kind) -> None:
        """End the override of ``key``, saying whether there was one."""
        clearer = self.engine.clear_rate_limit if kind == "rate" else self.engine.clear_limit
        try:
            cleared = clearer(key)
        except (TypeError, ValueError) as error:
            raise CommandError(str(error)) from error
        if self.as_json:
            self.emit_json({"action": "clear", "kind": kind, "key": key, "cleared": cleared})
        elif cleared:
            self.write(f"Cleared the override of {kind} key {key}: its declared limit applies.")
        else:
            self.write(f"{kind.capitalize()} key {key} had no override: nothing cleared.")

    def quota_table(
        self, usage: list[QuotaUsage], found: dict[str, Estimate | None], estimate: bool
    ) -> None:
        """The concurrency keys' table (with ``--estimate``, OLDEST and NEXT SLOT; with an
        override in force for one of them, OVERRIDE after LIMIT)."""
        headers = ["KEY", "ACTIVE", "LIMIT", "USE", "WORKFLOWS"]
        rows = [
            [u.key, u.active, limit_cell(u), bar(u.active, u.limit_in_force), u.workflows]
            for u in usage
        ]
        if estimate:
            headers[4:4] = ["OLDEST", "NEXT SLOT"]
            for row, u in zip(rows, usage, strict=True):
                row[4:4] = estimate_cells(u, found[u.key])
        if any(u.override is not None for u in usage):
            headers.insert(3, "OVERRIDE")
            for row, u in zip(rows, usage, strict=True):
                row.insert(3, override_cell(u.override))
        self.table(headers, rows, right=[1, 2])

    def rate_table(self, rates: list[RateUsage]) -> None:
        """The rate limit keys' table: units used in the window against the limit in
        force per window, and when a start of weight 1 next fits (with an override in
        force for one of them, OVERRIDE after LIMIT)."""
        headers = ["RATE KEY", "USED", "LIMIT", "PER", "USE", "NEXT UNIT", "WORKFLOWS"]
        rows = [
            [
                u.key,
                u.used,
                limit_cell(u),
                f"{u.per:g}s" if u.per is not None else None,
                bar(u.used, u.limit_in_force),
                next_unit_cell(u),
                u.workflows,
            ]
            for u in rates
        ]
        right = [1, 2, 3]
        if any(u.override is not None for u in rates):
            headers.insert(3, "OVERRIDE")
            for row, u in zip(rows, rates, strict=True):
                row.insert(3, override_cell(u.override))
            right = [1, 2, 4]
        self.table(headers, rows, right=right)


def parse_setting(value: str) -> tuple[str, int]:
    """``KEY=LIMIT`` of ``--set`` as ``(key, limit)`` (the key may hold ``=`` itself)."""
    key, sep, limit = value.rpartition("=")
    if not sep or not key:
        raise CommandError(f"--set takes KEY=LIMIT (tenant:acme=20), not {value!r}")
    try:
        return key, int(limit)
    except ValueError:
        raise CommandError(
            f"--set {value!r}: the limit must be a whole number, not {limit!r}"
        ) from None


def parse_until(value: str | None, now: datetime.datetime) -> datetime.datetime | None:
    """``--until``: a duration from ``now`` (``30m``, ``2h``, ``1d``, ``1h30m``) or an ISO
    8601 time with its UTC offset; ``None`` when not given."""
    if value is None:
        return None
    value = value.strip()
    found = DURATION.fullmatch(value)
    if value and found:
        days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
        delta = datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        return now + delta
    try:
        until = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(
            f"--until takes a duration (30m, 2h, 1d) or an ISO 8601 time with its offset "
            f"(2026-12-07T08:00:00+00:00), not {value!r}"
        ) from None
    if timezone.is_naive(until):
        raise CommandError(
            f"--until {value!r} has no UTC offset: give one (2026-12-07T08:00:00+00:00) "
            "or a duration (30m, 2h, 1d)"
        )
    return until


def set_text(override: Override) -> str:
    """What setting ``override`` did, for people: ``Limited concurrency key tenant:acme
    to 20 until 2026-12-07 08:00:00``, or ``Paused ...``."""
    until = "" if override.until is None else f" until {when(override.until)}"
    if override.paused:
        return f"Paused {override.kind} key {override.key}{until}"
    return f"Limited {override.kind} key {override.key} to {override.limit}{until}"


def override_cell(override: Override | None) -> str | None:
    """The OVERRIDE column: the override's limit (``paused`` for 0) and its end."""
    if override is None:
        return None
    limit = "paused" if override.paused else str(override.limit)
    return limit if override.until is None else f"{limit} until {when(override.until)}"


def override_json(override: Override | None) -> dict[str, Any] | None:
    """An override, for scripts: its ``limit``, ``until``, ``paused`` and ``changed_at``."""
    if override is None:
        return None
    return {
        "limit": override.limit,
        "until": override.until,
        "paused": override.paused,
        "changed_at": override.changed_at,
    }


def usage_json(u: QuotaUsage) -> dict[str, Any]:
    """One key's usage, for scripts."""
    return {
        "kind": "concurrency",
        "key": u.key,
        "tag": u.tag,
        "active": u.active,
        "limit": u.limit,
        "override": override_json(u.override),
        "limit_in_force": u.limit_in_force,
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
        "override": override_json(u.override),
        "limit_in_force": u.limit_in_force,
        "per": u.per,
        "full": u.full,
        "retry_after": u.retry_after,
        "workflows": list(u.workflows),
        "limit_computed": u.limit_computed,
        "limit_error": u.limit_error,
    }


def next_unit_cell(u: RateUsage) -> str | None:
    """The NEXT UNIT column: ``free`` while a start of weight 1 fits, else in how long
    (``paused`` while an override of 0 is); nothing when the limit is unknown."""
    if u.override is not None and u.override.paused:
        return "paused"
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
    free = u.limit_in_force is not None and not u.full
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
    if u.override is not None and u.override.paused:
        return [oldest, "paused"]
    if u.limit_in_force is not None and not u.full:
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
