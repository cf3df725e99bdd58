"""The Celery app of ``benchmarks/execution.py``: its workers run ``-A benchmarks.execution_app``
with ``--include benchmarks.execution_work`` (the workflow and the plain task)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.execution_settings")

app = Celery("durable_bench_exec")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)
app.autodiscover_tasks(["durable_django"])

if os.environ.get("DURABLE_BENCH_OTEL") == "1":
    # The "OTel on" variant: the SDK's provider, spans batched to an exporter that drops them.
    from collections.abc import Sequence

    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
