"""Starts, the quota hammer and a worker's turns through PgBouncer in transaction pooling.

Each transaction may run on another of PgBouncer's server connections, and a server
connection serves one client's transaction after another's: nothing may rely on state
kept by a session. The tests run Debian's ``pgbouncer`` (``tests/pgbouncer.py``) with
``pool_mode = transaction`` and fewer server connections than clients. PostgreSQL only;
without ``pgbouncer`` they are skipped, except on CI (``CI`` set), where that fails.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from durable_django import ConcurrencyLimitError, Engine, RunStatus
from durable_django import engine as default_engine
from durable_django.models import Run, RunTag, Signal
from durable_django.stores import OrmStore
from tests.hammer_worker import make_engine, run_threads, start_once
from tests.testapp.workflows import EchoWorkflow

from ..brokers import Broker
from ..hammer import LIMIT, PATIENCE, STORES, THREADS, TRIALS, assert_trials, fresh_keys
from ..helpers import status_is
from ..pgbouncer import PgBouncer, find_pgbouncer, running_pgbouncer, through, worker_env
from ..recovery_workflows import abc, log_lines, sleeper
from ..worker import Worker, running_worker, unique_queue, wait_until

if TYPE_CHECKING:
    import psycopg

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="PgBouncer pools PostgreSQL connections"
    ),
]

#: Server connections of the shared pgbouncer: fewer than the hammer's threads.
POOL_SIZE = 4


@pytest.fixture(scope="module")
def pgbouncer_program() -> str:
    program = find_pgbouncer()
    if program is None:
        message = "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return program


@pytest.fixture(scope="module")
def pgbouncer(pgbouncer_program: str) -> Iterator[PgBouncer]:
    with running_pgbouncer(pgbouncer_program, pool_size=POOL_SIZE) as bouncer:
        yield bouncer


# starts -------------------------------------------------------------------------------


@pytest.mark.parametrize("fast_path", STORES)
def test_a_start_is_refused_at_the_limit(pgbouncer: PgBouncer, fast_path: bool) -> None:
    engine = make_engine(fast_path)
    (key,) = fresh_keys(1)
    with through(pgbouncer):
        admitted = [start_once(engine, 0, f"s{n}", key, 3) for n in range(3)]
        with transaction.atomic():
            refused = start_once(engine, 0, "in-atomic", key, 3)
        with pytest.raises(ConcurrencyLimitError) as caught:
            EchoWorkflow.dispatch({"key": key, "text": "one too many"})

        assert [outcome.kind for outcome in admitted] == ["created"] * 3
        assert (refused.kind, refused.key, refused.limit, refused.active) == (
            "refused",
            key,
            3,
            3,
        )
        assert (caught.value.key, caught.value.limit, caught.value.active) == (key, 3, 3)
        stored = Run.objects.filter(tag_rows__tag=f"concurrency:{key}")
        assert set(stored.values_list("pk", flat=True)) == {o.run_id for o in admitted}


@pytest.mark.parametrize("fast_path", STORES)
def test_threads_released_together_admit_exactly_the_limit(
    pgbouncer: PgBouncer, fast_path: bool
) -> None:
    engine = make_engine(fast_path)
    keys = fresh_keys(TRIALS)
    database = connection.settings_dict["NAME"]
    passed_on = pgbouncer.transactions(database)
    with through(pgbouncer):
        outcomes = run_threads(
            engine, "b", keys, LIMIT, THREADS, threading.Barrier(THREADS), PATIENCE
        )
        assert_trials(outcomes, keys, THREADS)
        assert Run.objects.count() == RunTag.objects.count() == LIMIT * TRIALS

    # Every start went through PgBouncer, on one of its few server connections.
    assert pgbouncer.transactions(database) - passed_on >= THREADS * TRIALS
    assert 0 < len(pgbouncer.show("SERVERS", database)) <= POOL_SIZE


# session state ------------------------------------------------------------------------

#: What a server connection keeps from one transaction to the next.
SESSION_STATE = """
SELECT pg_backend_pid(),
    (SELECT json_object_agg(name, setting) FROM pg_settings WHERE source = 'session'),
    current_setting('synchronous_commit'),
    (SELECT count(*) FROM pg_prepared_statements),
    (SELECT count(*) FROM pg_cursors),
    (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())
"""


def probe_of(bouncer: PgBouncer) -> psycopg.Connection[Any]:
    """A client of ``bouncer``'s that sees what its server connections keep."""
    import psycopg

    return psycopg.connect(
        host="127.0.0.1",
        port=bouncer.port,
        dbname=connection.settings_dict["NAME"],
        user=connection.settings_dict["USER"],
        autocommit=True,
        prepare_threshold=None,  # its own statements would stay on the server connection
    )


def session_state(client: psycopg.Connection[Any]) -> tuple[Any, ...]:
    return tuple(client.execute(SESSION_STATE).fetchone() or ())


