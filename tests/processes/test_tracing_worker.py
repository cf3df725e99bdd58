"""The worker continues the caller's trace: sentry-sdk's and OpenTelemetry's Celery
integrations (the real libraries, set up as a project would, in the test process and in
a real worker on Redis), PRODUCER in the caller, CONSUMER in the worker."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from django.test import override_settings
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durable_django._runtime.publishing import TASK_NAME

from ..brokers import Broker
from ..tracing_worker import KeptTransport, init_sentry, read, span_entry
from ..worker import Worker, running_worker, unique_queue, wait_until
from ..worker_workflows import total

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def traced(django_db_setup: None, redis_broker: Broker) -> Iterator[tuple[Worker, str]]:
    """A worker with Sentry's and OpenTelemetry's Celery integrations, and the file it
    records its transactions and spans in."""
    queue = unique_queue("durable-traced")
    handle, path = tempfile.mkstemp(prefix="durable-trace-", suffix=".jsonl")
    os.close(handle)
    try:
        with running_worker(
            queue,
            include=["tests.worker_workflows", "tests.tracing_worker"],
            env={"DURABLE_TEST_TRACE_FILE": path},
        ) as running:
            yield running, path
    finally:
        redis_broker.delete_queue(queue)
        os.unlink(path)


@pytest.fixture
def traced_worker(traced: tuple[Worker, str]) -> Iterator[tuple[Worker, str]]:
    worker, _path = traced
    with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": worker.queue}):
        yield traced


def test_the_worker_continues_the_callers_sentry_trace(
    traced_worker: tuple[Worker, str],
) -> None:
    worker, path = traced_worker
    kept: list[dict[str, Any]] = []
    init_sentry(KeptTransport(kept=kept))
    try:
        with sentry_sdk.start_transaction(op="http.server", name="view") as view:
            handle = total.dispatch({"a": 1, "b": 2})
            worker_sent_in(view)
    finally:
        sentry_sdk.init(default_integrations=False, auto_enabling_integrations=False)

    assert worker.result(handle) == {"total": 3}
    turn = wait_until(
        lambda: [
            t for t in read(path) if t["source"] == "sentry" and t["trace_id"] == view.trace_id
        ],
        "the worker's Sentry transaction in the view's trace",
        worker,
    )[0]
    assert turn["op"] == "queue.task.celery"
    assert turn["name"] == TASK_NAME
    # the publish is a span of the view's transaction (apply_async's, and send_task's in
    # it: Sentry wraps both), the turn's parent
    [sent] = [t for t in kept if t["contexts"]["trace"]["trace_id"] == view.trace_id]
    submits = [s["span_id"] for s in sent["spans"] if s["op"] == "queue.submit.celery"]
    assert turn["parent_span_id"] in submits


def worker_sent_in(_transaction: Any) -> None:
    """Wait, inside the caller's transaction, for the sender thread to send."""
    from ..worker import sent

    sent()


def test_the_worker_continues_the_callers_opentelemetry_trace(
    traced_worker: tuple[Worker, str],
) -> None:
    worker, path = traced_worker
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        with provider.get_tracer("tests").start_as_current_span(
            "view", kind=trace.SpanKind.SERVER
        ) as view:
            handle = total.dispatch({"a": 1, "b": 2})
            worker_sent_in(view)
    finally:
        instrumentor.uninstrument()

    assert worker.result(handle) == {"total": 3}
    spans = [span_entry(span) for span in exporter.get_finished_spans()]
    [root] = [s for s in spans if s["name"] == "view"]
    [producer] = [s for s in spans if s["kind"] == "PRODUCER"]
    assert producer["trace_id"] == root["trace_id"]
    assert producer["parent_id"] == root["span_id"]
    trace_id = root["trace_id"]
    consumer = wait_until(
        lambda: [
            s
            for s in read(path)
            if s["source"] == "otel" and s["kind"] == "CONSUMER" and s["trace_id"] == trace_id
        ],
        "the worker's span in the view's trace",
        worker,
    )[0]
    assert consumer["parent_id"] == producer["span_id"]
    assert consumer["name"] == f"run/{TASK_NAME}"
