"""Lease renewal while the database is out of reach, on real Celery workers.

Two workers (``tests/worker.py``) reach the test database through a TCP proxy of the
module's own (``tests/faults.py``), which the tests cut in the middle of a long step; the
test process itself reaches the database directly, and ticks. The workers hold runs under
a 12-second lease, renewed every 4 seconds. Every step logs ``"<name> <pid>"``
(``tests/fault_workflows.py``), so the tests see which worker ran what, and how often.

PostgreSQL and MariaDB only: SQLite is a file, not a server out of reach.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from durable_django import RunStatus
from durable_django import engine as default_engine

from ..brokers import Broker
from ..celery_app import app
from ..fault_workflows import long_step
from ..faults import TcpProxy, proxied_environment
from ..helpers import run_of, steps_of
from ..recovery_workflows import log_lines
from ..worker import Worker, running_worker, unique_queue, wait_until

DATABASE = settings.DATABASES["default"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        DATABASE["ENGINE"].endswith("sqlite3"), reason="SQLite has no server to lose"
    ),
]

LEASE_SECONDS = 12
WORKFLOWS = ["tests.fault_workflows"]


def durable_options(queue: str) -> dict[str, Any]:
    return {"ENQUEUE": True, "QUEUE": queue, "LEASE_SECONDS": LEASE_SECONDS}


@pytest.fixture(scope="module")
def proxy(django_db_setup: None) -> Iterator[TcpProxy]:
    """A proxy in front of the test database's server."""
    with TcpProxy(DATABASE["HOST"], int(DATABASE["PORT"])) as running:
        yield running


@pytest.fixture(scope="module")
def workers(proxy: TcpProxy, redis_broker: Broker) -> Iterator[tuple[Worker, Worker]]:
    """Two workers on one queue, reaching the database through the proxy."""
    queue = unique_queue("durable-lease-faults")
    env = {**proxied_environment(proxy), "DURABLE_TEST_DURABLE": json.dumps(durable_options(queue))}
    try:
        with (
            running_worker(queue, include=WORKFLOWS, env=env) as first,
            running_worker(queue, include=WORKFLOWS, env=env) as second,
        ):
            yield first, second
    finally:
        redis_broker.delete_queue(queue)


@pytest.fixture
def sending(workers: tuple[Worker, Worker]) -> Iterator[tuple[Worker, Worker]]:
    """Starts send their runs to the workers' queue."""
    with override_settings(DURABLE=durable_options(workers[0].queue)):
        yield workers


def run_files(tmp_path: Path) -> dict[str, str]:
    return {"log": str(tmp_path / "steps.log"), "release": str(tmp_path / "release")}


def executor_of(step: str, log: str, workers: tuple[Worker, Worker]) -> Worker:
    """The worker that began ``step``, once one has."""
    lines = wait_until(
        lambda: [line for line in log_lines(log) if line.startswith(f"{step} ")],
        f"step {step} to begin",
        *workers,
    )
    pid = int(lines[0].split()[1])
    return next(worker for worker in workers if worker.process and worker.process.pid == pid)


def test_a_database_outage_shorter_than_the_lease_leaves_the_step_to_its_worker(
    sending: tuple[Worker, Worker], proxy: TcpProxy, tmp_path: Path
) -> None:
    files = run_files(tmp_path)
    handle = long_step.dispatch(files)
    worker = executor_of("B", files["log"], sending)
    failed = f"renewing the lease of run {handle.run_id!r} failed"

    proxy.cut()
    try:
        wait_until(lambda: failed in worker.log(), "a renewal to fail", worker)
        # What the lease was when the database went away.
        expires = run_of(handle.run_id).lease_expires_at
    finally:
        proxy.restore()

    assert expires is not None
    wait_until(
        lambda: run_of(handle.run_id).lease_expires_at > expires,
        "a renewal to get through once the database is back",
        worker,
    )
    wait_until(lambda: timezone.now() > expires, "the lease of the outage's time to pass")
    # The renewed lease holds: nothing to recover.
    assert default_engine.tick().recovered == 0
    assert run_of(handle.run_id).status == RunStatus.RUNNING

    Path(files["release"]).touch()
    pid = worker.process.pid if worker.process else None
    assert worker.result(handle) == {"steps": [f"A {pid}", f"B {pid}", f"C {pid}"]}
    # Exactly one worker ran each step, once.
    assert log_lines(files["log"]) == [f"A {pid}", f"B {pid}", f"C {pid}"]
    assert [name for _, name, _ in steps_of(handle.run_id)] == ["A", "B", "C"]
    assert f"lost the lease of run {handle.run_id!r}" not in worker.log()


