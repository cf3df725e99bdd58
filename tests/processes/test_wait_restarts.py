"""Starts waiting for a slot (``wait=``) while their database restarts: each reconnects
and waits on, and is admitted once a slot frees, or refused at its deadline with
:class:`ConcurrencyLimitError`; none fails with the database's error.

The database restarted is the module's own (``tests/faults.py``): on PostgreSQL a server
of its own (stopped at once, as ``pg_ctl stop -m immediate``, and started again), its
listener's connection lost with the rest; on MariaDB a server of its own, killed and
started again. The test process reaches it as the Django database ``restarts``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections

from durable_django import ConcurrencyLimitError, Engine, RunStatus
from durable_django._rules.registry import Registry
from durable_django._runtime.waiting import waiting_count
from durable_django.stores import OrmStore

from ..faults import MariaDbServer, PostgresServer, django_database
from ..helpers import echo, force_status

ALIAS = "restarts"
#: Generous bounds; a correct run never gets near them.
PATIENCE = 60.0
#: The wait of the starts refused at their deadline: longer than a restart takes on a
#: busy machine (a start whose database is still away at its deadline raises its error).
DEADLINE = 15.0
#: How many starts wait on the key while the database restarts.
WAITERS = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
]


@pytest.fixture(scope="module")
def server(
    django_db_setup: None, django_db_blocker: Any
) -> Iterator[PostgresServer | MariaDbServer]:
    name = f"durable_restarts_{uuid.uuid4().hex[:8]}"
    if connection.vendor == "postgresql":
        own: PostgresServer | MariaDbServer = PostgresServer()
    elif connection.vendor == "mysql":
        own = MariaDbServer()
    else:
        pytest.skip("SQLite has no server to restart")
    with own, django_db_blocker.unblock(), django_database(ALIAS, own, name):
        yield own


@pytest.fixture
def engine(server: PostgresServer | MariaDbServer) -> Iterator[Engine]:
    engine = Engine(registry=Registry(), store=OrmStore(using=ALIAS), enqueue=False)
    engine.register("restarts.echo", "1", echo)
    engine.config  # noqa: B018  (resolve the options once, before threads share it)
    yield engine
    server.start()  # whatever the test did
    connections[ALIAS].close()


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Waiters:
    """``WAITERS`` threads, each with a connection of its own already open (as a web
    server's threads keep theirs), then starting on ``key`` with ``wait``; one of them
    through ``astart``. What each start returned or raised is kept, by thread."""

    def __init__(self, engine: Engine, key: str, holder: str, wait: float) -> None:
        self.outcomes: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._wait, args=(engine, key, holder, wait, n))
            for n in range(WAITERS)
        ]
        for thread in self.threads:
            thread.start()

    def _wait(self, engine: Engine, key: str, holder: str, wait: float, n: int) -> None:
        quota = {"key": key, "limit": 1}
        try:
            assert engine.get_run(holder) is not None  # this thread's connection, open
            try:
                if n == 0:
                    start = async_to_sync(engine.astart)
                    outcome: Any = start("restarts.echo", {"n": n}, concurrency=quota, wait=wait)
                else:
                    outcome = engine.start("restarts.echo", {"n": n}, concurrency=quota, wait=wait)
            except Exception as error:
                outcome = error
            with self._lock:
                self.outcomes[n] = outcome
        finally:
            connections.close_all()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(PATIENCE)
        assert not any(thread.is_alive() for thread in self.threads)


def test_waiting_starts_are_admitted_after_their_database_restarts(
    server: PostgresServer | MariaDbServer, engine: Engine
) -> None:
    key = f"restarts:{uuid.uuid4().hex[:8]}"
    holder = engine.start("restarts.echo", {}, concurrency={"key": key, "limit": 1})
    waiters = Waiters(engine, key, holder.run_id, PATIENCE)
    wait_until(lambda: waiting_count() == WAITERS)
    server.restart()
    connections[ALIAS].close()  # this thread's connection went with the server
    force_status(engine, holder.run_id, RunStatus.COMPLETED)
    # one slot: each admitted start in turn completes, freeing it for the next
    done: set[str] = set()
    for _ in range(WAITERS):
        wait_until(lambda: len(waiters.outcomes) > len(done))
        handle = next(
            outcome
            for outcome in waiters.outcomes.values()
            if not isinstance(outcome, Exception) and outcome.run_id not in done
        )
        force_status(engine, handle.run_id, RunStatus.COMPLETED)
        done.add(handle.run_id)
    waiters.join()
    failed = {
        n: outcome for n, outcome in waiters.outcomes.items() if isinstance(outcome, Exception)
    }
    assert failed == {}
    assert all(outcome.created for outcome in waiters.outcomes.values())
    assert waiting_count() == 0


def test_waiting_starts_are_refused_at_their_deadline_after_their_database_restarts(
    server: PostgresServer | MariaDbServer, engine: Engine
) -> None:
    key = f"restarts:{uuid.uuid4().hex[:8]}"
    holder = engine.start("restarts.echo", {}, concurrency={"key": key, "limit": 1})
    waiters = Waiters(engine, key, holder.run_id, wait=DEADLINE)
    wait_until(lambda: waiting_count() == WAITERS)
    server.restart()  # the slot stays taken
    waiters.join()
    assert len(waiters.outcomes) == WAITERS
    for outcome in waiters.outcomes.values():
        assert isinstance(outcome, ConcurrencyLimitError), repr(outcome)
        assert (outcome.key, outcome.active) == (key, 1)
    connections[ALIAS].close()
    assert [run.run_id for run in engine.list_runs(tag=f"concurrency:{key}")] == [holder.run_id]
    assert waiting_count() == 0
