"""Persisted schedules: when each fires, and firing the due windows under their quotas.

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
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.utils import timezone

from . import concurrency as quotas
from .errors import ConcurrencyLimitError, DurableError
from .limits import text_lengths
from .serialization import json_copy, validate_text

if TYPE_CHECKING:
    from .engines import Engine
    from .models import Schedule

logger = logging.getLogger("durable_django.schedules")

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


# validation -------------------------------------------------------------------------


def validate_timing(cron: str, timezone_name: str, interval_seconds: int | None) -> None:
    """Refuse a timing that could not fire: both or neither of cron and interval, a bad
    cron expression, an unknown timezone, an interval that is not a positive int."""
    if bool(cron) == (interval_seconds is not None):
        raise ValueError("a schedule needs exactly one of a cron expression and an interval")
    if cron:
        if not isinstance(cron, str) or not croniter.is_valid(cron):
            raise ValueError(f"invalid cron expression {cron!r}")
        if len(cron.split()) != 5:
            raise ValueError(f"a cron expression has five fields; {cron!r} has {len(cron.split())}")
        zone(timezone_name)
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
            options["interval"] = int(interval.total_seconds())
        concurrency = options.get("concurrency")
        if isinstance(concurrency, quotas.Concurrency):
            options["concurrency"] = {
                "key": concurrency.key,
                "limit": concurrency.limit,
                "count_statuses": list(concurrency.count_statuses),
            }
        spec = cls(**options)
        validate_text(spec.key, "a schedule key", text_lengths().schedule_key)
        validate_timing(spec.cron, spec.timezone, spec.interval)
        json_copy(spec.input, f"the input of schedule {spec.key!r}")
        if spec.concurrency is not None:
            quotas.for_start(spec.concurrency)
        return spec


def schedule_quota(
    key: str, limit: int | None, statuses: list[str] | None
) -> quotas.Concurrency | None:
    """A schedule's own quota as a per-start one, or ``None`` when it has none."""
    if not key:
        return None
    if limit is None:
        raise ValueError("a schedule's concurrency key needs a limit")
    return quotas.for_start(
        {
            "key": key,
            "limit": limit,
            "count_statuses": statuses or quotas.DEFAULT_CONCURRENCY_STATUSES,
        }
    )


# windows ----------------------------------------------------------------------------


def _is_repeated(moment: datetime.datetime, tz: ZoneInfo) -> bool:
    """Whether ``moment`` is the second occurrence of a wall time (the fall-back hour)."""
    wall = moment.astimezone(tz).replace(tzinfo=None)
    first = wall.replace(tzinfo=tz, fold=0).utcoffset()
    second = wall.replace(tzinfo=tz, fold=1).utcoffset()
    return first != second and moment.utcoffset() == second


def _cron_moments(cron: str, tz: ZoneInfo, start: datetime.datetime, forward: bool):
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


# syncing declared schedules -----------------------------------------------------------


def sync_declared(engine: Engine) -> list[str]:
    """Create or update the rows of the schedules declared on workflows, by key.

    A row created or last saved from code follows its declaration. A row saved in the
    admin (or with ``source="admin"``) is left as it is: the declaration no longer
    overwrites it, and a warning names it. Returns the keys it left alone.
    """
    from .models import Schedule

    left_alone = []
    for definition in engine.registry.all():
        if definition is not engine.registry.latest(definition.name):
            continue
        for spec in definition.schedules:
            concurrency = dict(spec.concurrency or {})
            values = {
                "workflow": definition.name,
                "input": spec.input,
                "cron": spec.cron,
                "timezone": spec.timezone,
                "interval_seconds": spec.interval,
                "enabled": spec.enabled,
                "concurrency_key": concurrency.get("key", ""),
                "concurrency_limit": concurrency.get("limit"),
                "concurrency_statuses": list(concurrency.get("count_statuses") or []),
            }
            row = Schedule.objects.filter(key=spec.key).first()
            if row is None:
                row = Schedule(key=spec.key, source=Schedule.Source.CODE, **values)
                row.next_due_at = row.compute_next_due(timezone.now())
                row.save()
            elif row.source == Schedule.Source.CODE:
                changed = {k: v for k, v in values.items() if getattr(row, k) != v}
                if changed:
                    for name, value in changed.items():
                        setattr(row, name, value)
                    row.next_due_at = row.compute_next_due(timezone.now())
                    row.save()
            elif any(getattr(row, k) != v for k, v in values.items()):
                left_alone.append(spec.key)
                logger.warning(
                    "schedule %r was edited in the admin; its declaration on workflow %r "
                    "differs and is not applied (set source to 'code' to follow it again)",
                    spec.key,
                    definition.name,
                )
    return left_alone


# firing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Firing:
    """What happened to one due schedule at a tick."""

    key: str
    window: datetime.datetime
    run_id: str | None
    error: str = ""
    claimed: bool = True  # False: another ticker fired this window
    refusal: ConcurrencyLimitError | None = None


def fire(engine: Engine, schedule: Schedule, now: datetime.datetime) -> Firing:
    """Start the run of ``schedule``'s latest window due at ``now`` and record what
    happened on the row: ``last_fired_at``/``last_run_id`` and a cleared ``last_error``,
    or the error (an over-limit window is skipped). The window is claimed first with a
    conditional update, so one ticker fires it."""
    from .models import Schedule

    window = latest_window(schedule.cron, schedule.timezone, schedule.interval_seconds, now)
    next_due = schedule.compute_next_due(now)
    claimed = Schedule.objects.filter(pk=schedule.pk, next_due_at=schedule.next_due_at).update(
        next_due_at=next_due
    )
    if not claimed:
        return Firing(schedule.key, window, None, claimed=False)
    return _start_window(engine, schedule, window, window_run_id(schedule.key, window), now)


def fire_now(engine: Engine, schedule: Schedule, now: datetime.datetime | None = None) -> Firing:
    """Start a run of ``schedule`` now, outside its windows (``manage.py durable fire``),
    under its quota, recording the outcome on the row; its next due time is unchanged."""
    now = now or timezone.now()
    return _start_window(engine, schedule, now, f"sched:{schedule.key}:now:{now.isoformat()}", now)


def _start_window(
    engine: Engine,
    schedule: Schedule,
    window: datetime.datetime,
    run_id: str,
    now: datetime.datetime,
) -> Firing:
    from .models import Schedule

    try:
        concurrency = schedule_quota(
            schedule.concurrency_key, schedule.concurrency_limit, schedule.concurrency_statuses
        )
        handle = engine.start(schedule.workflow, schedule.input, run_id, concurrency=concurrency)
    except ConcurrencyLimitError as error:
        message = (
            f"window {window.isoformat()} skipped: concurrency key {error.key!r} has "
            f"{error.active} active run(s), limit is {error.limit}"
        )
        Schedule.objects.filter(pk=schedule.pk).update(last_error=message)
        return Firing(schedule.key, window, None, message, refusal=error)
    except (DurableError, TypeError, ValueError, LookupError) as error:
        message = f"window {window.isoformat()} not started: {error}"
        Schedule.objects.filter(pk=schedule.pk).update(last_error=message)
        return Firing(schedule.key, window, None, message)
    Schedule.objects.filter(pk=schedule.pk).update(
        last_fired_at=now, last_run_id=handle.run_id, last_error=""
    )
    return Firing(schedule.key, window, handle.run_id)


def fire_due(engine: Engine, now: datetime.datetime) -> list[Firing]:
    """Fire every enabled schedule whose next window is due at ``now``."""
    from .models import Schedule

    return [fire(engine, schedule, now) for schedule in Schedule.objects.due(now)]
