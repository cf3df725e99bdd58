"""The tick under faults: the ``durable tick`` loop, the Celery tick task and the execute
task while their database goes away and comes back, and the loop's stop signals.

The database taken away is the module's own: on PostgreSQL, a server of its own
(``tests/faults.py``) stopped at once (as ``pg_ctl stop -m immediate``) and started
again; on MariaDB, the test database behind a TCP proxy of the module's own, which the
tests cut and restore. The test process reaches it as the Django database ``faults``,
and the processes under test through their environment. The signal tests need no fault
and run on every database.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections
from django.utils import timezone

from durable_django import Engine, RunHandle, RunStatus
from durable_django._runtime.tick import TickResult
from durable_django.engines import send_run
from durable_django.management.cli.tick import TickSubcommand
from durable_django.stores import OrmStore
from durable_django.ticker import Ticker

from ..brokers import Broker
from ..celery_app import app
from ..fault_workflows import quick
from ..faults import (
    PostgresServer,
    TcpProxy,
    database_alias,
    django_database,
    django_environment,
    proxied_environment,
    proxied_settings,
)
from ..worker import ROOT, WAIT, running_worker, unique_queue, wait_until

ALIAS = "faults"
WORKFLOWS = ["tests.fault_workflows"]

with_faults = pytest.mark.django_db(transaction=True, databases=["default", ALIAS])


@dataclass
class Database:
    """The database of the processes under test, which a test takes away and brings back."""

    #: The test process's Django alias for it.
    alias: str
    #: What a subprocess with the tests' settings needs in its environment to use it.
    environment: dict[str, str]
    _take_away: Callable[[], None]
    _bring_back: Callable[[], None]

    def take_away(self) -> None:
        self._take_away()

    def bring_back(self) -> None:
        self._bring_back()
        # The test process's own connection went with the database.
        with contextlib.suppress(Exception):
            connections[self.alias].close()

    def engine(self, **options: Any) -> Engine:
        """An engine of the test process on this database."""
        return Engine(store=OrmStore(using=self.alias), enqueue=False, **options)


@pytest.fixture(scope="module")
def database(django_db_setup: None, django_db_blocker: Any) -> Iterator[Database]:
    if connection.vendor == "postgresql":
        name = "durable_faults"
        with (
            PostgresServer() as server,
            django_db_blocker.unblock(),
            django_database(ALIAS, server, name),
        ):
            yield Database(ALIAS, server.environment(name), server.stop, server.start)
    elif connection.vendor == "mysql":
        host, port = connection.settings_dict["HOST"], int(connection.settings_dict["PORT"])
        with TcpProxy(host, port) as proxy, database_alias(ALIAS, proxied_settings(proxy)):
            yield Database(ALIAS, proxied_environment(proxy), proxy.cut, proxy.restore)
    else:
        pytest.skip("SQLite has no server to lose")


@pytest.fixture
def faulty(database: Database) -> Iterator[Database]:
    """The database, brought back at the end of the test whatever happened."""
    try:
        yield database
    finally:
        database.bring_back()


def suspended_run(engine: Engine, tmp_path: Path) -> str:
    """A run waiting on a timer that is far from due."""
    handle = engine.start(quick, {"log": str(tmp_path / f"{uuid.uuid4().hex}.log")})
    far = timezone.now() + datetime.timedelta(days=1)
    assert engine.store.transition(
        handle.run_id, [RunStatus.PENDING], RunStatus.SUSPENDED, wake_at=far, wait={"sleep": 1}
    )
    return handle.run_id


def make_due(engine: Engine, run_id: str) -> None:
    assert engine.store.transition(
        run_id, [RunStatus.SUSPENDED], RunStatus.SUSPENDED, wake_at=timezone.now()
    )


def status_of(engine: Engine, run_id: str) -> str:
    return engine.get_run(run_id).status


# the tick loop ------------------------------------------------------------------------


class TickLoop:
    """``django-admin durable tick --interval ... --json`` as a subprocess."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.stdout = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "durable", "tick", "--json", *args],
            cwd=ROOT,
            env=django_environment(**env),
            stdin=subprocess.DEVNULL,
            stdout=self.stdout,
            stderr=self.stderr,
        )

    def output(self) -> tuple[list[dict[str, int]], str]:
        """The ticks printed so far, and what was logged."""
        self.stdout.seek(0)
        self.stderr.seek(0)
        ticks = [json.loads(line) for line in self.stdout.read().decode().splitlines()]
        return ticks, self.stderr.read().decode()

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send ``signum`` and return the exit status."""
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the loop did not stop:\n{self.output()[1]}") from None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stdout.close()
        self.stderr.close()


@pytest.fixture
def tick_loops() -> Iterator[Callable[..., TickLoop]]:
    """Starts tick loops, killed at the end of the test if still running."""
    loops: list[TickLoop] = []

    def start(*args: str, env: dict[str, str] | None = None) -> TickLoop:
        loops.append(TickLoop(*args, env=env or {}))
        return loops[-1]

    yield start
    for loop in loops:
        loop.close()


@pytest.mark.slow
@with_faults
def test_the_tick_loop_goes_on_once_the_database_is_back(
    faulty: Database, tick_loops: Callable[..., TickLoop], tmp_path: Path
) -> None:
    engine = faulty.engine()
    run_id = suspended_run(engine, tmp_path)
    loop = tick_loops("--interval", "0.5", env=faulty.environment)
    wait_until(lambda: loop.output()[0], "a first tick")

    faulty.take_away()
    wait_until(lambda: "durable tick failed" in loop.output()[1], "a tick to fail")
    faulty.bring_back()
    make_due(engine, run_id)

    wait_until(lambda: status_of(engine, run_id) == RunStatus.PENDING, "the loop to wake the run")
    assert loop.stop() == 0
    ticks, logged = loop.output()
    assert any(tick["woken"] == 1 for tick in ticks)
    failures = [line for line in logged.splitlines() if "durable tick failed" in line]
    # One line each, at ERROR, with the cause; no traceback.
    assert failures
    assert all(" ERROR durable tick failed: " in line for line in failures)
    assert all(("OperationalError" in line or "InterfaceError" in line) for line in failures)
    assert "Traceback" not in logged
    assert " INFO durable tick works again, after " in logged


@pytest.mark.slow
@with_faults
def test_a_failing_tick_is_logged_with_its_cause_and_the_loop_waits_longer(
    faulty: Database, caplog: pytest.LogCaptureFixture
) -> None:
    ticker = Ticker(faulty.engine())
    assert isinstance(ticker.tick(), TickResult)
    faulty.take_away()
    caplog.set_level(logging.INFO, logger="durable_django")

    delays = []
    for _ in range(5):
        assert ticker.tick() is None
        delays.append(ticker.delay(1.0))
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert [ticker.delay(0.5), ticker.delay(60.0)] == [8.0, 60.0]
    # The same error is logged at the 1st, 2nd and 4th failure in a row.
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage().endswith("in a row)") for r in errors] == [False, True, True]
    assert all(r.getMessage().startswith("durable tick failed: ") for r in errors)
    assert "(4 failed ticks in a row)" in errors[-1].getMessage()
    assert all(r.exc_info is None for r in errors)

    # A single tick fails the command, on one line.
    command = TickSubcommand(BaseCommand(stdout=io.StringIO()), as_json=True, engine=ticker.engine)
    with pytest.raises(CommandError, match=r"^the tick failed: \w+Error: "):
        command.handle(interval=None, iterations=None)

    faulty.bring_back()
    caplog.clear()
    assert isinstance(ticker.tick(), TickResult)
    assert ticker.delay(1.0) == 1.0
    assert [r.getMessage() for r in caplog.records] == [
        "durable tick works again, after 5 failed tick(s)"
    ]


# the Celery tasks ----------------------------------------------------------------------


@pytest.fixture
def worker_queue(redis_broker: Broker) -> Iterator[str]:
    queue = unique_queue("durable-tick-faults")
    try:
        yield queue
    finally:
        redis_broker.delete_queue(queue)


@pytest.mark.slow
@with_faults
def test_a_worker_ticks_and_executes_again_once_the_database_is_back(
    faulty: Database, worker_queue: str, tmp_path: Path
) -> None:
    options = {"ENQUEUE": True, "QUEUE": worker_queue}
    env = {**faulty.environment, "DURABLE_TEST_DURABLE": json.dumps(options)}
    # Runs started here are sent to the worker's queue, and woken runs too.
    engine = faulty.engine(queue=worker_queue)
    with running_worker(worker_queue, include=WORKFLOWS, env=env) as worker:
        sent = engine.start(quick, {"log": str(tmp_path / "sent.log")})
        sleeping = suspended_run(engine, tmp_path)

        faulty.take_away()
        # The run's message comes while the database is away, then a tick.
        send_run(sent.run_id, worker_queue)
        app.send_task("durable_django.tick", queue=worker_queue)
        wait_until(lambda: "durable tick failed" in worker.log(), "the tick to fail", worker)
        faulty.bring_back()

        steps = {"steps": [f"A {worker.process.pid if worker.process else None}"]}
        # The message is tried again, on a fresh connection.
        assert worker.result(sent) == steps
        # The next tick works: it wakes the run, which the worker then executes.
        make_due(engine, sleeping)
        app.send_task("durable_django.tick", queue=worker_queue)
        assert worker.result(RunHandle(engine, sleeping, sent.workflow, False)) == steps
        logged = worker.log()

    failures = [line for line in logged.splitlines() if "durable tick failed" in line]
    assert len(failures) == 1
    assert "ERROR" in failures[0]
    assert "Traceback" not in logged


# stop signals -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_sigterm_between_ticks_stops_the_loop_at_once(tick_loops: Callable[..., TickLoop]) -> None:
    loop = tick_loops("--interval", "3600")
    wait_until(lambda: loop.output()[0], "the first tick")
    # The loop now sleeps for an hour.
    assert loop.stop(signal.SIGTERM) == 0
    assert len(loop.output()[0]) == 1


class SignalledEngine(Engine):
    """An engine whose tick sends this process ``signum`` before it does its work."""

    def __init__(self, signum: int) -> None:
        super().__init__(store=OrmStore(), enqueue=False)
        self.signum = signum

    def tick(self, now: datetime.datetime | None = None, *, limit: int = 1000) -> TickResult:
        os.kill(os.getpid(), self.signum)
        return super().tick(now, limit=limit)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_a_tick_lets_it_finish(signum: int) -> None:
    before = signal.getsignal(signum)
    out = io.StringIO()
    command = TickSubcommand(BaseCommand(stdout=out), as_json=True, engine=SignalledEngine(signum))

    command.handle(interval=3600.0, iterations=None)

    # The tick went to its end and printed what it did; no other tick began.
    assert len(out.getvalue().splitlines()) == 1
    assert set(json.loads(out.getvalue())) >= {"woken", "recovered", "fired"}
    assert signal.getsignal(signum) is before
