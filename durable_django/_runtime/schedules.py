"""Persisted schedules: syncing the declared ones to their rows, and firing the due
windows under their quotas, through the start path.

When a schedule fires is pure arithmetic, in :mod:`durable_django._rules.windows` (its names
are importable from here too). Each schedule is synced, computed and fired on its own:
one whose declaration the database refuses, whose row holds a timing that cannot be
computed, or whose window fails to start records why in its ``last_error``, is logged,
and is skipped; the others fire.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from .._core.limits import MAX_ERROR_MESSAGE
from .._core.serialization import storable_text
from .._rules.windows import (
    CRON_HORIZON_YEARS,
    EPOCH,
    ScheduleSpec,
    latest_window,
    next_window,
    schedule_quota,
    validate_timing,
    window_run_id,
    zone,
)
from ..db import connection_lost
from ..errors import ConcurrencyLimitError, DurableError, RateLimitError
from ..models import Schedule, column_errors
from . import starting

if TYPE_CHECKING:
    from .._core.runtime import Runtime

__all__ = [
    "CRON_HORIZON_YEARS",
    "EPOCH",
    "Firing",
    "ScheduleSpec",
    "belongs_to_one_schedule",
    "column_errors",
    "fire",
    "fire_due",
    "fire_now",
    "latest_window",
    "next_window",
    "own_quotas",
    "schedule_quota",
    "sync_declared",
    "validate_timing",
    "window_run_id",
    "zone",
]

logger = logging.getLogger("durable_django.schedules")


# syncing declared schedules -----------------------------------------------------------


def sync_declared(engine: Runtime) -> list[str]:
    """Create or update the rows of the schedules declared on workflows, by key.

    A row created or last saved from code follows its declaration. A row saved in the
    admin (or with ``source="admin"``) is left as it is: the declaration no longer
    overwrites it, and a warning names it. Returns the keys it left alone.

    Each schedule is synced in a transaction of its own, and a missing row is created by
    an upsert, so tickers syncing at once never collide. One the database refuses is
    logged (and recorded as its row's ``last_error``, when it has one) and skipped.
    """
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


def own_quotas() -> dict[str, tuple[str, int | None]]:
    """``{schedule key: (quota key, limit)}`` of the schedule rows with a quota of their
    own."""
    rows = Schedule.objects.exclude(concurrency_key="").values_list(
        "key", "concurrency_key", "concurrency_limit"
    )
    return {key: (quota_key, limit) for key, quota_key, limit in rows}


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


def fire(engine: Runtime, schedule: Schedule, now: datetime.datetime) -> Firing:
    """Start the run of ``schedule``'s latest window due at ``now`` and record what
    happened on the row: ``last_fired_at``/``last_run_id`` and a cleared ``last_error``,
    or the error (an over-limit window is skipped). The window is claimed first with a
    conditional update, so one ticker fires it."""
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


def fire_now(engine: Runtime, schedule: Schedule, now: datetime.datetime | None = None) -> Firing:
    """Start a run of ``schedule`` now, outside its windows (``manage.py durable fire``),
    under its quota, recording the outcome on the row; its next due time is unchanged."""
    now = now or timezone.now()
    return _start_window(engine, schedule, now, f"sched:{schedule.key}:now:{now.isoformat()}", now)


def _start_window(
    engine: Runtime,
    schedule: Schedule,
    window: datetime.datetime,
    run_id: str,
    now: datetime.datetime,
) -> Firing:
    try:
        concurrency = schedule_quota(
            schedule.concurrency_key, schedule.concurrency_limit, schedule.concurrency_statuses
        )
        # A savepoint: a start the database refuses undoes this start only.
        with engine.store.atomic():
            options = starting.StartOptions(concurrency=concurrency)
            handle = starting.start(engine, schedule.workflow, schedule.input, run_id, options)
    except ConcurrencyLimitError as error:
        message = (
            f"window {window.isoformat()} skipped: rate limit key {error.key!r} has "
            f"{error.active} unit(s) started in the last {error.per:g} s, limit is "
            f"{error.limit}"
            if isinstance(error, RateLimitError)
            else f"window {window.isoformat()} skipped: concurrency key {error.key!r} has "
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


def fire_due(engine: Runtime, now: datetime.datetime) -> list[Firing]:
    """Fire every enabled schedule whose next window is due at ``now``, each on its own."""
    return [fire(engine, schedule, now) for schedule in Schedule.objects.due(now)]
