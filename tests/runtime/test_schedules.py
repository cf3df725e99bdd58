"""Persisted schedules: validation, windows (DST included), firing under their quotas."""

from __future__ import annotations

import dataclasses
import datetime
import threading
from contextlib import nullcontext
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from durable_django import Engine, RunStatus
from durable_django._runtime.schedules import (
    ScheduleSpec,
    latest_window,
    next_window,
    window_run_id,
)
from durable_django.models import Schedule

from ..helpers import force_status
from ..ticker_process import declare, tick_in_process

UTC = datetime.UTC
PARIS = ZoneInfo("Europe/Paris")


def at(*args: int, tz: datetime.tzinfo = UTC) -> datetime.datetime:
    return datetime.datetime(*args, tzinfo=tz)


def schedule(**fields) -> Schedule:
    values = {"key": "nightly", "workflow": "wf", "interval_seconds": 60, "input": {"n": 1}}
    values.update(fields)
    return Schedule.objects.create(**values)


def due(row: Schedule, when: datetime.datetime) -> None:
    Schedule.objects.filter(pk=row.pk).update(next_due_at=when)


# validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"cron": "61 * * * *", "interval_seconds": None}, "cron", "invalid cron expression"),
        ({"cron": "* * * *", "interval_seconds": None}, "cron", "invalid cron"),
        (
            {"cron": "0 3 * * *", "interval_seconds": None, "timezone": "Mars/Olympus"},
            "timezone",
            "unknown timezone",
        ),
        ({"cron": "0 3 * * *"}, "__all__", "exactly one"),
        ({"interval_seconds": None}, "__all__", "exactly one"),
        ({"workflow": "no.such"}, "workflow", "no workflow registered"),
        ({"concurrency_key": "k"}, "concurrency_key", "needs a limit"),
        (
            {"concurrency_key": "k", "concurrency_limit": 1, "concurrency_statuses": ["done"]},
            "concurrency_key",
            "unknown status",
        ),
        # What could never fire, or what its columns could not hold, on every database.
        ({"cron": "0 0 30 2 *", "interval_seconds": None}, "cron", "never fires"),
        ({"cron": "0 0 31 4 *", "interval_seconds": None}, "cron", "never fires"),
        ({"interval_seconds": 2.5}, "interval_seconds", "whole number, not 2.5"),
        ({"interval_seconds": True}, "interval_seconds", "whole number, not True"),
        ({"interval_seconds": "60"}, "interval_seconds", "whole number, not '60'"),
        ({"interval_seconds": 2**31}, "interval_seconds", "between 0 and 2147483647"),
        (
            {"concurrency_key": "k" * 201, "concurrency_limit": 1},
            "concurrency_key",
            "201 characters long; its column holds 200",
        ),
        (
            {"concurrency_key": "k", "concurrency_limit": 2**31},
            "concurrency_limit",
            "between -2147483648 and 2147483647",
        ),
        ({"input": {"text": "a\x00b"}}, "input", "NUL character"),
        ({"input": {"a\x00": 1}}, "input", "NUL character"),
        ({"key": "nightly\x00"}, "key", "NUL character"),
    ],
)
def test_a_schedule_that_could_not_fire_is_refused_when_saved(db, fields, field, message):
    row = Schedule(key="s", workflow="tests.plain", interval_seconds=60)
    for name, value in fields.items():
        setattr(row, name, value)
    with pytest.raises(ValidationError) as refused:
        row.full_clean()
    assert message in " ".join(refused.value.message_dict[field])


def test_a_valid_schedule_passes(db):
    Schedule(
        key="s", workflow="tests.plain", cron="0 3 * * *", timezone="Europe/Paris"
    ).full_clean()
    # Every four years (eight across 2100) is rare, not never.
    Schedule(key="s", workflow="tests.plain", cron="0 0 29 2 *").full_clean()
    Schedule(key="s", workflow="tests.plain", interval_seconds=2**31 - 1).full_clean()


