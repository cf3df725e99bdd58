"""Celery's tooling on Redis, with a real worker: ``task-sent`` events, ``inspect
active`` names the workflow, a soft time limit after a step hands the run back, a
revoked message cancels its run."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from durable_django._runtime.publishing import TASK_NAME
from durable_django.engines import default_engine

from ..brokers import Broker
from ..celery_app import app
from ..tooling_workflows import four_steps, held
from ..worker import Worker, running_worker, sent, unique_queue, wait_until
from ..worker_workflows import total

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


# events (on Redis: a test process that switches brokers keeps RabbitMQ's events apart)


def test_task_sent_events_are_sent_when_the_app_sends_them(
    redis_broker: Broker, configured: Any
) -> None:
    configured(task_send_sent_event=True)
    idle_queue = unique_queue("durable-events")
    events: list[dict[str, Any]] = []
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"task-sent": events.append})
        # listening before the start (on Redis, subscribed by a first wait for events)
        with receiver.consumer_context(wakeup=False) as (conn, _channel, _consumers):
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.2)
            with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": idle_queue}):
                handle = total.dispatch({"a": 1, "b": 2})
            sent()
            for _ in range(20):
                if events:
                    break
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.5)
    [event] = events
    assert event["name"] == TASK_NAME
    assert event["queue"] == idle_queue
    assert handle.run_id in event["args"]
    redis_broker.delete_queue(idle_queue)


@pytest.fixture(scope="module")
def tooling_worker(django_db_setup: None, redis_broker: Broker) -> Iterator[Worker]:
    queue = unique_queue("durable-tooling")
    try:
        with running_worker(queue, include=["tests.tooling_workflows"], pool="threads") as running:
            yield running
    finally:
        redis_broker.delete_queue(queue)


def test_inspect_active_names_the_workflow(tooling_worker: Worker) -> None:
    release = os.path.join(tempfile.gettempdir(), f"durable-release-{uuid.uuid4().hex}")
    with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": tooling_worker.queue}):
        handle = held.dispatch({"release": release})
    try:
        inspector = app.control.inspect(destination=[tooling_worker.hostname], timeout=1)
        [active] = wait_until(
            lambda: (inspector.active() or {}).get(tooling_worker.hostname),
            "the run in inspect active",
            tooling_worker,
        )
    finally:
        open(release, "w").close()
    assert active["name"] == "tests.tooling.held"
    assert active["type"] == TASK_NAME
    assert active["args"] == [handle.run_id] or handle.run_id in str(active["args"])
    assert tooling_worker.result(handle) == "released"
    os.unlink(release)


# time limits ------------------------------------------------------------------------


def test_a_soft_time_limit_between_steps_hands_the_run_back(redis_broker: Broker) -> None:
    """Four 1.2 s steps under a 3 s soft time limit: each turn that runs out of time
    after a step is handed back, and the run completes over several turns."""
    queue = unique_queue("durable-soft-limit")
    try:
        with (
            running_worker(
                queue,
                include=["tests.tooling_workflows"],
                pool="prefork",
                options=["--soft-time-limit=3"],
                # the worker sends the runs it hands back
                env={"DURABLE_TEST_DURABLE": json.dumps({"ENQUEUE": True, "QUEUE": queue})},
            ) as limited,
            override_settings(DURABLE={"ENQUEUE": True, "QUEUE": queue}),
        ):
            handle = four_steps.dispatch({"seconds": 1.2})
            assert limited.result(handle) == 4.8
    finally:
        redis_broker.delete_queue(queue)
    steps = default_engine.store.get_steps(handle.run_id)
    assert [step.name for step in steps] == [f"pause {n}" for n in range(4)]
    assert all(step.error is None for step in steps)


# revoke ------------------------------------------------------------------------------


def test_revoke_terminate_cancels_the_run_and_frees_its_slot(redis_broker: Broker) -> None:
    queue = unique_queue("durable-revoke")
    release = os.path.join(tempfile.gettempdir(), f"durable-release-{uuid.uuid4().hex}")
    quota = {"key": f"tenant:{uuid.uuid4().hex}", "limit": 1}
    try:
        with (
            running_worker(queue, include=["tests.tooling_workflows"], pool="prefork") as worker,
            override_settings(DURABLE={"ENQUEUE": True, "QUEUE": queue}),
        ):
            handle = held.dispatch({"release": release}, concurrency=quota)
            inspector = app.control.inspect(destination=[worker.hostname], timeout=1)
            [active] = wait_until(
                lambda: (inspector.active() or {}).get(worker.hostname),
                "the run in inspect active",
                worker,
            )
            app.control.revoke(active["id"], terminate=True)
            wait_until(lambda: handle.status == "cancelled", "the run cancelled", worker)
            # its slot is free
            held.dispatch({"release": release}, concurrency=quota)
    finally:
        open(release, "w").close()
        os.unlink(release)
        redis_broker.delete_queue(queue)
