"""Purging finished runs and taken signals: ``engine.purge`` and ``manage.py durable purge``."""

from __future__ import annotations

import datetime
import threading

import pytest
from django.core.management import CommandError
from django.db import connection, connections, transaction
from django.utils import timezone

from durable_django import Concurrency, Engine, RunNotFound, RunStatus
from durable_django import engine as default_engine
from durable_django.models import Run, RunTag, Signal, Step
from durable_django.registry import Registry
from durable_django.retention import PurgeResult
from durable_django.stores import MemoryStore, OrmStore
from durable_django.testing import run_until_idle

from .conftest import force_status
from .test_cli import durable, durable_json

DAYS_AGO_40 = datetime.timedelta(days=40)


def one_step(ctx, input):
    return ctx.step("echo", lambda: input)


def finished(engine: Engine, status: str, ago: datetime.timedelta, **start) -> str:
    """A run of ``wf`` executed (one recorded step), then put in ``status`` as if it had
    ended ``ago``."""
    run_id = engine.start("wf", {"n": 1}, **start).run_id
    run_until_idle(engine)
    force_status(engine, run_id, status, finished_at=timezone.now() - ago)
    return run_id


@pytest.fixture
def wf_engine(engine: Engine) -> Engine:
    engine.register("wf", "1", one_step, concurrency=Concurrency(key=lambda input: "k", limit=100))
    return engine


def gone(engine: Engine, run_id: str) -> bool:
    try:
        engine.get_run(run_id)
    except RunNotFound:
        return True
    return False


def test_purge_deletes_runs_finished_before_the_cutoff_with_their_steps(wf_engine: Engine):
    old_completed = finished(wf_engine, RunStatus.COMPLETED, DAYS_AGO_40)
    old_failed = finished(wf_engine, RunStatus.FAILED, DAYS_AGO_40)
    old_cancelled = finished(wf_engine, RunStatus.CANCELLED, DAYS_AGO_40)
    recent = finished(wf_engine, RunStatus.COMPLETED, datetime.timedelta(days=1))
    active = wf_engine.start("wf", {"n": 2}).run_id

    result = wf_engine.purge(datetime.timedelta(days=30))

    assert result == PurgeResult(runs=3, signals=0)
    for run_id in (old_completed, old_failed, old_cancelled):
        assert gone(wf_engine, run_id)
        assert wf_engine.store.get_steps(run_id) == []
    assert wf_engine.get_run(recent).status == "completed"
    assert [s.name for s in wf_engine.store.get_steps(recent)] == ["echo"]
    assert wf_engine.get_run(active).status == "pending"
    if isinstance(wf_engine.store, OrmStore):
        assert set(RunTag.objects.values_list("run_id", flat=True)) == {recent, active}
        assert set(Step.objects.values_list("run_id", flat=True)) == {recent}
    # Nothing older is left: a second purge deletes nothing.
    assert wf_engine.purge(datetime.timedelta(days=30)) == PurgeResult()


def test_purge_keeps_the_statuses_it_is_not_given(wf_engine: Engine):
    completed = finished(wf_engine, RunStatus.COMPLETED, DAYS_AGO_40)
    failed = finished(wf_engine, RunStatus.FAILED, DAYS_AGO_40)
    assert wf_engine.purge(DAYS_AGO_40 / 2, statuses=["completed"]).runs == 1
    assert gone(wf_engine, completed)
    assert wf_engine.get_run(failed).status == "failed"


def test_purge_before_a_given_moment(wf_engine: Engine):
    run_id = finished(wf_engine, RunStatus.COMPLETED, DAYS_AGO_40)
    assert wf_engine.purge(timezone.now() - datetime.timedelta(days=41)).runs == 0
    assert wf_engine.purge(timezone.now() - datetime.timedelta(days=39)).runs == 1
    assert gone(wf_engine, run_id)


def test_purge_goes_batch_by_batch(wf_engine: Engine):
    run_ids = [finished(wf_engine, RunStatus.COMPLETED, DAYS_AGO_40) for _ in range(5)]
    assert wf_engine.purge(datetime.timedelta(days=1), batch_size=2).runs == 5
    assert all(gone(wf_engine, run_id) for run_id in run_ids)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"older_than": datetime.timedelta(0)}, "positive timedelta"),
        ({"older_than": datetime.timedelta(days=-1)}, "positive timedelta"),
        ({"older_than": "30d"}, "positive timedelta or a datetime"),
        ({"older_than": DAYS_AGO_40, "statuses": ["running"]}, "only finished runs"),
        ({"older_than": DAYS_AGO_40, "statuses": []}, "only finished runs"),
        ({"older_than": DAYS_AGO_40, "batch_size": 0}, "batch_size"),
        ({"older_than": DAYS_AGO_40, "batch_size": True}, "batch_size"),
    ],
)
def test_bad_purge_arguments_are_refused_and_delete_nothing(wf_engine: Engine, arguments, message):
    run_id = finished(wf_engine, RunStatus.COMPLETED, DAYS_AGO_40 * 2)
    with pytest.raises(ValueError, match=message):
        wf_engine.purge(**arguments)
    assert wf_engine.get_run(run_id).status == "completed"


