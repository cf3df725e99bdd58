"""Celery's own tooling sees runs as it sees tasks: the workflow's name (``shadow``) in
the message and in ``inspect active``, ``task-sent`` events, and the priority of the
route, of ``task_default_priority``, declared by the workflow, or a task's, read back from
Redis and RabbitMQ."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from durable_django import workflow
from durable_django._runtime.publishing import TASK_NAME, RunMessage, publish_runs
from durable_django.engines import default_engine
from durable_django.models import Run

from ..brokers import TASK_PRIORITIES, Broker
from ..tooling_workflows import urgent
from ..worker_workflows import total

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


# the workflow's name -----------------------------------------------------------------


def test_the_message_names_the_workflow(idle_queue: str, broker: Broker) -> None:
    handle = total.dispatch({"a": 1, "b": 2})

    [message] = broker.messages(idle_queue)
    assert message.headers["task"] == TASK_NAME
    assert message.headers["shadow"] == "tests.worker.total"
    assert message.headers["argsrepr"] == repr((handle.run_id,))


# priorities --------------------------------------------------------------------------


def test_the_routes_priority_is_the_messages(
    idle_queue: str, broker: Broker, configured: Any
) -> None:
    configured(task_routes={TASK_NAME: {"priority": 6}})
    total.dispatch({"a": 1, "b": 2})

    [message] = broker.all_messages(idle_queue)
    assert message.priority == 6


def test_task_default_priority_is_the_messages(
    idle_queue: str, broker: Broker, configured: Any
) -> None:
    configured(task_default_priority=9)
    total.dispatch({"a": 1, "b": 2})

    [message] = broker.all_messages(idle_queue)
    assert message.priority == 9


def test_a_workflows_priority_is_over_the_routes(
    idle_queue: str, broker: Broker, configured: Any
) -> None:
    configured(task_routes={TASK_NAME: {"priority": 9}})
    urgent.dispatch({"n": 1})

    [message] = broker.all_messages(idle_queue)
    assert message.priority == 3
    assert message.headers["shadow"] == "tests.tooling.urgent"


def test_a_runs_priority_is_over_the_workflows(idle_queue: str, broker: Broker) -> None:
    publish_runs([RunMessage("given", idle_queue, "tests.tooling.urgent", 6)])

    [message] = broker.all_messages(idle_queue)
    assert (message.run_ids(), message.priority) == (["given"], 6)


@pytest.mark.parametrize("through_apply_async", [False, True])
def test_a_task_runs_priority_is_its_tasks_in_the_brokers_direction(
    idle_queue: str, broker: Broker, configured: Any, through_apply_async: bool
) -> None:
    # a task's own priority is over the default; with task-sent events, sent by apply_async
    configured(task_default_priority=6, task_send_sent_event=through_apply_async)
    expected = TASK_PRIORITIES[broker.name]
    publish_runs([RunMessage(str(p), idle_queue, "django.task", task_priority=p) for p in expected])

    found = {int(m.run_ids()[0]): m.priority for m in broker.all_messages(idle_queue)}
    assert found == expected


def test_a_runs_own_priority_is_over_its_tasks(idle_queue: str, broker: Broker) -> None:
    publish_runs([RunMessage("given", idle_queue, "django.task", 9, task_priority=-100)])

    [message] = broker.all_messages(idle_queue)
    assert message.priority == 9


@pytest.mark.parametrize("priority", [-1, 10, 2.5, "9", True])
def test_a_bad_priority_is_refused_and_registers_nothing(priority: Any) -> None:
    name = f"tests.tooling.bad.{uuid.uuid4().hex}"
    with pytest.raises(ValueError, match=rf"workflow {name!r}: priority must be an int from 0"):
        workflow(name=name, priority=priority)(lambda ctx, input: input)
    assert name not in {d.name for d in default_engine.registry.all()}
    assert not Run.objects.filter(workflow=name).exists()
