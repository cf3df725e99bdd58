"""Django's tasks framework (Django >= 6.0) on the durable task backend, executed by a real
Celery worker on a real broker, seen through Django's public task API only (``@task``,
``enqueue``, ``get_result``, ``TaskResult.refresh``).

Skipped only on a Django without ``django.tasks``: the newest-Python job of scripts/test
runs them on Django 6.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django.tasks", reason="Django before 6.0 has no tasks framework")

from django.conf import settings
from django.db import connection
from django.tasks import TaskResult, TaskResultStatus
from django.test import override_settings
from django.utils import timezone

from durable_django import ConcurrencyLimitError
from durable_django import engine as default_engine

from .. import django_task_functions as tasks
from ..brokers import Broker
from ..worker import ROOT, WAIT, Worker, running_worker, unique_queue, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def signal_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file the worker appends the task signals it sends to."""
    return tmp_path_factory.mktemp("task-signals") / "signals.jsonl"


@pytest.fixture(scope="module")
def worker(django_db_setup: None, broker: Broker, signal_log: Path) -> Iterator[Worker]:
    """A worker consuming a queue of its own, for every test of the module, recording the
    task signals it sends (tests/django_task_signals.py)."""
    queue = unique_queue("durable-test-djtasks")
    try:
        with running_worker(
            queue,
            include=["tests.django_task_signals"],
            env={"DURABLE_TEST_TASK_SIGNALS": str(signal_log)},
        ) as running:
            yield running
    finally:
        broker.delete_queue(queue)


@pytest.fixture
def sending(worker: Worker) -> Iterator[Worker]:
    """Enqueued tasks are sent to the worker's queue."""
    with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": worker.queue}):
        yield worker


def settled(
    result: TaskResult[Any, Any],
    worker: Worker,
    statuses: tuple[str, ...] = ("SUCCESSFUL", "FAILED"),
    between: Callable[[], Any] = lambda: None,
) -> TaskResult[Any, Any]:
    """``result`` refreshed until its status is one of ``statuses`` (calling ``between``
    after each look); fails with the worker's log after WAIT."""
    deadline = time.monotonic() + WAIT
    while True:
        result.refresh()
        if result.status in statuses:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(
                f"task {result.id} is {result.status}, not {statuses}, after {WAIT}s; "
                f"log of {worker!r}:\n{worker.log()}"
            )
        between()
        time.sleep(0.05)


def signals_of(log: Path, result_id: str) -> list[tuple[str, str, str]]:
    """The task signals the worker sent for ``result_id``: (signal, sender, status)."""
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [(x["signal"], x["sender"], x["status"]) for x in lines if x["id"] == result_id]


