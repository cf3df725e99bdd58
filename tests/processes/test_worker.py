"""Runs executed by a real Celery worker on a real broker: no eager mode, no mocks.

Every test runs on Redis, and on PostgreSQL on RabbitMQ as well (the ``broker`` fixture,
``tests/brokers.py``; RabbitMQ's variants do not depend on the database). A worker
subprocess (``tests/worker.py``) consumes a queue of its own for the whole module; the
tests that must see messages wait on the broker use a fresh queue nobody consumes, and
read it with the broker's own client.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from durable_django import ConcurrencyLimitError, Engine, RunFailed, RunStatus
from durable_django import engine as default_engine
from durable_django._rules.concurrency import quota_tag
from durable_django.models import Run, RunTag
from durable_django.stores.base import StepRecord
from tests.testapp.workflows import EchoWorkflow, plain

from ..brokers import Broker
from ..celery_app import app
from ..worker import Worker, running_worker, unique_queue
from ..worker_workflows import charge, total

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Rollback(Exception):
    """Raised to roll an ``atomic`` block back."""


@pytest.fixture(scope="module")
def worker(django_db_setup: None, broker: Broker) -> Iterator[Worker]:
    """A worker consuming a queue of its own, for every test of the module.

    It depends on ``django_db_setup`` so it is stopped before the test database goes.
    """
    queue = unique_queue("durable-test")
    try:
        with running_worker(queue, include=["tests.worker_workflows"]) as running:
            yield running
    finally:
        broker.delete_queue(queue)


@pytest.fixture
def sending(worker: Worker) -> Iterator[Worker]:
    """Starts send their runs to the worker's queue."""
    with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": worker.queue}):
        yield worker


@pytest.fixture
def remote_workflow(broker: Broker) -> Iterator[tuple[str, str]]:
    """A workflow registered here as remote, routed to a queue of its own."""
    token = uuid.uuid4().hex
    name, queue = f"tests.remote.{token}", f"remote-{token}"
    default_engine.register_remote(name, "1", queue=queue)
    try:
        yield name, queue
    finally:
        default_engine.registry.remove(name)
        broker.delete_queue(queue)


# execution ----------------------------------------------------------------------------


def test_dispatched_runs_are_executed_by_the_worker(sending: Worker) -> None:
    handles = [total.dispatch({"a": n, "b": 10}) for n in range(5)]

    assert [sending.result(handle) for handle in handles] == [{"total": n + 10} for n in range(5)]
    for n, handle in enumerate(handles):
        run = default_engine.get_run(handle.run_id)
        assert run.status == RunStatus.COMPLETED
        assert run.queue == sending.queue
        assert run.started_at is not None
        assert run.finished_at is not None
        assert default_engine.store.get_steps(handle.run_id) == [
            StepRecord(0, "add", result=n + 10)
        ]


def test_start_waits_for_the_worker_and_returns_the_output(sending: Worker) -> None:
    key = f"tenant:{uuid.uuid4().hex}"

    assert EchoWorkflow.start({"text": "hello", "key": key}, timeout=60) == {"echo": "HELLO"}
    assert plain.start([1, "two", None], timeout=60) == {"got": [1, "two", None]}
    # The finished run no longer holds its quota slot: the key takes its limit again.
    handles = [EchoWorkflow.dispatch({"text": str(n), "key": key}) for n in range(3)]
    assert [sending.result(handle) for handle in handles] == [{"echo": str(n)} for n in range(3)]


def test_a_failing_body_ends_failed_with_a_structured_error(sending: Worker) -> None:
    handle = charge.dispatch({"amount": 42})

    with pytest.raises(RunFailed) as caught:
        sending.result(handle)

    assert caught.value.status == RunStatus.FAILED
    error = caught.value.error
    assert error["type"] == "tests.worker_workflows.PaymentDeclined"
    assert error["message"] == "card declined for 42"
    assert "PaymentDeclined: card declined for 42" in error["traceback"]
    run = default_engine.get_run(handle.run_id)
    assert (run.status, run.output, run.error) == (RunStatus.FAILED, None, error)
    assert run.finished_at is not None
    add_step, decline_step = default_engine.store.get_steps(handle.run_id)
    assert add_step == StepRecord(0, "add", result=42)
    assert (decline_step.position, decline_step.name, decline_step.result) == (1, "decline", None)
    assert decline_step.error["type"] == "tests.worker_workflows.PaymentDeclined"
    assert decline_step.error["message"] == "card declined for 42"


# quota and messages -------------------------------------------------------------------


