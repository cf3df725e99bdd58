"""Sentry and OpenTelemetry, set up in a test worker (``--include tests.tracing_worker``)
as a project would, with what they export written to the file named by
``DURABLE_TEST_TRACE_FILE``, one JSON object a line, for the test to read.

sentry-sdk sends its envelopes through a transport of its own API that appends each
transaction; the OpenTelemetry SDK exports each ended span through a ``SpanExporter``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

import sentry_sdk
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from sentry_sdk.envelope import Envelope
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport

#: A DSN that is never contacted: the transport keeps what would be sent.
DSN = "https://public@sentry.invalid/1"

_lock = threading.Lock()


def record(entry: dict[str, Any]) -> None:
    """Append ``entry`` to the trace file."""
    with _lock, open(os.environ["DURABLE_TEST_TRACE_FILE"], "a") as file:
        file.write(json.dumps(entry) + "\n")


def read(path: str) -> list[dict[str, Any]]:
    """What a worker recorded in the trace file at ``path``."""
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]


class KeptTransport(Transport):
    """Keeps the transactions of each envelope in ``kept`` (or the trace file)."""

    def __init__(self, options: dict[str, Any] | None = None, kept: list[Any] | None = None):
        super().__init__(options)
        self.kept = kept

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.type != "transaction" or item.payload.json is None:
                continue
            event = item.payload.json
            if self.kept is not None:
                self.kept.append(event)
            else:
                record({"source": "sentry", **_transaction(event)})


def _transaction(event: dict[str, Any]) -> dict[str, Any]:
    trace = event["contexts"]["trace"]
    return {
        "op": trace.get("op"),
        "trace_id": trace["trace_id"],
        "parent_span_id": trace.get("parent_span_id"),
        "name": event.get("transaction"),
        "spans": [{"op": span.get("op"), "span_id": span["span_id"]} for span in event["spans"]],
    }


def init_sentry(transport: Transport) -> None:
    """sentry-sdk with its Celery integration only, every transaction sampled."""
    sentry_sdk.init(
        dsn=DSN,
        transport=transport,
        integrations=[CeleryIntegration()],
        default_integrations=False,
        auto_enabling_integrations=False,
        traces_sample_rate=1.0,
    )


class FileExporter(SpanExporter):
    """Writes each ended span to the trace file."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            record({"source": "otel", **span_entry(span)})
        return SpanExportResult.SUCCESS


def span_entry(span: ReadableSpan) -> dict[str, Any]:
    """What the tests compare of a span: its name, kind, trace and parent."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_id": None if span.parent is None else format(span.parent.span_id, "016x"),
    }


if os.environ.get("DURABLE_TEST_TRACE_FILE"):  # imported by a worker of the tracing tests
    init_sentry(KeptTransport())
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    CeleryInstrumentor().instrument(tracer_provider=_provider)
