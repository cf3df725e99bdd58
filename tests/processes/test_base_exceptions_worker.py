"""A step calling ``sys.exit()`` on a real Celery worker (Redis), solo and prefork: the
step fails, the run ends ``failed`` with ``builtins.SystemExit`` and frees its slot, and
the worker (and its pool process) lives on to run the next run. A pool process ended by
a signal while a step runs is the worker's business: the run is not failed for it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from durable_django import RunFailed, RunStatus
from durable_django import engine as default_engine

from ..brokers import Broker
from ..celery_app import app
from ..exit_workflows import blocks, leaves
from ..worker import Worker, running_worker, unique_queue, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module", params=["solo", "prefork"])
def worker(request: pytest.FixtureRequest, django_db_setup: None, redis_broker: Broker) -> Any:
    """A worker of each pool on a queue of its own (one pool process for prefork)."""
    queue = unique_queue("durable-exit")
    try:
        with running_worker(queue, include=["tests.exit_workflows"], pool=request.param) as running:
            yield running
    finally:
        redis_broker.delete_queue(queue)


@pytest.fixture
def sending(worker: Worker) -> Iterator[Worker]:
    with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": worker.queue}):
        yield worker


def pool_processes(worker: Worker) -> list[int]:
    """The pids of the worker's pool processes (the worker's own pid for solo)."""
    stats = app.control.inspect(destination=[worker.hostname], timeout=5).stats()
    assert stats, f"{worker!r} did not answer:\n{worker.log()}"
    return list(stats[worker.hostname]["pool"]["processes"])


def test_a_step_calling_sys_exit_fails_the_run_and_the_worker_lives_on(sending: Worker) -> None:
    before = pool_processes(sending)
    handle = leaves.dispatch({"exit": True})

    with pytest.raises(RunFailed) as caught:
        sending.result(handle)

    error = caught.value.error
    assert (error["type"], error["message"], error["step"]) == ("builtins.SystemExit", "3", "leave")
    run = default_engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED and not run.lease_owner
    assert sending.process is not None and sending.process.poll() is None, sending.log()
    assert pool_processes(sending) == before  # the same pool process, not a replacement
    # The key's one slot is free: the next start is admitted, and the same worker runs it.
    assert sending.result(leaves.dispatch({"exit": False})) == "started"
    assert pool_processes(sending) == before


@pytest.mark.parametrize("worker", ["prefork"], indirect=True)
def test_a_pool_process_ended_by_a_signal_does_not_fail_the_run(sending: Worker) -> None:
    """billiard ends a pool process on SIGTERM (``revoke(terminate=True)``, a cold
    shutdown) by raising ``SystemExit`` through the step that runs: the worker's
    shutdown, not the step's failure. The run stays ``running`` under its lease, which
    lapses for the tick to hand it on."""
    [child] = pool_processes(sending)
    handle = blocks.dispatch({"seconds": 60})
    wait_until(
        lambda: [s.name for s in default_engine.store.get_steps(handle.run_id)] == ["mark"],
        "the run to record its first step",
        sending,
    )
    os.kill(child, signal.SIGTERM)
    replaced = wait_until(
        lambda: (pids := pool_processes(sending)) != [child] and pids,
        "the pool process to be replaced",
        sending,
    )
    assert child not in replaced
    run = default_engine.get_run(handle.run_id)
    assert (run.status, run.error) == (RunStatus.RUNNING, None), sending.log()
    assert [s.name for s in default_engine.store.get_steps(handle.run_id)] == ["mark"]
    assert default_engine.cancel(handle.run_id)