def test_a_refused_start_sends_no_message(idle_queue: str, broker: Broker) -> None:
    key = f"tenant:{uuid.uuid4().hex}"
    quota = {"key": key, "limit": 3}
    handles = [total.dispatch({"a": n, "b": 0}, concurrency=quota) for n in range(3)]

    with pytest.raises(ConcurrencyLimitError) as caught:
        total.dispatch({"a": 99, "b": 0}, concurrency=quota)

    refused = caught.value
    assert (refused.workflow, refused.key, refused.limit, refused.active) == (
        "tests.worker.total",
        key,
        3,
        3,
    )
    assert broker.queued_count(idle_queue) == 3
    assert broker.queued_run_ids(idle_queue) == [handle.run_id for handle in handles]
    assert sorted(Run.objects.values_list("id", flat=True)) == sorted(h.run_id for h in handles)
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.PENDING}
    assert RunTag.objects.count() == 3
    assert RunTag.objects.filter(tag=quota_tag(key)).count() == 3


def test_a_waiting_start_is_admitted_when_the_worker_ends_the_holder(sending: Worker) -> None:
    """``wait=``: the holder is sent only once the start waits; the worker's turn ending it
    frees the slot, and the waiting start is admitted and executed in its turn."""
    from django.db import connections

    from durable_django._runtime.waiting import waiting_count

    quota = {"key": f"tenant:{uuid.uuid4().hex}", "limit": 1}
    with override_settings(DURABLE={"ENQUEUE": False, "QUEUE": sending.queue}):
        holder = total.dispatch({"a": 1, "b": 1}, concurrency=quota)  # not sent yet
    waited: list[Any] = []

    def waiter() -> None:
        try:
            waited.append(total.dispatch({"a": 2, "b": 2}, concurrency=quota, wait=60))
        except BaseException as error:
            waited.append(error)
        finally:
            connections.close_all()

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 60
    while waiting_count() == 0 and not waited:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert not waited  # still waiting: the holder has not run
    default_engine.send(holder.run_id, sending.queue)
    thread.join(60)
    (handle,) = waited
    assert sending.result(holder) == {"total": 2}
    assert sending.result(handle) == {"total": 4}
    assert RunTag.objects.filter(tag=quota_tag(quota["key"])).count() == 2


def test_nothing_is_sent_before_the_start_commits(idle_queue: str, broker: Broker) -> None:
    with transaction.atomic():
        handle = total.dispatch({"a": 1, "b": 2})
        assert Run.objects.filter(pk=handle.run_id).exists()
        assert broker.queued_count(idle_queue) == 0

    assert broker.queued_run_ids(idle_queue) == [handle.run_id]


def test_a_rolled_back_start_leaves_no_run_and_no_message(idle_queue: str, broker: Broker) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        rolled_back = total.dispatch({"a": 1, "b": 2})
        raise Rollback

    with transaction.atomic():
        kept = total.dispatch({"a": 3, "b": 4})
        with pytest.raises(Rollback), transaction.atomic():
            in_savepoint = total.dispatch({"a": 5, "b": 6})
            raise Rollback

    assert list(Run.objects.values_list("id", flat=True)) == [kept.run_id]
    assert RunTag.objects.count() == 0
    assert rolled_back.run_id != in_savepoint.run_id
    assert broker.queued_count(idle_queue) == 1
    assert broker.queued_run_ids(idle_queue) == [kept.run_id]


def test_a_committed_start_is_executed_by_the_worker(sending: Worker) -> None:
    with transaction.atomic():
        handle = total.dispatch({"a": 20, "b": 22})

    assert sending.result(handle) == {"total": 42}


def test_messages_are_json(idle_queue: str, broker: Broker) -> None:
    handle = total.dispatch({"a": 1, "b": 1})

    (message,) = broker.messages(idle_queue)
    assert message.content_type == "application/json"
    assert message.content_encoding == "utf-8"
    assert message.headers["task"] == "durable_django.execute_run"
    assert message.routing_key == idle_queue
    # The message carries the run id only: the input stays in the database.
    args, kwargs, _embed = message.body
    assert (args, kwargs) == ([handle.run_id], {})


def test_the_worker_refuses_a_pickled_message(sending: Worker) -> None:
    handle = Engine(enqueue=False).start(total, {"a": 1, "b": 1})  # created, nothing sent
    app.send_task(
        "durable_django.execute_run", (handle.run_id,), queue=sending.queue, serializer="pickle"
    )
    # The worker takes its messages in order: once this run is done, it has seen the other.
    assert sending.result(total.dispatch({"a": 2, "b": 2})) == {"total": 4}

    assert default_engine.get_run(handle.run_id).status == RunStatus.PENDING
    assert "ContentDisallowed" in sending.log()


# remote workflows ---------------------------------------------------------------------


