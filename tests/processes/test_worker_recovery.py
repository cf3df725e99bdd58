"""Durable execution on real Celery workers on a real broker: no eager mode, no mocks.

Every test runs on Redis, and on PostgreSQL on RabbitMQ as well (the ``broker`` fixture,
``tests/brokers.py``; RabbitMQ's variants do not depend on the database).

Workers are subprocesses (``tests/worker.py``) given DURABLE options of their own
(``DURABLE_TEST_DURABLE``): they send what they start or wake to their queue, and hold
runs under a 2-second lease. Every step of the workflows (``tests/recovery_workflows.py``)
appends its name to a log file of its run, so the tests count what really ran.

Waits are polls with deadlines; nothing asserts how long anything took.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from django.utils import timezone

from durable_django import ConcurrencyLimitError, RunStatus
from durable_django import engine as default_engine
from durable_django.engines import send_run
from durable_django.models import Run, Signal
from durable_django.stores.base import StepRecord

from ..brokers import Broker
from ..celery_app import app
from ..helpers import run_of, status_is, steps_of
from ..recovery_workflows import (
    abc,
    hold_file,
    log_lines,
    once,
    parent,
    sleeper,
    step_then_block,
    transaction_then_block,
    waiter,
)
from ..worker import Worker, running_worker, unique_queue, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

#: The lease of every worker here, and of the test process's engine.
LEASE_SECONDS = 2
WORKFLOWS = ["tests.recovery_workflows"]


def durable_options(queue: str) -> dict[str, Any]:
    """DURABLE settings that send runs to ``queue`` and hold them under a short lease."""
    return {"ENQUEUE": True, "QUEUE": queue, "LEASE_SECONDS": LEASE_SECONDS}


def worker_env(queue: str) -> dict[str, str]:
    return {"DURABLE_TEST_DURABLE": json.dumps(durable_options(queue))}


def recovery_worker(queue: str) -> Worker:
    """A worker on ``queue`` (not started) with the recovery workflows and options."""
    return Worker(queue, include=WORKFLOWS, env=worker_env(queue))


def run_files(tmp_path: Path, name: str) -> dict[str, str]:
    """The input naming a run's side-effect log and its blocking steps' release file."""
    return {"log": str(tmp_path / f"{name}.log"), "release": str(tmp_path / f"{name}.release")}


def wait_lease_lapsed(run_id: str) -> None:
    """Return once the run's lease has lapsed (its worker can no longer renew it)."""
    expires = run_of(run_id).lease_expires_at
    assert expires is not None
    wait_until(
        lambda: timezone.now() > expires + datetime.timedelta(milliseconds=50),
        "the lease to lapse",
    )
    # Nobody renewed it meanwhile.
    assert run_of(run_id).lease_expires_at == expires


def kill_group(worker: Worker, signum: int) -> None:
    """Send ``signum`` to the worker's whole process group."""
    assert worker.process is not None
    os.killpg(worker.process.pid, signum)


def run_row_is_free(run_id: str) -> bool:
    """Whether the run's row (on SQLite, the database) can be write-locked at once."""
    if connection.vendor == "sqlite":
        probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()
        return True
    try:
        with transaction.atomic():
            rows = Run.objects.select_for_update(nowait=True).filter(pk=run_id)
            list(rows.values_list("pk", flat=True))
    except DatabaseError:
        return False
    return True


def stall(worker: Worker, run_id: str) -> None:
    """Stop the worker's processes, at a moment it holds no lock (its lease renewal
    writes to the run every third of the lease)."""
    for _ in range(50):
        kill_group(worker, signal.SIGSTOP)
        if run_row_is_free(run_id):
            return
        kill_group(worker, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"{worker!r} never stopped outside a transaction")


@pytest.fixture(scope="module")
def worker(django_db_setup: None, broker: Broker) -> Iterator[Worker]:
    """A worker on a queue of its own for the module; stopped before the database goes."""
    queue = unique_queue("durable-recovery")
    try:
        with running_worker(queue, include=WORKFLOWS, env=worker_env(queue)) as running:
            yield running
    finally:
        broker.delete_queue(queue)


