"""The lean publish (``durable_django._runtime.publishing``) on real brokers: a worker reads its
message as the one Celery's ``apply_async`` sends (and on Redis it is smaller), a real worker
executes it, several runs go in one publish, and its pooled producers survive a broker
restart.

Every test runs on Redis, and on PostgreSQL on RabbitMQ as well (the ``broker`` fixture,
``tests/brokers.py``); the restart runs on a redis-server of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app.task import Context, get_actual_ignore_result
from celery.worker.request import Request
from django.test import override_settings
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError

from durable_django import RunStatus
from durable_django import engine as default_engine
from durable_django._runtime.publishing import (
    LEFT_OUT_HEADERS,
    TASK_NAME,
    Publisher,
    RunMessage,
    publish_runs,
    publisher,
)
from durable_django.tasks import execute_run

from ..brokers import Broker
from ..celery_app import app
from ..faults import free_port
from ..testapp.workflows import plain
from ..worker import Worker, running_worker, unique_queue
from ..worker_workflows import total

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def worker(django_db_setup: None, broker: Broker) -> Iterator[Worker]:
    """A worker consuming a queue of its own, for every test of the module."""
    queue = unique_queue("durable-publish")
    try:
        with running_worker(queue, include=["tests.worker_workflows"]) as running:
            yield running
    finally:
        broker.delete_queue(queue)


@pytest.fixture
def idle_queue(broker: Broker) -> Iterator[str]:
    """A fresh queue that no worker consumes."""
    queue = unique_queue("durable-publish-idle")
    try:
        yield queue
    finally:
        broker.delete_queue(queue)


def worker_view(queue: str) -> list[dict[str, Any]]:
    """The messages waiting on ``queue``, taken as a worker takes them, and what a worker
    makes of each: the fields of Celery's ``Request`` and of the task's ``request``
    context that do not differ from message to message, and the ones that do."""
    seen = []
    with app.connection_for_read() as connection:
        bound = Queue(queue).bind(connection.default_channel)  # only read, never declared
        while (message := bound.get(no_ack=True)) is not None:
            args, _, embed = message.decode()
            request = Request(message, app=app, task=execute_run, hostname="reader")
            context = Context({**request.request_dict, **(embed or {})})
            delivery = request.delivery_info
            seen.append(
                {
                    "type": request.type,
                    "kwargs": request.kwargs,
                    "kwargsrepr": request.kwargsrepr,
                    "parent_id": request.parent_id,
                    "group": request.group,
                    "group_index": request.group_index,
                    "eta": request.eta,
                    "expires": request.expires,
                    "time_limits": tuple(request.time_limits),
                    "ignore_result": request.ignore_result,
                    "retries": request.request_dict.get("retries", 0),  # as task-received
                    "stamped_headers": request.stamped_headers,
                    "stamps": request.stamps,
                    "replaced_task_nesting": request.replaced_task_nesting,
                    "chord": request.chord,
                    "errbacks": request.errbacks,
                    "priority": delivery["priority"] or 0,  # RabbitMQ: none is 0
                    "routing_key": delivery["routing_key"],
                    "content": (message.content_type, message.content_encoding),
                    "task retries": context.retries,
                    "task time limits": (context.time_limit, context.soft_time_limit),
                    "task timelimit": tuple(context.timelimit or (None, None)),
                    "task ignores its result": get_actual_ignore_result(execute_run, context),
                    "task callbacks": (context.callbacks, context.chain, context.chord),
                    # what differs from message to message
                    "per message": {
                        "name": request.name,
                        "args": args,
                        "argsrepr": request.argsrepr,
                        "root is itself": request.root_id == request.id,
                        "correlation is itself": request.correlation_id == request.id,
                    },
                }
            )
    return seen


def test_a_worker_reads_the_message_as_the_one_apply_async_sends(
    idle_queue: str, broker: Broker
) -> None:
    execute_run.apply_async(("run-a",), queue=idle_queue, serializer="json", shadow="wf")
    publish_runs([RunMessage("run-b", idle_queue, "wf")])

    celery, lean = broker.messages(idle_queue)
    # what is left out: the headers whose absence a worker reads as their value here
    assert set(celery.headers) - set(lean.headers) == LEFT_OUT_HEADERS
    assert set(lean.headers) <= set(celery.headers)
    kept = set(lean.headers) - {"id", "root_id", "argsrepr"}
    assert {k: lean.headers[k] for k in kept} == {k: celery.headers[k] for k in kept}
    assert lean.body == [["run-b"], {}, {}]

    from_celery, from_lean = worker_view(idle_queue)
    assert from_celery.pop("per message") == {
        "name": "wf",
        "args": ["run-a"],
        "argsrepr": "('run-a',)",
        "root is itself": True,
        "correlation is itself": True,
    }
    assert from_lean.pop("per message") == {
        "name": "wf",
        "args": ["run-b"],
        "argsrepr": "('run-b',)",
        "root is itself": True,
        "correlation is itself": True,
    }
    assert from_lean == from_celery
    assert from_lean["routing_key"] == idle_queue


def test_on_redis_the_message_is_smaller(idle_queue: str, broker: Broker) -> None:
    if broker.name != "redis":
        pytest.skip("the envelope kombu's Redis transport stores")
    run_id = str(uuid.uuid4())
    execute_run.apply_async((run_id,), queue=idle_queue, serializer="json", shadow="shop.checkout")
    publish_runs([RunMessage(run_id, idle_queue, "shop.checkout")])

    client = redis.Redis.from_url(broker.url)
    lean, celery = client.lrange(idle_queue, 0, -1)  # the newest first
    client.close()
    # about 660 bytes against 1,010 (Celery's grows with the host's name, in origin)
    assert len(lean) < 0.7 * len(celery)
    envelope = json.loads(lean)
    assert set(envelope["properties"]) == {
        "correlation_id",
        "delivery_info",
        "priority",
        "delivery_tag",
    }
    assert envelope["properties"]["delivery_tag"] == envelope["headers"]["id"]
    assert json.loads(envelope["body"]) == [[run_id], {}, {}]  # its JSON text, no base64


def test_runs_published_together_are_executed_by_a_real_worker(
    worker: Worker, broker: Broker
) -> None:
    with override_settings(DURABLE={"ENQUEUE": False, "QUEUE": worker.queue}):
        handles = [total.dispatch({"a": n, "b": 1}) for n in range(3)]
    assert broker.queued_count(worker.queue) == 0  # nothing sent by the starts

    publish_runs([(handle.run_id, worker.queue) for handle in handles])

    assert [worker.result(handle) for handle in handles] == [{"total": n + 1} for n in range(3)]
    for handle in handles:
        assert default_engine.get_run(handle.run_id).status == RunStatus.COMPLETED


def test_several_runs_are_sent_in_order_each_in_a_message_of_its_own(
    idle_queue: str, broker: Broker
) -> None:
    run_ids = [uuid.uuid4().hex for _ in range(4)]

    publish_runs((run_id, idle_queue) for run_id in run_ids)

    messages = broker.messages(idle_queue)
    assert [message.run_ids() for message in messages] == [[run_id] for run_id in run_ids]
    assert len({message.headers["id"] for message in messages}) == 4


def test_a_run_id_of_any_text_is_written_as_json_and_repr_write_it(
    idle_queue: str, broker: Broker
) -> None:
    run_ids = ["turn:42", 'o\'neil "quoted" \\ é ☃\n', str(uuid.uuid4()), "a%sb%(x)s"]

    publish_runs([RunMessage(run_id, idle_queue, "wf") for run_id in run_ids])

    messages = broker.messages(idle_queue)
    assert [message.run_ids() for message in messages] == [[run_id] for run_id in run_ids]
    assert [message.headers["argsrepr"] for message in messages] == [
        repr((run_id,)) for run_id in run_ids
    ]
    task_ids = [message.headers["id"] for message in messages]
    assert len(set(task_ids)) == len(run_ids)
    assert all(uuid.UUID(task_id).version == 4 for task_id in task_ids)
    assert all(str(uuid.UUID(task_id)) == task_id for task_id in task_ids)


def test_a_run_with_an_id_of_any_text_is_executed_by_a_real_worker(worker: Worker) -> None:
    with override_settings(DURABLE={"ENQUEUE": False, "QUEUE": worker.queue}):
        handle = total.dispatch({"a": 1, "b": 2}, run_id=f'o\'neil "{uuid.uuid4()}" ☃')

    publish_runs([RunMessage(handle.run_id, worker.queue, "tests.worker.total")])

    assert worker.result(handle) == {"total": 3}


def test_a_run_without_a_queue_takes_the_task_routes(idle_queue: str, broker: Broker) -> None:
    previous = app.conf.task_routes
    app.conf.task_routes = {TASK_NAME: {"queue": idle_queue}}
    app.amqp.flush_routes()  # Celery reads the routes once, and builds its router then
    app.amqp.router = app.amqp.Router()
    try:
        Publisher(app).publish([("routed", "")])
    finally:
        app.conf.task_routes = previous
        app.amqp.flush_routes()
        app.amqp.router = app.amqp.Router()

    assert broker.queued_run_ids(idle_queue) == ["routed"]


def test_a_queue_bound_to_a_topic_exchange_gets_its_messages_through_it(
    idle_queue: str, broker: Broker
) -> None:
    """A route through a named exchange (here a topic exchange, declared in
    ``task_queues``) is sent through kombu, which routes it by the queue's binding; runs
    of a plain queue in the same publish keep their own route."""
    plain_queue = unique_queue("durable-publish-plain")
    topic = Queue(idle_queue, Exchange(f"{idle_queue}-x", type="topic"), routing_key="runs.#")
    previous = app.conf.task_queues
    app.conf.task_queues = [topic]
    app.amqp.queues = app.amqp.Queues(app.conf.task_queues)
    app.amqp.router = app.amqp.Router()  # the router keeps the queues it was made with
    try:
        Publisher(app).publish([("topical", idle_queue), ("plain", plain_queue)])
        assert broker.queued_run_ids(idle_queue) == ["topical"]
        assert broker.queued_run_ids(plain_queue) == ["plain"]
        (message,) = broker.messages(idle_queue)
        assert message.routing_key == "runs.#"
    finally:
        app.conf.task_queues = previous
        app.amqp.queues = app.amqp.Queues(previous)
        app.amqp.router = app.amqp.Router()
        broker.delete_queue(plain_queue)


def test_the_publisher_follows_the_app_to_new_broker_settings(broker: Broker) -> None:
    current = publisher()
    assert publisher() is current
    with broker.in_use():  # the same broker, its connections dropped and made anew
        assert publisher() is not current


def test_a_forked_process_sends_on_connections_of_its_own(idle_queue: str, broker: Broker) -> None:
    """A fork (a prefork worker's child, a preloaded web server's worker) never sends on,
    nor closes, the connections its parent keeps."""
    parent = publisher()
    publish_runs([("parent", idle_queue)])
    assert parent.idle  # the parent's connection, kept for its next send
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            child = publisher()
            if child is not parent and not child.idle:
                publish_runs([("child", idle_queue)])
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

    publish_runs([("parent-again", idle_queue)])  # on the connection the parent kept
    assert publisher() is parent
    assert broker.queued_run_ids(idle_queue) == ["parent", "child", "parent-again"]


def test_with_celery_eager_mode_a_run_executes_at_once(django_db_setup: None) -> None:
    """``task_always_eager`` (no broker involved): the run executes in this process when
    its start commits, as ``apply_async`` did."""
    app.conf.task_always_eager = True
    try:
        with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": "never-sent"}):
            handle = plain.dispatch({"n": 1})
    finally:
        app.conf.task_always_eager = False

    run = default_engine.get_run(handle.run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"got": {"n": 1}})


def test_with_celery_eager_mode_a_batchs_runs_execute_at_once(django_db_setup: None) -> None:
    """A batch's one ``publish_runs`` in ``task_always_eager``: each run executes in this
    process when the batch commits."""
    app.conf.task_always_eager = True
    try:
        with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": "never-sent"}):
            batch = plain.dispatch_many([{"n": 1}, {"n": 2}])
    finally:
        app.conf.task_always_eager = False

    runs = [default_engine.get_run(handle.run_id) for handle in batch.started]
    assert [(run.status, run.output) for run in runs] == [
        (RunStatus.COMPLETED, {"got": {"n": 1}}),
        (RunStatus.COMPLETED, {"got": {"n": 2}}),
    ]


# a broker restart, on a redis-server of the test's own ----------------------------------


@contextlib.contextmanager
def redis_server(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server on ``port`` without persistence, stopped when the block ends."""
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield process
    finally:
        client.close()
        process.kill()
        process.wait()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_the_pooled_producers_survive_a_redis_restart() -> None:
    port = free_port()
    own = Celery("publish-restart", broker=f"redis://127.0.0.1:{port}/0", set_as_current=False)
    own.conf.task_publish_retry_policy = {
        "max_retries": 3,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.2,
    }
    sender = Publisher(own)
    client = redis.Redis(port=port)
    try:
        with redis_server(port):
            sender.publish([("before", "q")])
            assert client.llen("q") == 1
            assert len(sender.idle) == 1  # the producer went back to the pool

        # The broker is down: the send fails once the retry policy is spent, and the
        # connection that failed is not kept.
        with pytest.raises(Exception) as raised:
            sender.publish([("while-down", "q")])
        assert isinstance(raised.value, (OperationalError, redis.ConnectionError)), raised.value
        assert not sender.idle

        with redis_server(port):  # back, empty
            sender.publish([("after", "q")])
            sender.publish([("again", "q")])
            assert client.llen("q") == 2
    finally:
        client.close()
        sender.close()