def test_a_remote_workflow_is_routed_to_its_queue_and_executed_there(
    sending: Worker, remote_workflow: tuple[str, str], broker: Broker
) -> None:
    name, remote_queue = remote_workflow
    key = f"remote:{uuid.uuid4().hex}"
    quota = {"key": key, "limit": 1}

    handle = default_engine.start(name, {"n": 1}, concurrency=quota)
    # Created and quota-checked here, in this process and its database.
    run = default_engine.get_run(handle.run_id)
    assert (run.workflow, run.status, run.queue) == (name, RunStatus.PENDING, remote_queue)
    assert quota_tag(key) in run.tags
    with pytest.raises(ConcurrencyLimitError):
        default_engine.start(name, {"n": 2}, concurrency=quota)
    assert broker.queued_run_ids(remote_queue) == [handle.run_id]

    # The local worker never receives it: a local run sent after it is done, and the remote
    # run is still pending (the local worker, which has no body for it, would block it).
    assert sending.result(total.dispatch({"a": 0, "b": 1})) == {"total": 1}
    assert default_engine.get_run(handle.run_id).status == RunStatus.PENDING
    assert broker.queued_run_ids(remote_queue) == [handle.run_id]

    # A worker serving the remote queue, where the workflow has a body, executes it.
    with running_worker(
        remote_queue,
        include=["tests.remote_workflows"],
        env={"DURABLE_TEST_REMOTE_WORKFLOW": name},
    ) as remote:
        assert remote.result(handle) == {"served_by": "remote", "input": {"n": 1}}
    assert broker.queued_count(remote_queue) == 0
    assert default_engine.get_run(handle.run_id).status == RunStatus.COMPLETED
    # The slot is free again.
    assert default_engine.start(name, {"n": 3}, concurrency=quota).created


# batches ------------------------------------------------------------------------------


def test_a_batch_is_sent_together_once_it_commits(idle_queue: str, broker: Broker) -> None:
    key = f"tenant:{uuid.uuid4().hex}"
    with transaction.atomic():
        batch = total.dispatch_many(
            [{"a": n, "b": 0} for n in range(5)], concurrency={"key": key, "limit": 3}
        )
        assert Run.objects.count() == 3
        assert broker.queued_count(idle_queue) == 0

    assert [index for index, _ in batch.refused] == [3, 4]
    assert broker.queued_run_ids(idle_queue) == [handle.run_id for handle in batch.started]


def test_a_rolled_back_batch_leaves_no_run_and_no_message(idle_queue: str, broker: Broker) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        rolled_back = total.dispatch_many([{"a": n, "b": 0} for n in range(4)])
        assert len(rolled_back.started) == 4
        raise Rollback
    with pytest.raises(TypeError, match=r"inputs\[2\]"):
        total.dispatch_many([{"a": 1, "b": 0}, {"a": 2, "b": 0}, {"a": object(), "b": 0}])

    assert Run.objects.count() == RunTag.objects.count() == 0
    assert broker.queued_count(idle_queue) == 0


def test_a_batch_the_database_refuses_leaves_no_run_and_no_message(
    idle_queue: str, broker: Broker
) -> None:
    """The database refuses the third run's insert (a trigger): the whole batch is undone,
    nothing is sent, and the same batch starts whole once the database takes it."""
    from django.db import DatabaseError

    from ..database_refusal import MESSAGE, refusing

    prefix = uuid.uuid4().hex[:8]
    run_ids = [f"{prefix}-{n}" for n in range(4)]
    inputs = [{"a": n, "b": 0} for n in range(4)]
    refused = refusing("durable_run", "INSERT", f"NEW.id = '{run_ids[2]}'")
    with refused, pytest.raises(DatabaseError, match=MESSAGE):
        total.dispatch_many(inputs, run_ids=run_ids)
    assert Run.objects.count() == RunTag.objects.count() == 0
    assert broker.queued_count(idle_queue) == 0

    batch = total.dispatch_many(inputs, run_ids=run_ids)
    assert [handle.run_id for handle in batch.started] == run_ids
    assert broker.queued_run_ids(idle_queue) == run_ids


def test_a_batchs_runs_are_executed_by_the_worker(sending: Worker) -> None:
    key = f"tenant:{uuid.uuid4().hex}"
    batch = total.dispatch_many(
        [{"a": n, "b": 10} for n in range(12)], concurrency={"key": key, "limit": 8}
    )

    assert [index for index, _ in batch.refused] == [8, 9, 10, 11]
    assert [sending.result(handle) for handle in batch.started] == [
        {"total": n + 10} for n in range(8)
    ]
    # Their slots are free again: the next batch takes the whole limit.
    again = total.dispatch_many(
        [{"a": n, "b": 0} for n in range(8)], concurrency={"key": key, "limit": 8}
    )
    assert not again.refused
    assert [sending.result(handle) for handle in again.started] == [{"total": n} for n in range(8)]
