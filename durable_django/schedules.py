"""Persisted schedules: when each fires, and firing the due windows under their quotas.

A schedule starts one run of its workflow per window: every ``interval_seconds``
(windows aligned on multiples of the interval since the epoch), or at each time of a cron
expression read in an IANA timezone. Each window has a deterministic run id,
``sched:<key>:<window>``, so the idempotent start makes a window fire at most once however
many tickers race. After downtime only the latest missed window fires.

Each schedule is synced, computed and fired on its own: one whose declaration the
database refuses, whose row holds a timing that cannot be computed, or whose window fails
to start records why in its ``last_error``, is logged, and is skipped; the others fire.

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

from croniter import CroniterBadDateError, croniter
from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.operations import BaseDatabaseOperations
from django.utils import timezone

from . import concurrency as quotas
from .db import connection_lost
from .errors import ConcurrencyLimitError, DurableError, UnstorableValueError
from .limits import MAX_ERROR_MESSAGE, text_lengths
from .serialization import json_copy, storable_text, text_problem, validate_text

if TYPE_CHECKING:
    from .engines import Engine
    from .models import Schedule

logger = logging.getLogger("durable_django.schedules")

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


def column_errors(fields: Mapping[str, Any]) -> dict[str, str]:
    """What the schedule table's columns would refuse among ``fields`` (``{name: value}``),
    by field name: text longer than its column or holding a NUL character, JSON holding a
    NUL character, a number that is not an int or is past its column's range. The limits
    are read from the model's fields, and the ranges are the same on every database."""
    from .models import Schedule

    errors = {}
    for name, value in fields.items():
        column = Schedule._meta.get_field(name)
        label = column.verbose_name
        kind = column.get_internal_type()
        if value is None:
            continue
        if kind in BaseDatabaseOperations.integer_field_ranges:
            low, high = BaseDatabaseOperations.integer_field_ranges[kind]
            if isinstance(value, bool) or not isinstance(value, int):
                errors[name] = f"{label} must be a whole number, not {value!r}"
            elif not low <= value <= high:
                errors[name] = f"{label} must be between {low} and {high}, not {value}"
        elif isinstance(value, str) and column.max_length and len(value) > column.max_length:
            errors[name] = (
                f"{label} is {len(value)} characters long; its column holds {column.max_length}"
            )
        elif isinstance(value, str) and (problem := text_problem(value)):
            errors[name] = f"{label} cannot be stored: {problem}"
        elif kind == "JSONField":
            try:
                json_copy(value, str(label))
            except UnstorableValueError as error:
                errors[name] = str(error)
    return errors


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
            }
        spec = cls(**options)
        validate_text(spec.key, "a schedule key", text_lengths().schedule_key)
        validate_timing(spec.cron, spec.timezone, spec.interval)
        json_copy(spec.input, f"the input of schedule {spec.key!r}")
        if spec.concurrency is not None:
            quotas.for_start(spec.concurrency)
        if apps.models_ready:  # else the tick's sync meets what the database refuses
            for error in column_errors({"key": spec.key, **spec.row_fields()}).values():
                raise ValueError(f"schedule {spec.key!r}: {error}")
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

    Each schedule is synced in a transaction of its own, and a missing row is created by
    an upsert, so tickers syncing at once never collide. One the database refuses is
    logged (and recorded as its row's ``last_error``, when it has one) and skipped.
    """
    from .models import Schedule

    declared = [
        (definition, spec)
        for definition in engine.registry.all()
        if definition is engine.registry.latest(definition.name)
        for spec in definition.schedules
    ]
    rows = {row.key: row for row in Schedule.objects.filter(key__in=[s.key for _, s in declared])}
    left_alone = []
    for definition, spec in declared:
        try:
            with transaction.atomic():
                if not _sync_one(definition.name, spec, rows.get(spec.key)):
                    left_alone.append(spec.key)
        except Exception as error:
            if not belongs_to_one_schedule(error, Schedule.objects.db):
                raise
            message = f"declaration on workflow {definition.name!r} not applied: {error}"
            logger.error("schedule %r: %s", spec.key, message)
            Schedule.objects.filter(key=spec.key).update(last_error=_storable(message))
    return left_alone


def _sync_one(workflow: str, spec: ScheduleSpec, row: Schedule | None) -> bool:
    """Write one declared schedule to its row; False when an admin edit keeps it as is."""
    from .models import Schedule

    values = {"workflow": workflow, **spec.row_fields()}
    if row is None:
        # An upsert that changes nothing when another ticker (or an admin) made the row.
        features = connections[Schedule.objects.db].features
        Schedule.objects.bulk_create(
            [
                Schedule(
                    key=spec.key,
                    source=Schedule.Source.CODE,
                    next_due_at=_next_due(values, timezone.now()),
                    **values,
                )
            ],
            update_conflicts=True,
            update_fields=["key"],
            unique_fields=["key"] if features.supports_update_conflicts_with_target else None,
        )
        return True
    changed = {name: value for name, value in values.items() if getattr(row, name) != value}
    if not changed:
        return True
    if row.source == Schedule.Source.CODE:
        # Unless an admin edit came meanwhile.
        Schedule.objects.filter(pk=row.pk, source=Schedule.Source.CODE).update(
            **changed, next_due_at=_next_due(values, timezone.now())
        )
        return True
    logger.warning(
        "schedule %r was edited in the admin; its declaration on workflow %r "
        "differs and is not applied (set source to 'code' to follow it again)",
        spec.key,
        workflow,
    )
    return False


def _next_due(values: Mapping[str, Any], now: datetime.datetime) -> datetime.datetime | None:
    if not values["enabled"]:
        return None
    return next_window(values["cron"], values["timezone"], values["interval_seconds"], now)


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

    try:
        window = latest_window(schedule.cron, schedule.timezone, schedule.interval_seconds, now)
        next_due = schedule.compute_next_due(now)
    except Exception as error:  # a timing written past the validation
        return _park(schedule, now, error)
    claimed = Schedule.objects.filter(pk=schedule.pk, next_due_at=schedule.next_due_at).update(
        next_due_at=next_due
    )
    if not claimed:
        return Firing(schedule.key, window, None, claimed=False)
    return _start_window(engine, schedule, window, window_run_id(schedule.key, window), now)


def _storable(message: str) -> str:
    """An error message as ``last_error`` holds it on every database (an error may quote
    the very value the database refused)."""
    return storable_text(message, MAX_ERROR_MESSAGE)


def _park(schedule: Schedule, now: datetime.datetime, error: Exception) -> Firing:
    """Take a schedule whose timing cannot be computed off the due list (``next_due_at``
    empty, until a save of the row computes it again), recording why."""
    from .models import Schedule

    message = (
        f"not fired: its timing cannot be computed ({type(error).__name__}: {error}); "
        f"correct it in the admin to schedule it again"
    )
    parked = Schedule.objects.filter(pk=schedule.pk, next_due_at=schedule.next_due_at).update(
        next_due_at=None, last_error=_storable(message)
    )
    if parked:
        logger.error("schedule %r: %s", schedule.key, message)
    return Firing(schedule.key, now, None, message, claimed=bool(parked))


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
        # A savepoint: a start the database refuses undoes this start only.
        with engine.store.atomic():
            handle = engine.start(
                schedule.workflow, schedule.input, run_id, concurrency=concurrency
            )
    except ConcurrencyLimitError as error:
        message = (
            f"window {window.isoformat()} skipped: concurrency key {error.key!r} has "
            f"{error.active} active run(s), limit is {error.limit}"
        )
        Schedule.objects.filter(pk=schedule.pk).update(last_error=_storable(message))
        return Firing(schedule.key, window, None, message, refusal=error)
    except Exception as error:
        if not belongs_to_one_schedule(error, engine.store.using or DEFAULT_DB_ALIAS):
            raise
        message = f"window {window.isoformat()} not started: {error}"
        if not isinstance(error, DurableError | TypeError | ValueError | LookupError):
            logger.error("schedule %r: %s", schedule.key, message, exc_info=error)
        Schedule.objects.filter(pk=schedule.pk).update(last_error=_storable(message))
        return Firing(schedule.key, window, None, message)
    Schedule.objects.filter(pk=schedule.pk).update(
        last_fired_at=now, last_run_id=handle.run_id, last_error=""
    )
    return Firing(schedule.key, window, handle.run_id)


def belongs_to_one_schedule(error: Exception, using: str) -> bool:
    """Whether ``error`` is one schedule's own (its values refused by the database, its
    workflow unknown, its code raising), so the others still go on; not when the
    connection to the database ``using`` is lost, which is everyone's."""
    return not connection_lost(error, using)


def fire_due(engine: Engine, now: datetime.datetime) -> list[Firing]:
    """Fire every enabled schedule whose next window is due at ``now``, each on its own."""
    from .models import Schedule

    return [fire(engine, schedule, now) for schedule in Schedule.objects.due(now)]
