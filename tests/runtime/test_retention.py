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
from durable_django._rules.registry import Registry
from durable_django._rules.retention import PurgeResult
from durable_django.models import Run, RunTag, Signal, Step
from durable_django.stores import MemoryStore, OrmStore
from durable_django.testing import run_until_idle

from ..helpers import durable, durable_json, force_status

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
        "tickets": 0,
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


# a run is purged only once its whole ancestry has finished ------------------------------


def kid(ctx, input):
    return ctx.step("work", lambda: input["n"] * 10)


def waits_for_child_then_signal(ctx, input):
    """Starts a child and reads its outcome, then waits for a signal: while it waits, its
    finished child is old enough to purge, and its replay still reads the child."""
    out = ctx.child("kid", {"n": input["n"]}, f"{ctx.run_id}/kid")
    ctx.wait_for_signal(f"go:{ctx.run_id}")
    return out


def grandparent(ctx, input):
    out = ctx.child("parent", {"n": input["n"]}, f"{ctx.run_id}/parent")
    ctx.wait_for_signal(f"go:{ctx.run_id}")
    return out


def parent_of_kid(ctx, input):
    return ctx.child("kid", {"n": input["n"]}, f"{ctx.run_id}/kid")


@pytest.fixture
def family(wf_engine: Engine) -> Engine:
    wf_engine.register("kid", "1", kid)
    wf_engine.register("waiter", "1", waits_for_child_then_signal)
    wf_engine.register("parent", "1", parent_of_kid)
    wf_engine.register("grandparent", "1", grandparent)
    return wf_engine


def age(engine: Engine, run_id: str, ago: datetime.timedelta = DAYS_AGO_40) -> None:
    """Make the finished run ``run_id`` look as if it had ended ``ago``."""
    run = engine.get_run(run_id)
    force_status(engine, run_id, run.status, finished_at=timezone.now() - ago)


def test_a_finished_child_of_an_active_parent_stays_until_the_parent_has_finished(
    family: Engine,
):
    parent = family.start("waiter", {"n": 4}, "p").run_id
    run_until_idle(family)
    assert family.get_run("p/kid").status == "completed"
    assert family.get_run(parent).status == "suspended"  # waiting for its signal
    age(family, "p/kid")

    assert family.purge(datetime.timedelta(days=30)).runs == 0
    assert family.get_run("p/kid").status == "completed"

    # The parent's replay reads its child's outcome again, and completes.
    family.signal("go:p")
    run_until_idle(family)
    assert family.get_run(parent).status == "completed"
    assert family.get_run(parent).output == 40
    # Now its ancestry has finished, the old child goes.
    assert family.purge(datetime.timedelta(days=30)).runs == 1
    assert gone(family, "p/kid")
    assert family.get_run(parent).status == "completed"


def test_the_whole_ancestry_must_have_finished(family: Engine):
    family.start("grandparent", {"n": 1}, "g")
    run_until_idle(family)
    assert [family.get_run(r).status for r in ("g", "g/parent", "g/parent/kid")] == [
        "suspended",
        "completed",
        "completed",
    ]
    age(family, "g/parent")
    age(family, "g/parent/kid")
    # The grandchild's parent has finished, but not its grandparent.
    assert family.purge(datetime.timedelta(days=30), batch_size=1).runs == 0
    family.signal("go:g")
    run_until_idle(family)
    assert family.get_run("g").output == 10
    age(family, "g")
    # One run per batch: a run whose parent row is already gone counts as having a
    # finished ancestry, whatever the order the batches take them in.
    assert family.purge(datetime.timedelta(days=30), batch_size=1).runs == 3
    assert all(gone(family, r) for r in ("g", "g/parent", "g/parent/kid"))


def test_runs_below_an_active_run_do_not_stop_the_purge_of_the_others(family: Engine):
    family.start("waiter", {"n": 1}, "0")
    run_until_idle(family)
    age(family, "0/kid")  # the first id of all: in the first batch
    others = [finished(family, RunStatus.COMPLETED, DAYS_AGO_40) for _ in range(5)]
    # Batches of two: the kept child takes a place in the first, and the purge goes on.
    assert family.purge(datetime.timedelta(days=30), batch_size=2).runs == 5
    assert all(gone(family, r) for r in others)
    assert family.get_run("0/kid").status == "completed"


def test_a_child_deleted_under_a_waiting_parent_fails_it_rather_than_leaving_it_waiting(
    family: Engine,
):
    """Whatever deleted it (a delete past ``purge``, a purge before a retry), the parent
    that reads a child that is gone ends, failed, and says which child."""
    family.start("waiter", {"n": 1}, "p")
    run_until_idle(family)
    if isinstance(family.store, OrmStore):
        Run.objects.filter(pk="p/kid").delete()
    else:
        del family.store._runs["p/kid"]
    family.signal("go:p")
    run_until_idle(family)
    run = family.get_run("p")
    assert run.status == "failed"
    assert "child run 'p/kid' no longer exists" in run.error["message"]