@pytest.mark.parametrize("store_kind", ["orm", "memory"])
def test_purge_with_scoped_reads_stays_in_its_namespace(store_kind: str, db: None):
    store = OrmStore() if store_kind == "orm" else MemoryStore()
    registry = Registry()
    blue = Engine(store=store, registry=registry, namespace="blue", scope_reads=True)
    green = Engine(store=store, registry=registry, namespace="green", scope_reads=True)
    blue.register("wf", "1", one_step)
    blue_run = finished(blue, RunStatus.COMPLETED, DAYS_AGO_40)
    green_run = finished(green, RunStatus.COMPLETED, DAYS_AGO_40)
    assert blue.purge(datetime.timedelta(days=1)).runs == 1
    assert gone(blue, blue_run)
    assert green.get_run(green_run).status == "completed"


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite locks the whole database")
@pytest.mark.django_db(transaction=True)
def test_purge_skips_a_run_another_transaction_holds(registry: Registry):
    engine = Engine(store=OrmStore(), registry=registry, enqueue=False)
    engine.register("wf", "1", one_step)
    held = finished(engine, RunStatus.FAILED, DAYS_AGO_40)
    free = finished(engine, RunStatus.FAILED, DAYS_AGO_40)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        # As a retry under way would: the run's row locked until its transaction ends.
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk=held)
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        assert engine.purge(datetime.timedelta(days=1)).runs == 1
    finally:
        release.set()
        holder.join()
    assert gone(engine, free)
    assert engine.get_run(held).status == "failed"
    assert [s.name for s in engine.store.get_steps(held)] == ["echo"]


def test_purge_deletes_signals_taken_before_the_cutoff_only(orm_engine: Engine):
    old = timezone.now() - DAYS_AGO_40
    taken_long_ago = Signal.objects.create(token="t", consumed_by="r1", consumed_at=old)
    taken_lately = Signal.objects.create(token="t", consumed_by="r2", consumed_at=timezone.now())
    # Kept for a waiter that has not come yet, however old: it stays.
    waiting = Signal.objects.create(token="t", created_at=old)
    assert orm_engine.purge(datetime.timedelta(days=30)) == PurgeResult(runs=0, signals=1)
    assert set(Signal.objects.values_list("pk", flat=True)) == {taken_lately.pk, waiting.pk}
    assert not Signal.objects.filter(pk=taken_long_ago.pk).exists()


# manage.py durable purge ----------------------------------------------------------------


def old_echo_run(status: str = RunStatus.COMPLETED) -> str:
    run_id = default_engine.start("tests.echo", {"key": "tenant:acme", "text": "hi"}).run_id
    force_status(default_engine, run_id, status, finished_at=timezone.now() - DAYS_AGO_40)
    return run_id


def test_the_purge_command_for_people_and_scripts(db):
    old_echo_run()
    old_echo_run(RunStatus.FAILED)
    assert durable("purge", "--older-than", "30d", "--status", "failed") == (
        "deleted 1 run(s) and 0 taken signal(s)\n"
    )
    assert durable_json("purge", "--older-than", "720h") == {
        "runs": 1,
        "signals": 0,
    }
    assert durable("purge", "--older-than", "90m") == "deleted 0 run(s) and 0 taken signal(s)\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "30"], "positive age with a unit"),
        (["--older-than", "0d"], "positive age with a unit"),
        (["--older-than", "soon"], "positive age with a unit"),
        (["--older-than", "1d", "--batch-size", "0"], "--batch-size"),
        (["--older-than", "1d", "--status", "running"], "invalid choice"),
        ([], "--older-than"),
    ],
)
def test_the_purge_command_refuses_bad_arguments(db, args, message):
    run_id = old_echo_run()
    with pytest.raises(CommandError, match=message):
        durable("purge", *args)
    assert default_engine.get_run(run_id).status == "completed"
