"""When schedules fire: their timings, their windows, and the schedules declared on
workflows. Pure arithmetic: no database (the ``Schedule`` rows and their firing are in
:mod:`durable_django._runtime.schedules`).

A schedule starts one run of its workflow per window: every ``interval_seconds``
(windows aligned on multiples of the interval since the epoch), or at each time of a cron
expression read in an IANA timezone. Each window has a deterministic run id,
``sched:<key>:<window>``, so the idempotent start makes a window fire at most once however
many tickers race. After downtime only the latest missed window fires.

Daylight saving time: a cron time that does not exist (the spring-forward hour) fires at
the first time after the gap; a time that happens twice (the fall-back hour) fires once,
at its first occurrence, unless the hour field is ``*`` (hourly and finer schedules fire
on every real hour).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter
from django.utils import timezone

from .._core import limits
from .._core.limits import text_lengths
from .._core.serialization import json_copy, length_problem, number_problem, validate_text
from . import concurrency as quotas

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

#: A cron expression must match at least once within this many years. The longest gap
#: between two times of one that fires at all is eight years (29 February across 2100).
CRON_HORIZON_YEARS = 10


# validation -------------------------------------------------------------------------


def validate_timing(cron: str, timezone_name: str, interval_seconds: int | None) -> None:
    """Refuse a timing that could not fire: both or neither of cron and interval, a bad
    cron expression or one that never matches, an unknown timezone, an interval that is
    not a positive int."""
    if bool(cron) == (interval_seconds is not None):
        raise ValueError("a schedule needs exactly one of a cron expression and an interval")
    if cron:
        if not isinstance(cron, str) or not croniter.is_valid(cron):
            raise ValueError(f"invalid cron expression {cron!r}")
        if len(cron.split()) != 5:
            raise ValueError(f"a cron expression has five fields; {cron!r} has {len(cron.split())}")
        start = timezone.now().astimezone(zone(timezone_name))
        try:
            croniter(cron, start, max_years_between_matches=CRON_HORIZON_YEARS).get_next()
        except CroniterBadDateError:
            raise ValueError(
                f"cron expression {cron!r} never fires: no time matches it within "
                f"{CRON_HORIZON_YEARS} years (a day its month does not have?)"
            ) from None
    elif isinstance(interval_seconds, bool) or not isinstance(interval_seconds, int):
        raise TypeError(f"interval must be a whole number of seconds, not {interval_seconds!r}")
    elif interval_seconds <= 0:
        raise ValueError(f"interval must be positive, not {interval_seconds}")


def zone(name: str) -> ZoneInfo:
    """The IANA timezone ``name``, or a ``ValueError`` naming it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(
            f"unknown timezone {name!r}; use an IANA name like 'Europe/Paris'"
        ) from None


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule declared next to its workflow: ``@workflow(..., schedule=...)``.

    Give a ``key`` (stable, unique among schedules) and either ``cron`` (five fields,
    read in ``timezone``) or ``interval`` (seconds or a ``timedelta``). ``input`` is the
    runs' input; ``concurrency`` a quota of the schedule's own (replacing the workflow's).
    """

    key: str
    cron: str = ""
    interval: int | None = None
    timezone: str = "UTC"
    input: Any = None
    concurrency: Mapping[str, Any] | None = field(default=None)
    enabled: bool = True

    @classmethod
    def build(cls, value: ScheduleSpec | Mapping[str, Any]) -> ScheduleSpec:
        """A checked spec from a spec or a dict with the same keys."""
        if isinstance(value, ScheduleSpec):
            options = {name: getattr(value, name) for name in cls.__dataclass_fields__}
        elif isinstance(value, Mapping):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown schedule option(s) {sorted(unknown)}")
            options = dict(value)
        else:
            raise TypeError(f"a schedule is a dict or a ScheduleSpec, not {type(value).__name__}")
        interval = options.get("interval")
        if isinstance(interval, datetime.timedelta):
            seconds = interval.total_seconds()
            if seconds != int(seconds):
                raise ValueError(f"interval must be a whole number of seconds, not {interval!r}")
            options["interval"] = int(seconds)
        concurrency = options.get("concurrency")
        if isinstance(concurrency, quotas.Concurrency):
            options["concurrency"] = {
                "key": concurrency.key,
                "limit": concurrency.limit,
                "count_statuses": list(concurrency.count_statuses),
                **({} if concurrency.weight == 1 else {"weight": concurrency.weight}),
            }
        spec = cls(**options)
        validate_text(spec.key, "a schedule key", text_lengths().schedule_key)
        validate_timing(spec.cron, spec.timezone, spec.interval)
        json_copy(spec.input, f"the input of schedule {spec.key!r}")
        if spec.concurrency is not None:
            if not isinstance(spec.concurrency, Mapping):
                raise TypeError(
                    f"schedule {spec.key!r}: its own concurrency is one quota (a Concurrency "
                    f"or a dict), not {type(spec.concurrency).__name__}"
                )
            (own,) = quotas.for_start(spec.concurrency)
            if own.weight != 1:
                raise ValueError(
                    f"schedule {spec.key!r}: its own quota takes no weight (its runs weigh 1); "
                    f"a weight is declared on the workflow's quotas"
                )
        # What the row's columns hold, past the checks above: the model's lengths and
        # ranges are these.
        problems = (
            length_problem("cron", spec.cron, limits.SCHEDULE_CRON),
            length_problem(
                "concurrency key", spec.row_fields()["concurrency_key"], limits.SCHEDULE_QUOTA_KEY
            ),
            spec.interval
            and number_problem("interval seconds", spec.interval, 0, limits.MAX_INTERVAL),
        )
        for problem in problems:
            if problem:
                raise ValueError(f"schedule {spec.key!r}: {problem}")
        return spec

    def row_fields(self) -> dict[str, Any]:
        """The fields of the schedule's row this declaration sets (all but the workflow)."""
        concurrency = dict(self.concurrency or {})
        return {
            "input": self.input,
            "cron": self.cron,
            "timezone": self.timezone,
            "interval_seconds": self.interval,
            "enabled": self.enabled,
            "concurrency_key": concurrency.get("key", ""),
            "concurrency_limit": concurrency.get("limit"),
            "concurrency_statuses": list(concurrency.get("count_statuses") or []),
        }


def schedule_quota(
    key: str, limit: int | None, statuses: list[str] | None
) -> quotas.Concurrency | None:
    """A schedule's own quota as a per-start one, or ``None`` when it has none."""
    if not key:
        return None
    if limit is None:
        raise ValueError("a schedule's concurrency key needs a limit")
    (own,) = quotas.for_start(
        {
            "key": key,
            "limit": limit,
            "count_statuses": statuses or quotas.DEFAULT_CONCURRENCY_STATUSES,
        }
    )
    return own


# windows ----------------------------------------------------------------------------


def _is_repeated(moment: datetime.datetime, tz: ZoneInfo) -> bool:
    """Whether ``moment`` is the second occurrence of a wall time (the fall-back hour)."""
    wall = moment.astimezone(tz).replace(tzinfo=None)
    first = wall.replace(tzinfo=tz, fold=0).utcoffset()
    second = wall.replace(tzinfo=tz, fold=1).utcoffset()
    return first != second and moment.utcoffset() == second


def _cron_moments(
    cron: str, tz: ZoneInfo, start: datetime.datetime, forward: bool
) -> Iterator[datetime.datetime]:
    hour_is_wildcard = cron.split()[1] == "*"
    moments = croniter(cron, start.astimezone(tz))
    while True:
        moment = (
            moments.get_next(datetime.datetime) if forward else moments.get_prev(datetime.datetime)
        )
        if hour_is_wildcard or not _is_repeated(moment, tz):
            yield moment.astimezone(datetime.UTC)


def next_window(
    cron: str, tz_name: str, interval: int | None, after: datetime.datetime
) -> datetime.datetime:
    """The first window strictly after ``after``."""
    if interval:
        elapsed = (after - EPOCH).total_seconds()
        return EPOCH + datetime.timedelta(seconds=(int(elapsed // interval) + 1) * interval)
    return next(_cron_moments(cron, zone(tz_name), after, forward=True))


def latest_window(
    cron: str, tz_name: str, interval: int | None, now: datetime.datetime
) -> datetime.datetime:
    """The last window at or before ``now``."""
    if interval:
        elapsed = (now - EPOCH).total_seconds()
        return EPOCH + datetime.timedelta(seconds=int(elapsed // interval) * interval)
    return next(_cron_moments(cron, zone(tz_name), now + datetime.timedelta(seconds=1), False))


def window_run_id(schedule_key: str, window: datetime.datetime) -> str:
    """The run id of one window: ``sched:<key>:<window in UTC, ISO 8601>``."""
    return f"sched:{schedule_key}:{window.astimezone(datetime.UTC).isoformat()}"