@pytest.mark.parametrize(
    "fields",
    [
        {"cron": "0 3 * * *", "interval_seconds": 60},
        {"cron": "", "interval_seconds": None, "next_due_at": at(2026, 1, 1)},
        {"concurrency_key": "k", "concurrency_limit": None},
    ],
)
def test_the_database_refuses_impossible_timings_and_quotas(db, fields):
    with pytest.raises(IntegrityError), transaction.atomic():
        schedule(**fields)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"key": "k"}, "exactly one"),
        ({"key": "k", "cron": "nope"}, "invalid cron"),
        ({"key": "", "interval": 5}, "schedule key"),
        ({"key": "k", "interval": 5, "every": 3}, "unknown schedule option"),
        ({"key": "k", "interval": 5, "input": {1, 2}}, "JSON-serialisable"),
        ({"key": "k", "interval": 5, "concurrency": {"key": "x", "limit": "2"}}, "int"),
        ({"key": "k", "cron": "0 0 30 2 *"}, "never fires"),
        ({"key": "k", "interval": 2.5}, "whole number of seconds, not 2.5"),
        ({"key": "k", "interval": True}, "whole number of seconds, not True"),
        ({"key": "k", "interval": datetime.timedelta(seconds=2.5)}, "whole number of seconds"),
        ({"key": "k", "interval": 2**31}, "between 0 and 2147483647"),
        (
            {"key": "k", "interval": 5, "concurrency": {"key": "x" * 201, "limit": 1}},
            "schedule 'k': concurrency key is 201 characters long; its column holds 200",
        ),
        ({"key": "k", "interval": 5, "input": {"text": "\x00"}}, "NUL character"),
    ],
)
def test_bad_declared_schedules_are_refused_at_declaration(registry, spec, message):
    engine = Engine(registry=registry, enqueue=False)
    with pytest.raises((TypeError, ValueError), match=message):
        engine.register("wf", "1", lambda ctx, i: None, schedule=spec)
    assert registry.all() == []


# windows ------------------------------------------------------------------------------


def test_interval_windows_are_aligned_on_the_epoch():
    assert latest_window("", "UTC", 60, at(2026, 1, 1, 10, 0, 59)) == at(2026, 1, 1, 10, 0)
    assert next_window("", "UTC", 60, at(2026, 1, 1, 10, 0)) == at(2026, 1, 1, 10, 1)
    assert next_window("", "UTC", 3600, at(2026, 1, 1, 10, 30)) == at(2026, 1, 1, 11, 0)


def test_cron_windows_are_read_in_the_schedules_timezone():
    # 03:00 in Paris is 02:00 UTC in winter.
    assert next_window("0 3 * * *", "Europe/Paris", None, at(2026, 1, 10)) == at(2026, 1, 10, 2)
    assert latest_window("0 3 * * *", "Europe/Paris", None, at(2026, 1, 10, 2)) == at(
        2026, 1, 10, 2
    )


def windows(cron: str, start: datetime.datetime, count: int) -> list[datetime.datetime]:
    found, moment = [], start
    for _ in range(count):
        moment = next_window(cron, "Europe/Paris", None, moment)
        found.append(moment.astimezone(PARIS))
    return found


def test_a_daily_time_skipped_by_spring_forward_fires_once_after_the_gap():
    days = windows("30 2 * * *", at(2026, 3, 28, 12, tz=PARIS), 3)
    assert [d.isoformat() for d in days] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_a_daily_time_repeated_by_fall_back_fires_once():
    days = windows("30 2 * * *", at(2026, 10, 24, 12, tz=PARIS), 2)
    assert [d.isoformat() for d in days] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]


def test_an_hourly_schedule_fires_on_every_real_hour_through_fall_back():
    hours = windows("0 * * * *", at(2026, 10, 25, 0, 30, tz=PARIS), 4)
    utc = [h.astimezone(UTC).hour for h in hours]
    assert utc == [23, 0, 1, 2]  # 01:00+2, 02:00+2, 02:00+1, 03:00+1: one real hour apart


# firing -------------------------------------------------------------------------------


@pytest.fixture
def orm(orm_engine: Engine) -> Engine:
    orm_engine.register("wf", "1", lambda ctx, i: i)
    return orm_engine


def test_a_due_window_fires_once_with_a_deterministic_run_id(orm: Engine):
    row = schedule()
    now = at(2026, 5, 1, 12, 0, 30)
    due(row, at(2026, 5, 1, 12, 0))
    assert orm.tick(now=now).fired == 1
    run_id = window_run_id("nightly", at(2026, 5, 1, 12, 0))
    assert run_id == "sched:nightly:2026-05-01T12:00:00+00:00"
    assert orm.get_run(run_id).input == {"n": 1}
    row.refresh_from_db()
    assert (row.last_run_id, row.last_fired_at, row.last_error) == (run_id, now, "")
    assert row.next_due_at == at(2026, 5, 1, 12, 1)
    assert orm.tick(now=now).fired == 0  # nothing due until the next window


