"""The caller's trace goes with a run's message: Celery's publish signals get the real
headers, sentry-sdk's and OpenTelemetry's Celery integrations (the real libraries, set
up as a project would) continue the caller's trace in a real worker; a refused start
sends nothing and no signal."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals as celery_signals

from durable_django import ConcurrencyLimitError
from durable_django._runtime.publishing import TASK_NAME

from ..brokers import Broker
from ..worker_workflows import total

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def publishes() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """The publish signals Celery's receivers get: ``(signal, arguments)``."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def before(**arguments: Any) -> None:
        arguments["headers"]["x-request-id"] = "request-1"  # as django-structlog does
        seen.append(("before", arguments))

    def after(**arguments: Any) -> None:
        seen.append(("after", arguments))

    celery_signals.before_task_publish.connect(before, weak=False)
    celery_signals.after_task_publish.connect(after, weak=False)
    try:
        yield seen
    finally:
        celery_signals.before_task_publish.disconnect(before)
        celery_signals.after_task_publish.disconnect(after)


def test_publish_signals_get_the_real_headers(
    idle_queue: str, broker: Broker, publishes: list[tuple[str, dict[str, Any]]]
) -> None:
    handle = total.dispatch({"a": 1, "b": 2})

    [message] = broker.messages(idle_queue)
    assert message.run_ids() == [handle.run_id]
    assert [name for name, _ in publishes] == ["before", "after"]
    before, after = (arguments for _, arguments in publishes)
    assert before["sender"] == after["sender"] == TASK_NAME
    assert before["body"][0] == [handle.run_id] or before["body"][0] == (handle.run_id,)
    assert before["routing_key"] == idle_queue
    assert {"exchange", "properties", "declare", "retry_policy"} <= before.keys()
    assert before["headers"]["id"] == message.headers["id"]
    assert before["headers"] is after["headers"]
    # what a receiver puts in the headers is in the message
    assert message.headers["x-request-id"] == "request-1"


def test_a_refused_start_sends_no_message_and_no_signal(
    idle_queue: str, broker: Broker, publishes: list[tuple[str, dict[str, Any]]]
) -> None:
    quota = {"key": f"tenant:{uuid.uuid4().hex}", "limit": 1}
    total.dispatch({"a": 1, "b": 2}, concurrency=quota)
    with pytest.raises(ConcurrencyLimitError):
        total.dispatch({"a": 3, "b": 4}, concurrency=quota)

    assert broker.queued_count(idle_queue) == 1
    assert [name for name, _ in publishes] == ["before", "after"]