@pytest.fixture
def sending(worker: Worker) -> Iterator[Worker]:
    """Starts, wakes and signals send their runs to the module worker's queue."""
    with override_settings(DURABLE=durable_options(worker.queue)):
        yield worker


@pytest.fixture
def own_queue(broker: Broker) -> Iterator[str]:
    """A fresh queue, for a test that starts (and kills) workers of its own."""
    queue = unique_queue("durable-recovery-own")
    try:
        with override_settings(DURABLE=durable_options(queue)):
            yield queue
    finally:
        broker.delete_queue(queue)


# a dead worker ------------------------------------------------------------------------


def test_a_run_whose_worker_is_killed_mid_step_is_finished_by_another(
    own_queue: str, tmp_path: Path
) -> None:
    quota = {"key": f"recovery:{uuid.uuid4().hex}", "limit": 1}
    files = run_files(tmp_path, "run")
    first = recovery_worker(own_queue)
    try:
        first.start()
        handle = abc.dispatch(files, concurrency=quota)
        wait_until(lambda: log_lines(files["log"]) == ["A", "B"], "step B to begin", first)
        kill_group(first, signal.SIGKILL)
        assert first.process is not None
        first.process.wait()
    finally:
        first.stop()
        first.discard_log()

    # The dead worker still holds the run, and the run its quota slot.
    run = run_of(handle.run_id)
    assert run.status == RunStatus.RUNNING
    assert run.lease_owner
    assert run.lease_expires_at is not None
    with pytest.raises(ConcurrencyLimitError):
        once.dispatch(run_files(tmp_path, "refused"), concurrency=quota)
    # Until the lease lapses, no tick hands the run on.
    assert default_engine.tick(now=run.lease_expires_at).total == 0
    assert run_of(handle.run_id).status == RunStatus.RUNNING

    Path(files["release"]).touch()
    with running_worker(own_queue, include=WORKFLOWS, env=worker_env(own_queue)) as second:
        wait_lease_lapsed(handle.run_id)
        ticked = default_engine.tick()
        assert (ticked.recovered, ticked.total) == (1, 1)
        assert second.result(handle) == {"steps": ["A", "B", "C"]}

    run = run_of(handle.run_id)
    assert run.status == RunStatus.COMPLETED
    assert (run.lease_owner, run.lease_expires_at) == ("", None)
    # A ran once and was replayed; B ran in the killed attempt and again; C once.
    assert log_lines(files["log"]) == ["A", "B", "B", "C"]
    assert steps_of(handle.run_id) == [(0, "A", "A"), (1, "B", "B"), (2, "C", "C")]
    # The slot freed when the run ended.
    assert once.dispatch(run_files(tmp_path, "after"), concurrency=quota).created


@pytest.mark.parametrize(
    ("workflow", "ran", "rows"),
    [
        # Committed with its record: the next worker replays it.
        (transaction_then_block, ["W", "body", "body", "C"], 1),
        # Its record was still to be written: the next worker runs it again.
        (step_then_block, ["W", "body", "W", "body", "C"], 2),
    ],
    ids=["transaction", "step"],
)
def test_a_worker_killed_after_a_transactional_steps_commit_does_not_write_again(
    own_queue: str, tmp_path: Path, workflow: Any, ran: list[str], rows: int
) -> None:
    files = run_files(tmp_path, "run")
    first = recovery_worker(own_queue)
    try:
        first.start()
        handle = workflow.dispatch(files)
        wait_until(lambda: log_lines(files["log"]) == ["W", "body"], "the body to block", first)
        kill_group(first, signal.SIGKILL)
        assert first.process is not None
        first.process.wait()
    finally:
        first.stop()
        first.discard_log()

    Path(files["release"]).touch()
    with running_worker(own_queue, include=WORKFLOWS, env=worker_env(own_queue)) as second:
        wait_lease_lapsed(handle.run_id)
        assert default_engine.tick().recovered == 1
        assert second.result(handle) == {"done": True}

    assert log_lines(files["log"]) == ran
    assert Signal.objects.filter(token=f"written:{files['log']}").count() == rows
    assert steps_of(handle.run_id) == [(0, "W", "W"), (1, "C", "C")]