def test_after_downtime_only_the_latest_window_fires(orm: Engine):
    row = schedule()
    due(row, at(2026, 5, 1, 12, 0))
    assert orm.tick(now=at(2026, 5, 1, 15, 42, 10)).fired == 1
    assert [r.run_id for r in orm.list_runs()] == ["sched:nightly:2026-05-01T15:42:00+00:00"]


def test_an_over_limit_window_is_skipped_then_cleared_by_the_next(orm: Engine):
    row = schedule(concurrency_key="reports", concurrency_limit=1)
    due(row, at(2026, 5, 1, 12, 0))
    assert orm.tick(now=at(2026, 5, 1, 12, 0)).fired == 1
    first = orm.list_runs()[0]
    assert first.tags == ["concurrency:reports"]
    # The first run is still active: the next window is over the schedule's own limit.
    result = orm.tick(now=at(2026, 5, 1, 12, 1))
    assert (result.fired, result.skipped_windows) == (0, 1)
    row.refresh_from_db()
    assert row.last_error == (
        "window 2026-05-01T12:01:00+00:00 skipped: concurrency key 'reports' has "
        "1 active run(s), limit is 1"
    )
    assert len(orm.list_runs()) == 1 and row.next_due_at == at(2026, 5, 1, 12, 2)
    force_status(orm, first.run_id, RunStatus.COMPLETED)
    assert orm.tick(now=at(2026, 5, 1, 12, 2)).fired == 1
    row.refresh_from_db()
    assert row.last_error == "" and row.last_run_id.endswith("12:02:00+00:00")


def test_a_schedule_of_an_unknown_workflow_records_the_error(orm: Engine):
    row = schedule(workflow="gone")
    due(row, at(2026, 5, 1, 12, 0))
    assert orm.tick(now=at(2026, 5, 1, 12, 0)).skipped_windows == 1
    row.refresh_from_db()
    assert "no workflow registered under the name 'gone'" in row.last_error


def test_disabled_schedules_do_not_fire(orm: Engine):
    row = schedule(enabled=False)
    due(row, at(2026, 5, 1, 12, 0))
    assert orm.tick(now=at(2026, 5, 1, 13)).fired == 0


def test_declared_schedules_are_synced_by_key(orm: Engine):
    orm.register(
        "declared",
        "1",
        lambda ctx, i: i,
        schedule={"key": "hourly", "cron": "0 * * * *", "input": [1]},
    )
    orm.tick()
    row = Schedule.objects.get(key="hourly")
    assert (row.workflow, row.cron, row.input, row.source) == ("declared", "0 * * * *", [1], "code")
    assert row.next_due_at is not None
    # Edited in the admin: the declaration no longer overwrites it.
    Schedule.objects.filter(pk=row.pk).update(cron="30 * * * *", source="admin")
    from durable_django._runtime.schedules import sync_declared

    assert sync_declared(orm) == ["hourly"]
    assert Schedule.objects.get(key="hourly").cron == "30 * * * *"


def test_a_spec_object_works_like_a_dict(registry):
    spec = ScheduleSpec(key="k", interval=datetime.timedelta(minutes=5).seconds)
    engine = Engine(registry=registry, enqueue=False)
    assert engine.register("wf", "1", lambda ctx, i: None, schedule=[spec]).schedules == (spec,)