def test_a_purge_reads_each_level_of_ancestry_once_per_batch(orm_engine: Engine):
    from django.test.utils import CaptureQueriesContext

    orm_engine.register("kid", "1", kid)
    orm_engine.register("parent", "1", parent_of_kid)
    orm_engine.register("grandparent", "1", grandparent)

    def purge_families(count: int) -> int:
        for n in range(count):
            orm_engine.start("grandparent", {"n": n}, f"g{count}-{n}")
        run_until_idle(orm_engine)
        for n in range(count):
            orm_engine.signal(f"go:g{count}-{n}")
        run_until_idle(orm_engine)
        for run in orm_engine.list_runs():
            age(orm_engine, run.run_id)
        with CaptureQueriesContext(connection) as queries:
            assert orm_engine.purge(datetime.timedelta(days=30)).runs == 3 * count
        return len(queries)

    assert purge_families(2) == purge_families(20)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite locks the whole database")
@pytest.mark.django_db(transaction=True)
def test_a_retry_under_way_keeps_the_children_of_the_run_it_retries(registry: Registry):
    engine = Engine(store=OrmStore(), registry=registry, enqueue=False)
    engine.register("kid", "1", kid)
    down = ["once"]

    def call() -> str:
        if down:
            down.pop()
            raise RuntimeError("the service is down")
        return "up"

    def fails_once(ctx, input):
        out = ctx.child("kid", {"n": 2}, f"{ctx.run_id}/kid")
        ctx.step("call", call)
        return out

    engine.register("fails-once", "1", fails_once)
    engine.start("fails-once", {}, "p")
    run_until_idle(engine)
    assert engine.get_run("p").status == "failed"
    age(engine, "p")
    age(engine, "p/kid")
    retrying, release = threading.Event(), threading.Event()

    def retry() -> None:
        # The retry's transaction holds the parent's row until it commits.
        try:
            with transaction.atomic():
                engine.retry("p")
                retrying.set()
                release.wait(30)
        finally:
            connections.close_all()

    retrier = threading.Thread(target=retry)
    retrier.start()
    try:
        assert retrying.wait(30)
        assert engine.purge(datetime.timedelta(days=30)).runs == 0
    finally:
        release.set()
        retrier.join()
    assert engine.get_run("p").status == "pending"
    run_until_idle(engine)
    assert (engine.get_run("p").status, engine.get_run("p").output) == ("completed", 20)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite locks the whole database")
@pytest.mark.django_db(transaction=True)
def test_a_retry_after_the_purge_of_a_child_ends_the_run_with_the_reason(registry: Registry):
    """The other order: the purge holds the failed parent while it deletes the child; the
    retry waits for it, and the retried parent fails at the child that is gone."""
    engine = Engine(store=OrmStore(), registry=registry, enqueue=False)
    engine.register("kid", "1", kid)

    def fails(ctx, input):
        ctx.child("kid", {"n": 2}, f"{ctx.run_id}/kid")
        raise RuntimeError("always")

    engine.register("fails", "1", fails)
    engine.start("fails", {}, "p")
    run_until_idle(engine)
    retried = threading.Event()

    def retry() -> None:
        try:
            engine.retry("p")
            retried.set()
        finally:
            connections.close_all()

    with transaction.atomic():
        assert engine.store.delete_runs(["p/kid"]) == ["p/kid"]
        retrier = threading.Thread(target=retry)
        retrier.start()
        # The retry waits for the parent's row until the purge commits.
        assert not retried.wait(0.5)
    retrier.join(30)
    assert retried.is_set()
    run_until_idle(engine)
    run = engine.get_run("p")
    assert run.status == "failed"
    assert "child run 'p/kid' no longer exists" in run.error["message"]


def test_the_purge_command_keeps_the_children_of_active_runs(db):
    parent = default_engine.start("tests.plain", {}).run_id
    child = default_engine.start_child(
        default_engine.get_run(parent), "tests.plain", {}, f"{parent}/1"
    ).run_id
    force_status(
        default_engine, child, RunStatus.COMPLETED, finished_at=timezone.now() - DAYS_AGO_40
    )
    force_status(default_engine, parent, RunStatus.SUSPENDED)
    assert durable_json("purge", "--older-than", "30d") == {"runs": 0, "signals": 0, "tickets": 0}
    force_status(default_engine, parent, RunStatus.CANCELLED, finished_at=timezone.now())
    assert durable_json("purge", "--older-than", "30d") == {"runs": 1, "signals": 0, "tickets": 0}
    assert gone(default_engine, child)