def test_a_stalled_worker_that_lost_its_lease_records_nothing_when_it_resumes(
    own_queue: str, tmp_path: Path
) -> None:
    files = run_files(tmp_path, "run")
    with running_worker(own_queue, include=WORKFLOWS, env=worker_env(own_queue)) as first:
        handle = abc.dispatch(files)
        wait_until(lambda: log_lines(files["log"]) == ["A", "B"], "step B to begin", first)
        stall(first, handle.run_id)
        try:
            with running_worker(own_queue, include=WORKFLOWS, env=worker_env(own_queue)) as second:
                assert second.process is not None
                # Once released, the second worker's B waits until the first one is done.
                hold = Path(hold_file(files["release"], second.process.pid))
                hold.touch()
                wait_lease_lapsed(handle.run_id)
                assert default_engine.tick().recovered == 1
                wait_until(
                    lambda: log_lines(files["log"]) == ["A", "B", "B"],
                    "the second worker to begin B",
                    second,
                )
                # The first worker wakes up in B, which returns at once.
                kill_group(first, signal.SIGCONT)
                Path(files["release"]).touch()
                # A solo worker answers a ping only once its task has returned.
                wait_until(
                    lambda: app.control.ping(destination=[first.hostname], timeout=0.5),
                    "the first worker to end its turn",
                    first,
                )
                assert steps_of(handle.run_id) == [(0, "A", "A")]
                assert run_of(handle.run_id).status == RunStatus.RUNNING
                hold.unlink()
                assert second.result(handle) == {"steps": ["A", "B", "C"]}
        finally:
            kill_group(first, signal.SIGCONT)

    assert log_lines(files["log"]) == ["A", "B", "B", "C"]
    assert steps_of(handle.run_id) == [(0, "A", "A"), (1, "B", "B"), (2, "C", "C")]


# lost and duplicated messages ---------------------------------------------------------


def test_a_lost_message_is_sent_again_by_the_tick(
    own_queue: str, broker: Broker, tmp_path: Path
) -> None:
    files = run_files(tmp_path, "lost")
    handle = once.dispatch(files)
    assert broker.queued_run_ids(own_queue) == [handle.run_id]
    broker.drop_messages(own_queue)

    with running_worker(own_queue, include=WORKFLOWS, env=worker_env(own_queue)) as worker:
        # Nothing happens: a run sent after it is done, and it is still pending.
        marker = once.dispatch(run_files(tmp_path, "marker"))
        assert worker.result(marker) == {"steps": ["A", "B"]}
        assert run_of(handle.run_id).status == RunStatus.PENDING
        assert log_lines(files["log"]) == []
        # Too early: the tick leaves a recently sent run alone.
        assert default_engine.tick().total == 0

        resend_seconds = default_engine.config.pending_resend_seconds
        later = timezone.now() + datetime.timedelta(seconds=resend_seconds + 1)
        ticked = default_engine.tick(now=later)
        assert (ticked.resent, ticked.total) == (1, 1)
        assert worker.result(handle) == {"steps": ["A", "B"]}

    assert log_lines(files["log"]) == ["A", "B"]
    assert steps_of(handle.run_id) == [(0, "A", "A"), (1, "B", "B")]