def handling_of(log: Path, result_id: str) -> list[str | None]:
    """The exception each task signal of ``result_id`` was sent while handling, if any."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [x["handling"] for x in lines if x["id"] == result_id]


BACKEND = "durable_django.django_tasks.DurableTaskBackend"


def test_tasks_run_on_the_worker_and_send_their_signals(sending: Worker, signal_log: Path) -> None:
    added = tasks.add.enqueue(20, b=22)
    failed = tasks.fail.enqueue("no data for March")
    doubled = tasks.double.enqueue(21)
    who = tasks.whoami.enqueue("worker")

    assert settled(added, sending).return_value == 42
    assert settled(doubled, sending).return_value == 42
    assert settled(who, sending).return_value == {"id": who.id, "label": "worker", "attempt": 1}
    settled(failed, sending)
    assert failed.status == TaskResultStatus.FAILED
    [error] = failed.errors
    assert error.exception_class is tasks.ReportFailed
    assert "ReportFailed: no data for March" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value
    for result in (added, doubled, who, failed):
        assert result.enqueued_at <= result.started_at <= result.finished_at
        assert len(result.worker_ids) == 1
    # task_started and task_finished are sent by the worker that executes the task.
    assert signals_of(signal_log, added.id) == [
        ("started", BACKEND, "RUNNING"),
        ("finished", BACKEND, "SUCCESSFUL"),
    ]
    assert signals_of(signal_log, failed.id) == [
        ("started", BACKEND, "RUNNING"),
        ("finished", BACKEND, "FAILED"),
    ]
    # task_finished of a failure is sent as it is handled, as Django's backends send it:
    # Django's log line of it carries the exception.
    assert handling_of(signal_log, failed.id) == [None, "tests.django_task_functions.ReportFailed"]
    assert handling_of(signal_log, added.id) == [None, None]


def test_a_task_goes_from_ready_to_running_to_successful(sending: Worker, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    result = tasks.gated.enqueue(str(gate), uuid.uuid4().hex, 7)
    assert result.status == TaskResultStatus.READY
    try:
        settled(result, sending, ("RUNNING",))
        assert result.started_at is not None and result.finished_at is None
        with pytest.raises(ValueError, match="not finished"):
            _ = result.return_value
    finally:
        gate.touch()
    settled(result, sending)
    assert (result.status, result.return_value) == ("SUCCESSFUL", 7)


def test_a_limit_of_k_admits_exactly_k_of_n_parallel_enqueues(
    sending: Worker, tmp_path: Path
) -> None:
    gate, key = tmp_path / "gate", uuid.uuid4().hex
    n, limit = 8, 2  # the limit of tests.django_task_functions.gated in TASKS
    barrier = threading.Barrier(n)
    admitted: list[TaskResult[Any, Any]] = []
    refused: list[ConcurrencyLimitError] = []
    unexpected: list[BaseException] = []

    def enqueue(value: int) -> None:
        try:
            barrier.wait(WAIT)
            admitted.append(tasks.gated.enqueue(str(gate), key, value))
        except ConcurrencyLimitError as error:
            refused.append(error)
        except BaseException as error:  # reported below
            unexpected.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=enqueue, args=(value,)) for value in range(n)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert unexpected == []
        assert (len(admitted), len(refused)) == (limit, n - limit)
        assert {(e.key, e.limit, e.active) for e in refused} == {(f"gated:{key}", limit, limit)}
        assert default_engine.count_runs(tag=f"concurrency:gated:{key}") == limit
    finally:
        gate.touch()
    values = sorted(settled(result, sending).return_value for result in admitted)
    assert len(values) == limit
    # Their slots freed, the key takes new tasks again.
    assert settled(tasks.gated.enqueue(str(gate), key, 99), sending).return_value == 99


def test_get_result_reads_the_task_from_another_process(sending: Worker) -> None:
    result = settled(tasks.add.enqueue(1, b=2), sending)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DURABLE_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
    }
    read = subprocess.run(
        [sys.executable, "-m", "tests.task_result_reader", result.id],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    seen = json.loads(read.stdout.strip().splitlines()[-1])
    assert seen["pid"] != os.getpid()
    assert {k: seen[k] for k in ("id", "status", "task", "args", "kwargs", "return_value")} == {
        "id": result.id,
        "status": "SUCCESSFUL",
        "task": "tests.django_task_functions.add",
        "args": [1],
        "kwargs": {"b": 2},
        "return_value": 3,
    }
    assert seen["finished"] is True


def test_run_after_defers_the_task_on_a_durable_timer(sending: Worker) -> None:
    run_after = timezone.now() + datetime.timedelta(seconds=2)
    result = tasks.add.using(run_after=run_after).enqueue(5, 5)

    # The worker takes the run and parks it on its timer; the task has not started.
    deadline = time.monotonic() + WAIT
    while default_engine.get_run(result.id).status != "suspended":
        assert time.monotonic() < deadline, sending.log()
        time.sleep(0.05)
    result.refresh()
    assert (result.status, result.started_at) == ("READY", None)
    # The tick (Celery beat, or `manage.py durable tick`, in production) wakes it when due.
    settled(result, sending, between=default_engine.tick)
    assert result.return_value == 10
    assert result.started_at >= run_after
    assert result.task.run_after == run_after


# a worker that dies, a queue of its own ---------------------------------------------------

#: The lease of the workers below, and of this process's engine: a dead worker's task is
#: handed on a couple of seconds later.
LEASE_SECONDS = 2


def lease_lapsed(run_id: str) -> bool:
    run = default_engine.get_run(run_id)
    return run.lease_expires_at is not None and run.lease_expires_at < timezone.now()


def test_a_task_whose_worker_died_is_handed_on_and_counts_both_workers(
    django_db_setup: None, broker: Broker, tmp_path: Path
) -> None:
    queue = unique_queue("durable-test-djtasks-dead")
    options = {"ENQUEUE": True, "QUEUE": queue, "LEASE_SECONDS": LEASE_SECONDS}
    env = {"DURABLE_TEST_DURABLE": json.dumps(options)}
    gate = tmp_path / "gate"
    try:
        with override_settings(DURABLE=options):
            first = Worker(queue, env=env)
            try:
                first.start()
                result = tasks.gated.enqueue(str(gate), uuid.uuid4().hex, 7)
                settled(result, first, ("RUNNING",))
                [dead] = result.worker_ids
                assert first.process is not None
                os.killpg(first.process.pid, signal.SIGKILL)  # the worker dies calling it
                first.process.wait()
            finally:
                first.stop()
                first.discard_log()
            gate.touch()
            with running_worker(queue, env=env) as second:
                wait_until(lambda: lease_lapsed(result.id), "the dead worker's lease to lapse")
                assert default_engine.tick().recovered == 1
                settled(result, second)
    finally:
        broker.delete_queue(queue)

    assert (result.status, result.return_value) == ("SUCCESSFUL", 7)
    # Django's attempts: the workers that processed the task; the start is the new one's.
    assert result.attempts == 2
    assert result.worker_ids[0] == dead and result.worker_ids[1] != dead
    assert result.started_at is not None and result.last_attempted_at == result.started_at
    assert result.started_at < result.finished_at


def test_a_task_on_a_queue_of_its_own_runs_on_that_queues_workers(
    django_db_setup: None, broker: Broker
) -> None:
    queue, elsewhere = unique_queue("durable-test-djtasks-q"), unique_queue("durable-test-none")
    queues = ["default", queue]
    env = {
        "DURABLE_TEST_DURABLE": json.dumps({"ENQUEUE": True, "QUEUE": elsewhere}),
        "DURABLE_TEST_TASK_QUEUES": json.dumps(queues),
    }
    tasks_setting = {"default": {**settings.TASKS["default"], "QUEUES": queues}}
    try:
        with (
            override_settings(DURABLE={"ENQUEUE": True, "QUEUE": elsewhere}, TASKS=tasks_setting),
            running_worker(queue, env=env) as worker,
        ):
            result = tasks.add.using(queue_name=queue).enqueue(2, 2)
            assert default_engine.get_run(result.id).queue == queue
            assert settled(result, worker).return_value == 4
            assert result.task.queue_name == queue
    finally:
        broker.delete_queue(queue)
        broker.delete_queue(elsewhere)
