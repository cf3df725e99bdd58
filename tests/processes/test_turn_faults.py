"""A turn whose database goes away: the run is handed back or recovered, never failed.

The turns run in the test process on an engine whose store reaches the test database
through a :class:`~tests.faults.TcpProxy` of the test's own, which a step's function
drops (the server comes back at once: a restart, a failover) or cuts (the server stays
away). On PostgreSQL and MariaDB; SQLite has no server to lose.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from durable_django import Engine, RunStatus
from durable_django._rules.registry import Registry
from durable_django.stores import OrmStore

from ..faults import TcpProxy, proxied_test_database

ALIAS = "turn_faults"

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", ALIAS])


@pytest.fixture(scope="module")
def proxied(django_db_setup: None) -> Iterator[TcpProxy]:
    """A proxy in front of the test database's server, and the test database through it
    as the database ``ALIAS``."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server to lose")
    with proxied_test_database(ALIAS) as running:
        yield running


@pytest.fixture
def proxy(proxied: TcpProxy) -> Iterator[TcpProxy]:
    yield proxied
    proxied.restore()


@pytest.fixture
def engine(proxy: TcpProxy, registry: Registry) -> Engine:
    return Engine(store=OrmStore(using=ALIAS), registry=registry, enqueue=False)


def register(engine: Engine, proxy: TcpProxy, fault: str, calls: list[str]) -> str:
    """A workflow whose step ``a`` makes the fault, then ends the turn after step ``b``
    (``then="b"``) or right after ``a`` (``then="end"``)."""

    def a() -> str:
        calls.append("a")
        if len(calls) == 1:
            getattr(proxy, fault)()
        return "a"

    def body(ctx: Any, input: dict[str, str]) -> str:
        ctx.step("a", a)
        if input["then"] == "b":
            ctx.step("b", lambda: "b")
        return "done"

    engine.register("faults.turn", "1", body)
    return "faults.turn"


def test_a_database_back_at_once_hands_the_run_back_to_be_replayed(engine, proxy):
    calls: list[str] = []
    workflow = register(engine, proxy, "drop", calls)
    run_id = engine.start(workflow, {"then": "b"}).run_id

    # Step a's record, written at the next durable call, finds the connection dropped.
    assert engine.execute(run_id)
    run = engine.get_run(run_id)
    assert (run.status, run.error, run.lease_owner) == (RunStatus.PENDING, None, "")
    assert engine.store.get_steps(run_id) == []

    assert engine.execute(run_id)
    run = engine.get_run(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "done")
    assert calls == ["a", "a"]  # at least once: its record was lost with the connection


def test_the_end_of_a_turn_written_again_on_a_new_connection(engine, proxy):
    calls: list[str] = []
    workflow = register(engine, proxy, "drop", calls)
    run_id = engine.start(workflow, {"then": "end"}).run_id

    assert engine.execute(run_id)
    run = engine.get_run(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "done")
    assert calls == ["a"]


@pytest.mark.parametrize("then", ["b", "end"])
def test_a_database_that_stays_away_leaves_the_run_to_its_lease(engine, proxy, then):
    calls: list[str] = []
    workflow = register(engine, proxy, "cut", calls)
    run_id = engine.start(workflow, {"then": then}).run_id

    assert engine.execute(run_id)
    proxy.restore()
    run = engine.get_run(run_id)
    # Not failed: still held under the lease of the turn that lost its database.
    assert (run.status, run.error) == (RunStatus.RUNNING, None)
    assert run.lease_expires_at is not None

    later = run.lease_expires_at + datetime.timedelta(seconds=1)
    assert engine.tick(now=later).recovered == 1
    assert engine.execute(run_id)
    run = engine.get_run(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "done")
    assert calls == ["a", "a"]
    assert run.finished_at is not None and run.finished_at <= timezone.now()


def test_a_transactional_step_whose_database_drops_runs_again_and_commits_once(engine, proxy):
    """The connection drops inside ``ctx.transaction``, after ``fn`` wrote: its writes and
    its record are lost together, the run is handed back, and its next turn commits both."""
    from durable_django.models import Signal

    token = f"tx:{uuid.uuid4().hex}"
    calls: list[str] = []

    def charge() -> str:
        calls.append("charge")
        Signal.objects.using(ALIAS).create(token=token, payload={})
        if len(calls) == 1:
            proxy.drop()
        return "charged"

    def body(ctx: Any, input: Any) -> str:
        return ctx.transaction("charge", charge)

    engine.register("faults.transaction", "1", body)
    run_id = engine.start("faults.transaction", {}).run_id

    assert engine.execute(run_id)
    run = engine.get_run(run_id)
    assert (run.status, run.error, run.lease_owner) == (RunStatus.PENDING, None, "")
    assert engine.store.get_steps(run_id) == []
    assert Signal.objects.filter(token=token).count() == 0

    assert engine.execute(run_id)
    run = engine.get_run(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "charged")
    assert calls == ["charge", "charge"]
    assert Signal.objects.filter(token=token).count() == 1  # committed once


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the record sent with its COMMIT is PostgreSQL's"
)
def test_a_transactional_step_whose_commit_answer_is_lost_is_not_run_again(engine, proxy):
    """The server commits the step's writes and record (sent with the ``COMMIT`` on
    PostgreSQL), then the connection drops before its answer reaches the worker: the worker
    cannot tell whether it committed, hands the run back, and the next turn finds the
    record and replays it, without calling the function again."""
    from django.db import OperationalError, connections

    from durable_django.models import Signal

    token = f"tx:{uuid.uuid4().hex}"
    calls: list[str] = []
    lost: list[str] = []

    def charge() -> str:
        calls.append("charge")
        Signal.objects.using(ALIAS).create(token=token, payload={})
        return "charged"

    def body(ctx: Any, input: Any) -> str:
        return ctx.transaction("charge", charge)

    def lose_the_answer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if "durable_record_held_step" in sql and not lost:
            lost.append(sql)
            proxy.drop()
            # The worker's next read finds the connection gone, and raises as it would
            # have had the answer itself been lost.
            with pytest.raises(OperationalError), connections[ALIAS].cursor() as cursor:
                cursor.execute("SELECT 1")
            raise OperationalError("the answer to the record and its COMMIT was lost")
        return result

    engine.register("faults.transaction_in_doubt", "1", body)
    run_id = engine.start("faults.transaction_in_doubt", {}).run_id
    with connections[ALIAS].execute_wrapper(lose_the_answer):
        assert engine.execute(run_id)
    assert lost
    run = engine.get_run(run_id)
    assert (run.status, run.lease_owner) == (RunStatus.PENDING, "")

    assert engine.execute(run_id)
    run = engine.get_run(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "charged")
    # Committed with the record before the answer was lost: replayed, not run again.
    assert lost[0].endswith("; COMMIT")
    assert calls == ["charge"]
    assert Signal.objects.filter(token=token).count() == 1