@pytest.mark.django_db(transaction=True)
def test_tickers_racing_on_one_window_start_one_run(registry):
    from durable_django.stores import OrmStore

    engines = [Engine(store=OrmStore(), registry=registry, enqueue=False) for _ in range(8)]
    engines[0].register("wf", "1", lambda ctx, i: i)
    for trial in range(5):
        row = schedule(key=f"race-{trial}")
        due(row, at(2026, 5, 1, 12, 0))
        barrier = threading.Barrier(len(engines))
        fired = []

        def tick(engine: Engine, barrier: threading.Barrier, fired: list[int]) -> None:
            try:
                barrier.wait()
                fired.append(engine.tick(now=at(2026, 5, 1, 12, 0, 5)).fired)
            finally:
                connection.close()

        threads = [threading.Thread(target=tick, args=(e, barrier, fired)) for e in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(fired) == 1
        assert len(engines[0].list_runs(workflow="wf")) == trial + 1


def test_put_creates_or_updates_a_validated_schedule(db):
    row = Schedule.objects.put(
        "reports", workflow="tests.plain", cron="0 3 * * *", timezone="Europe/Paris"
    )
    assert row.next_due_at is not None and row.source == "admin"
    again = Schedule.objects.put("reports", cron="0 4 * * *")
    assert again.pk == row.pk and again.cron == "0 4 * * *"
    with pytest.raises(ValidationError):
        Schedule.objects.put("reports", cron="0 4 * *")
    assert Schedule.objects.get(key="reports").cron == "0 4 * * *"
    # Refused, not rounded.
    for interval in (2.5, True):
        with pytest.raises(ValidationError, match="whole number"):
            Schedule.objects.put("reports", cron="", interval_seconds=interval)
    assert Schedule.objects.get(key="reports").interval_seconds is None
    assert list(Schedule.objects.enabled()) == [again]


def test_a_schedule_key_is_declared_by_one_workflow(registry):
    engine = Engine(registry=registry, enqueue=False)
    engine.register("a", "1", lambda ctx, i: None, schedule={"key": "k", "interval": 60})
    with pytest.raises(ValueError, match="already declared by workflow 'a'"):
        engine.register("b", "1", lambda ctx, i: None, schedule={"key": "k", "interval": 60})


def test_a_spec_takes_a_timedelta_and_a_concurrency_object(registry):
    from durable_django import Concurrency

    spec = ScheduleSpec.build(
        ScheduleSpec(
            key="k",
            interval=datetime.timedelta(minutes=5),
            concurrency=Concurrency(key="reports", limit=2),
        )
    )
    assert spec.interval == 300
    assert spec.concurrency == {
        "key": "reports",
        "limit": 2,
        "count_statuses": list(Concurrency(key="x", limit=1).count_statuses),
    }


def test_a_disabled_declared_schedule_stays_disabled(orm: Engine, admin_client):
    from django.urls import reverse

    orm.register("declared", "1", lambda ctx, i: i, schedule={"key": "d", "interval": 60})
    orm.tick()
    row = Schedule.objects.get(key="d")
    admin_client.post(
        reverse("admin:durable_django_schedule_changelist"),
        {"action": "disable", "_selected_action": [row.pk]},
    )
    orm.tick()
    row.refresh_from_db()
    assert (row.enabled, row.source) == (False, "admin")


# concurrent tickers, and one bad schedule among good ones -------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_tickers_creating_declared_schedules_at_once_never_raise(registry, caplog):
    from durable_django.stores import OrmStore

    engines = [Engine(store=OrmStore(), registry=registry, enqueue=False) for _ in range(24)]
    keys = [f"declared-{n}" for n in range(3)]
    declare(engines[0], keys)
    for _trial in range(3):
        Schedule.objects.all().delete()  # every ticker finds no row and creates it
        barrier = threading.Barrier(len(engines))
        errors: list[BaseException] = []

        def tick(engine: Engine, barrier: threading.Barrier, errors: list) -> None:
            try:
                barrier.wait()
                engine.tick()
            except BaseException as error:
                errors.append(error)
            finally:
                connection.close()

        threads = [threading.Thread(target=tick, args=(e, barrier, errors)) for e in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert "not applied" not in caplog.text  # nor a deadlock, nor a duplicate key
        assert sorted(Schedule.objects.values_list("key", "source")) == [(k, "code") for k in keys]


def written_past_validation(key: str, **fields) -> Schedule:
    """A row written with the ORM, which validates nothing, due at 12:00."""
    return schedule(key=key, next_due_at=at(2026, 5, 1, 12, 0), **fields)


def test_a_schedule_whose_timing_cannot_be_computed_is_parked_and_the_others_fire(
    orm: Engine, caplog
):
    good = written_past_validation("good")
    bad = [
        written_past_validation("never", cron="0 0 30 2 *", interval_seconds=None),
        written_past_validation("garbled", cron="at noon", interval_seconds=None),
        written_past_validation("mars", cron="0 3 * * *", interval_seconds=None, timezone="Mars"),
    ]
    result = orm.tick(now=at(2026, 5, 1, 12, 0, 30))
    assert (result.fired, result.skipped_windows) == (1, 3)
    good.refresh_from_db()
    assert good.last_run_id == "sched:good:2026-05-01T12:00:00+00:00"
    for row in bad:
        row.refresh_from_db()
        assert row.last_error.startswith("not fired: its timing cannot be computed (")
        assert row.last_error.endswith("); correct it in the admin to schedule it again")
        assert row.next_due_at is None and row.last_run_id == ""
        assert f"schedule {row.key!r}: not fired" in caplog.text
    # Parked: the next ticks pass them by, and the good one goes on firing.
    result = orm.tick(now=at(2026, 5, 1, 12, 1, 30))
    assert (result.fired, result.skipped_windows) == (1, 0)
    # Saved again with a timing that works, a parked schedule is due again.
    row = Schedule.objects.get(key="never")
    row.cron = "0 0 28 2 *"
    row.save()
    assert (row.next_due_at.month, row.next_due_at.day) == (2, 28)


@pytest.fixture
def orm_tx(registry) -> Engine:
    from durable_django.stores import OrmStore

    engine = Engine(store=OrmStore(), registry=registry, enqueue=False)
    engine.register("wf", "1", lambda ctx, i: i)
    engine.register("refused", "1", lambda ctx, i: i)
    return engine


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_a_transaction", [False, True])
def test_a_window_the_database_refuses_is_skipped_and_the_others_fire(
    orm_tx: Engine, caplog, in_a_transaction: bool
):
    from ..database_refusal import MESSAGE, runs_refused

    refused = written_past_validation("a-refused", workflow="refused")
    good = written_past_validation("b-good")
    with runs_refused("refused"), transaction.atomic() if in_a_transaction else nullcontext():
        result = orm_tx.tick(now=at(2026, 5, 1, 12, 0, 30))
    assert (result.fired, result.skipped_windows) == (1, 1)
    refused.refresh_from_db()
    assert refused.last_error.startswith("window 2026-05-01T12:00:00+00:00 not started: ")
    assert MESSAGE in refused.last_error
    assert "schedule 'a-refused': window 2026-05-01T12:00:00+00:00 not started" in caplog.text
    good.refresh_from_db()
    assert orm_tx.get_run(good.last_run_id).workflow == "wf"
    assert [r.workflow for r in orm_tx.list_runs()] == ["wf"]


@pytest.mark.django_db(transaction=True)
def test_a_declaration_the_database_refuses_is_skipped_and_the_others_sync(orm_tx: Engine, caplog):
    """Declarations built past their validation (``ScheduleSpec`` without ``build``): what
    the database refuses is logged, recorded on the row when there is one, and skipped."""
    from durable_django._rules.registry import make_definition

    orm_tx.register(
        "declared", "1", lambda ctx, i: i, schedule={"key": "c-updated", "interval": 60}
    )
    orm_tx.tick()
    bad = {
        "a-long-quota-key": ScheduleSpec(
            key="a-long-quota-key", interval=60, concurrency={"key": "k" * 220, "limit": 1}
        ),
        "b-nul": ScheduleSpec(key="b-nul", interval=60, input={"text": "a\x00b"}),
        "d-huge-interval": ScheduleSpec(key="d-huge-interval", interval=2**32),
        "c-updated": ScheduleSpec(
            key="c-updated", interval=60, concurrency={"key": "k" * 220, "limit": 1}
        ),
    }
    orm_tx.registry.remove("declared")
    orm_tx.registry.add(
        dataclasses.replace(
            make_definition("declared", "2", lambda ctx, i: i), schedules=tuple(bad.values())
        )
    )
    orm_tx.register("fine", "1", lambda ctx, i: i, schedule={"key": "e-fine", "interval": 60})

    orm_tx.tick()  # raises nothing

    assert Schedule.objects.get(key="e-fine").source == "code"
    refused_by = {
        "sqlite": set(),  # SQLite holds them all
        "postgresql": set(bad),
        "mysql": {"a-long-quota-key", "c-updated", "d-huge-interval"},
    }[connection.vendor]
    rows = set(Schedule.objects.values_list("key", flat=True))
    for key in bad:
        refused = key in refused_by
        assert (key in rows) == (not refused or key == "c-updated"), key
        logged = f"schedule {key!r}: declaration on workflow 'declared' not applied: "
        assert (logged in caplog.text) == refused, key
    updated = Schedule.objects.get(key="c-updated")
    if "c-updated" in refused_by:
        # The row keeps what the database holds, and says why it does not follow its code.
        assert updated.concurrency_key == ""
        assert updated.last_error.startswith("declaration on workflow 'declared' not applied: ")
    else:
        assert updated.concurrency_key == "k" * 220


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_ticker_processes_creating_declared_schedules_at_once_never_raise():
    import multiprocessing

    keys = [f"declared-{n}" for n in range(3)]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(6), context.Queue()
    db_name = str(connection.settings_dict["NAME"])
    processes = [
        context.Process(target=tick_in_process, args=(db_name, keys, barrier, results))
        for _ in range(6)
    ]
    for process in processes:
        process.start()
    reports = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    assert reports == [""] * len(processes), "\n".join(reports)
    assert sorted(Schedule.objects.values_list("key", "source")) == [(k, "code") for k in keys]