def test_a_process_killed_before_its_sender_thread_sent_leaves_the_run_to_the_tick(
    own_queue: str, broker: Broker, tmp_path: Path
) -> None:
    """The window between a start's commit and its message leaving, held open: a
    process whose sender thread never gets to send is killed (``SIGKILL``: no exit
    handler runs). Its run is committed and pending, no message was sent, and the tick
    sends it; a worker executes it once."""
    files = run_files(tmp_path, "killed")
    script = f"""
import os, signal, sys, threading, django
django.setup()
import tests.celery_app
from django.test import override_settings
from durable_django._runtime import sending
sending._sender = sending.Sender(lambda items: threading.Event().wait())  # never sends
from tests.recovery_workflows import once
with override_settings(DURABLE={durable_options(own_queue)!r}):
    handle = once.dispatch({files!r})
assert sending.sender().handed == 1
print(handle.run_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=recovery_worker(own_queue).environment(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    run_id = done.stdout.strip()
    assert run_of(run_id).status == RunStatus.PENDING
    assert broker.queued_count(own_queue) == 0

    with running_worker(own_queue, include=WORKFLOWS, env=worker_env(own_queue)) as worker:
        resend_seconds = default_engine.config.pending_resend_seconds
        later = timezone.now() + datetime.timedelta(seconds=resend_seconds + 1)
        assert default_engine.tick(now=later).resent == 1
        wait_until(status_is(run_id, RunStatus.COMPLETED), "the run to complete", worker)

    assert log_lines(files["log"]) == ["A", "B"]


def test_a_duplicated_message_executes_the_run_once(sending: Worker, tmp_path: Path) -> None:
    files = run_files(tmp_path, "twice")
    with transaction.atomic():
        handle = once.dispatch(files)
        default_engine.store.on_commit(lambda: send_run(handle.run_id, sending.queue))

    assert sending.result(handle) == {"steps": ["A", "B"]}
    # The worker takes messages in order: once this run is done, it has seen both.
    assert sending.result(once.dispatch(run_files(tmp_path, "marker"))) == {"steps": ["A", "B"]}
    assert log_lines(files["log"]) == ["A", "B"]
    assert steps_of(handle.run_id) == [(0, "A", "A"), (1, "B", "B")]
    assert run_of(handle.run_id).status == RunStatus.COMPLETED


def test_a_message_the_broker_delivers_twice_executes_the_run_once(
    own_queue: str, broker: Broker, tmp_path: Path
) -> None:
    files = run_files(tmp_path, "delivered-twice")
    handle = once.dispatch(files)
    broker.duplicate_oldest(own_queue)
    assert broker.queued_run_ids(own_queue) == [handle.run_id, handle.run_id]
    marker = once.dispatch(run_files(tmp_path, "marker"))

    with running_worker(own_queue, include=WORKFLOWS, env=worker_env(own_queue)) as worker:
        # The worker takes messages in order: once the marker is done, it has seen both.
        assert worker.result(marker) == {"steps": ["A", "B"]}
        assert worker.result(handle) == {"steps": ["A", "B"]}
        assert broker.queued_count(own_queue) == 0

    assert log_lines(files["log"]) == ["A", "B"]
    assert steps_of(handle.run_id) == [(0, "A", "A"), (1, "B", "B")]


# sleep, signals and children ----------------------------------------------------------


def test_a_sleeping_run_holds_no_worker_and_the_tick_wakes_it(
    sending: Worker, tmp_path: Path
) -> None:
    files = run_files(tmp_path, "sleeper")
    handle = sleeper.dispatch({**files, "seconds": 1})
    wait_until(status_is(handle.run_id, RunStatus.SUSPENDED), "the run to sleep", sending)
    run = run_of(handle.run_id)
    assert run.wake_at is not None
    assert run.lease_owner == ""

    # The worker is free meanwhile: it executes another run while this one sleeps.
    assert sending.result(once.dispatch(run_files(tmp_path, "other"))) == {"steps": ["A", "B"]}
    assert run_of(handle.run_id).status == RunStatus.SUSPENDED
    # A tick before the time wakes nothing.
    early = default_engine.tick(now=run.wake_at - datetime.timedelta(milliseconds=1))
    assert early.total == 0

    woken = 0

    def ticked_until_settled() -> bool:
        nonlocal woken
        woken += default_engine.tick().woken
        return run_of(handle.run_id).status in (RunStatus.COMPLETED, RunStatus.FAILED)

    wait_until(ticked_until_settled, "the tick to wake the run and the worker to end it", sending)
    assert woken == 1
    assert sending.result(handle) == {"slept": 1}
    assert log_lines(files["log"]) == ["A", "B"]
    assert [name for _, name, _ in steps_of(handle.run_id)] == ["A", "durable.sleep", "B"]


def test_a_signal_wakes_a_waiting_run(sending: Worker, tmp_path: Path) -> None:
    token = f"approve:{uuid.uuid4().hex}"
    files = run_files(tmp_path, "waiter")
    handle = waiter.dispatch({**files, "token": token})
    wait_until(status_is(handle.run_id, RunStatus.SUSPENDED), "the run to wait", sending)
    assert run_of(handle.run_id).wait == {"signal": token}

    default_engine.signal(token, {"approved": True})

    assert sending.result(handle) == {"got": {"approved": True}}
    assert log_lines(files["log"]) == ["A", "B"]
    assert not default_engine.store.has_signal(token)


def test_a_signal_sent_before_the_wait_is_kept_for_it(sending: Worker, tmp_path: Path) -> None:
    token = f"early:{uuid.uuid4().hex}"
    default_engine.signal(token, "early")
    assert default_engine.store.has_signal(token)

    files = run_files(tmp_path, "waiter")
    handle = waiter.dispatch({**files, "token": token})

    assert sending.result(handle) == {"got": "early"}
    assert log_lines(files["log"]) == ["A", "B"]
    assert not default_engine.store.has_signal(token)


def test_a_parent_waits_for_its_child_and_is_woken_by_it(sending: Worker, tmp_path: Path) -> None:
    files = run_files(tmp_path, "family")
    handle = parent.dispatch(files)
    child_id = f"{handle.run_id}/1"
    wait_until(lambda: log_lines(files["log"]) == ["before", "child"], "the child's step", sending)

    # The parent waits, holding no worker; the single worker executes the child.
    wait_until(status_is(handle.run_id, RunStatus.SUSPENDED), "the parent to wait", sending)
    assert run_of(handle.run_id).wait == {"child": child_id}
    child = run_of(child_id)
    assert (child.status, child.parent_id) == (RunStatus.RUNNING, handle.run_id)

    # No tick from here on: the child's end wakes the parent.
    Path(files["release"]).touch()

    assert sending.result(handle) == {"from_child": {"child_of": handle.run_id, "value": 7}}
    assert run_of(child_id).status == RunStatus.COMPLETED
    assert log_lines(files["log"]) == ["before", "child", "after"]


# cancel -------------------------------------------------------------------------------


def test_a_run_cancelled_mid_step_frees_its_slot_and_records_nothing_more(
    sending: Worker, tmp_path: Path
) -> None:
    quota = {"key": f"recovery:{uuid.uuid4().hex}", "limit": 1}
    files = run_files(tmp_path, "cancelled")
    handle = abc.dispatch(files, concurrency=quota)
    wait_until(lambda: log_lines(files["log"]) == ["A", "B"], "step B to begin", sending)
    with pytest.raises(ConcurrencyLimitError):
        once.dispatch(run_files(tmp_path, "refused"), concurrency=quota)

    assert default_engine.cancel(handle.run_id)

    # The slot is free at once, while the worker is still in step B.
    assert run_of(handle.run_id).status == RunStatus.CANCELLED
    after = once.dispatch(run_files(tmp_path, "after"), concurrency=quota)
    assert after.created
    assert log_lines(files["log"]) == ["A", "B"]

    Path(files["release"]).touch()
    # The worker takes messages in order: once the next run is done, B has returned.
    assert sending.result(after) == {"steps": ["A", "B"]}

    run = run_of(handle.run_id)
    assert run.status == RunStatus.CANCELLED
    assert run.error == {"type": "cancelled", "message": "cancelled"}
    assert run.output is None
    assert log_lines(files["log"]) == ["A", "B"]
    assert default_engine.store.get_steps(handle.run_id) == [StepRecord(0, "A", result="A")]
