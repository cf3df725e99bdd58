"""A ``django.tasks`` task's priority on its run's Celery message, read back from Redis
and RabbitMQ: at the enqueue, and again when the tick resends the run (Django >= 6.0)."""

from __future__ import annotations

import datetime

import pytest

pytest.importorskip("django.tasks", reason="Django before 6.0 has no tasks framework")

from django.utils import timezone

from durable_django import engine as default_engine

from .. import django_task_functions as tasks
from ..brokers import TASK_PRIORITIES, Broker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def priorities(broker: Broker, queue: str) -> dict[str, int | None]:
    """The priority of each run's message waiting on ``queue``, by run id."""
    return {m.run_ids()[0]: m.priority for m in broker.all_messages(queue)}


def test_a_tasks_priority_is_its_messages_at_every_send(idle_queue: str, broker: Broker) -> None:
    expected = TASK_PRIORITIES[broker.name]
    enqueued = {tasks.add.using(priority=p).enqueue(1, p).id: p for p in expected}
    sent = {run_id: expected[p] for run_id, p in enqueued.items()}

    assert priorities(broker, idle_queue) == sent

    broker.drop_messages(idle_queue)
    later = timezone.now() + datetime.timedelta(hours=1)
    assert default_engine.tick(now=later).resent == len(sent)
    assert priorities(broker, idle_queue) == sent