def test_starts_and_turns_leave_no_session_state(pgbouncer_program: str) -> None:
    """With a single server connection, another client of PgBouncer sees whatever a
    start or a turn left on it."""
    engine = Engine(store=OrmStore(), enqueue=False)
    with (
        running_pgbouncer(pgbouncer_program, pool_size=1) as single,
        through(single),
        probe_of(single) as probe,
    ):
        before = session_state(probe)
        # The probe would see a session-level setting made by another client.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), set_config('work_mem', '5MB', false)")
            assert cursor.fetchone()[0] == before[0]
        assert session_state(probe)[1]["work_mem"] == str(5 * 1024)
        probe.execute("RESET work_mem")
        assert session_state(probe) == before

        key = fresh_keys(1)[0]
        handles = [engine.start(EchoWorkflow, {"key": key, "text": str(n)}) for n in range(3)]
        with pytest.raises(ConcurrencyLimitError):
            engine.start(EchoWorkflow, {"key": key, "text": "refused"})
        # Turns outside a transaction: their claims commit asynchronously.
        assert all(engine.execute(handle.run_id) for handle in handles)

        assert session_state(probe) == before
        assert before[2] == "on"
    assert [engine.get_run(h.run_id).status for h in handles] == [RunStatus.COMPLETED] * 3


def test_transactional_steps_with_their_begin_and_commit_in_their_statements(
    pgbouncer_program: str,
) -> None:
    """A turn of transactional steps, each step's BEGIN sent with its first statement and
    its COMMIT with its record, through a single server connection: every step's write
    commits, the server connection is idle in no transaction after it, and nothing of
    the session is left."""
    token = f"pgbouncer:{uuid.uuid4().hex}"
    engine = Engine(store=OrmStore(), enqueue=False)

    def body(ctx: Any, input: Any) -> list[int]:
        return [
            ctx.transaction(f"write {n}", lambda: Signal.objects.create(token=token).pk)
            for n in range(3)
        ]

    engine.register("pgbouncer.transactions", "1", body)
    with (
        running_pgbouncer(pgbouncer_program, pool_size=1) as single,
        through(single),
        probe_of(single) as probe,
    ):
        before = session_state(probe)
        handles = [engine.start("pgbouncer.transactions", {}) for _ in range(2)]
        assert all(engine.execute(handle.run_id) for handle in handles)
        assert session_state(probe) == before
        states = probe.execute(
            "SELECT state FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchall()
        assert ("idle in transaction",) not in states
    assert Signal.objects.filter(token=token).count() == 6
    assert [engine.get_run(h.run_id).status for h in handles] == [RunStatus.COMPLETED] * 2


# a worker -----------------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_worker_through_pgbouncer_completes_multi_step_runs(
    pgbouncer: PgBouncer, broker: Broker, tmp_path: Path
) -> None:
    queue = unique_queue("durable-pgbouncer")
    options = {"ENQUEUE": True, "QUEUE": queue, "LEASE_SECONDS": 2}
    env = {**worker_env(pgbouncer), "DURABLE_TEST_DURABLE": json.dumps(options)}
    files = {"log": str(tmp_path / "abc.log"), "release": str(tmp_path / "abc.release")}
    try:
        with (
            through(pgbouncer),
            override_settings(DURABLE=options),
            running_worker(queue, include=["tests.recovery_workflows"], env=env) as worker,
        ):
            handle = abc.dispatch(files)
            _lease_renewed(handle.run_id, files["log"], worker)
            # The worker, in its turn, is a client of PgBouncer, as this process is.
            clients = pgbouncer.show("CLIENTS", connection.settings_dict["NAME"])
            assert len(clients) >= 2, clients
            Path(files["release"]).touch()
            assert worker.result(handle) == {"steps": ["A", "B", "C"]}

            # A second turn, after a durable sleep woken by a tick through PgBouncer.
            sleeping = sleeper.dispatch({"log": str(tmp_path / "sleeper.log"), "seconds": 1})
            wait_until(status_is(sleeping.run_id, RunStatus.SUSPENDED), "the sleep", worker)
            wake_at = default_engine.get_run(sleeping.run_id).wake_at
            assert wake_at is not None
            wait_until(lambda: timezone.now() > wake_at, "the time to wake")
            assert default_engine.tick().woken == 1
            assert worker.result(sleeping) == {"slept": 1}
    finally:
        broker.delete_queue(queue)

    assert log_lines(files["log"]) == ["A", "B", "C"]
    assert log_lines(tmp_path / "sleeper.log") == ["A", "B"]


def _lease_renewed(run_id: str, log: str, worker: Worker) -> None:
    """Return once the worker, blocked in step B, has renewed the run's lease (from a
    database connection of its own)."""
    wait_until(lambda: log_lines(log) == ["A", "B"], "step B to begin", worker)
    first = default_engine.get_run(run_id).lease_expires_at
    assert first is not None
    wait_until(
        lambda: default_engine.get_run(run_id).lease_expires_at > first,
        "the lease to be renewed",
        worker,
    )