def test_a_worker_whose_lease_lapsed_in_an_outage_stops_and_records_nothing(
    sending: tuple[Worker, Worker], proxy: TcpProxy, tmp_path: Path
) -> None:
    files = run_files(tmp_path)
    handle = long_step.dispatch(files)
    first = executor_of("B", files["log"], sending)
    second = next(worker for worker in sending if worker is not first)
    lost = f"lost the lease of run {handle.run_id!r}"

    proxy.cut()
    try:
        wait_until(lambda: lost in first.log(), "the first worker to give its lease up", first)
    finally:
        proxy.restore()

    expires = run_of(handle.run_id).lease_expires_at
    assert expires is not None
    wait_until(lambda: timezone.now() > expires, "the lease to lapse")
    assert default_engine.tick().recovered == 1
    first_pid, second_pid = (w.process.pid if w.process else None for w in (first, second))
    wait_until(
        lambda: log_lines(files["log"])[2:] == [f"B {second_pid}"],
        "the second worker to begin B",
        *sending,
    )

    # Both workers' B return; the first stops at its next durable call.
    Path(files["release"]).touch()
    assert second.result(handle) == {
        "steps": [f"A {first_pid}", f"B {second_pid}", f"C {second_pid}"]
    }
    # A solo worker answers a ping only once its task has returned.
    wait_until(
        lambda: app.control.ping(destination=[first.hostname], timeout=0.5),
        "the first worker to end its turn",
        first,
    )
    assert log_lines(files["log"]) == [
        f"A {first_pid}",
        f"B {first_pid}",
        f"B {second_pid}",
        f"C {second_pid}",
    ]
    assert steps_of(handle.run_id) == [
        (0, "A", f"A {first_pid}"),
        (1, "B", f"B {second_pid}"),
        (2, "C", f"C {second_pid}"),
    ]
    assert run_of(handle.run_id).status == RunStatus.COMPLETED


def test_a_turn_that_cannot_write_its_step_is_recovered_once_its_lease_lapses(
    sending: tuple[Worker, Worker], proxy: TcpProxy, tmp_path: Path
) -> None:
    files = run_files(tmp_path)
    handle = long_step.dispatch(files)
    first = executor_of("B", files["log"], sending)
    first_pid = first.process.pid if first.process else None

    proxy.cut()
    try:
        # B returns while the database is away: its record, and the turn's end, fail.
        Path(files["release"]).touch()
        wait_until(
            lambda: app.control.ping(destination=[first.hostname], timeout=0.5),
            "the first worker to end its turn",
            first,
        )
        run = run_of(handle.run_id)
        assert (run.status, run.lease_owner != "") == (RunStatus.RUNNING, True)
        assert run.lease_expires_at is not None
        wait_until(lambda: timezone.now() > run.lease_expires_at, "the lease to lapse")
    finally:
        proxy.restore()

    # The run did not fail for want of its database: the tick hands it on.
    assert default_engine.tick().recovered == 1
    output = sending[0].result(handle)
    pids = [line.split()[1] for line in log_lines(files["log"])]
    assert [line.split()[0] for line in log_lines(files["log"])] == ["A", "B", "B", "C"]
    assert pids[:2] == [str(first_pid)] * 2
    assert output == {"steps": [f"A {first_pid}", f"B {pids[2]}", f"C {pids[3]}"]}
