"""The Celery app of the benchmarks' workers on the execution settings: those of
``benchmarks.execution`` run ``-A benchmarks.common.execution_app`` with ``--include
benchmarks.common.execution_work`` (the workflow and the plain task), those of
``benchmarks.retry_after`` with ``--include benchmarks.retry_after.work``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.execution_settings")

app = Celery("durable_bench_exec")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)
app.autodiscover_tasks(["durable_django"])

if os.environ.get("DURABLE_BENCH_OTEL") == "1":
    # The "OTel on" variants: the SDK's provider, spans batched to an exporter that drops
    # them, and OpenTelemetry's Celery instrumentation, as a team tracing Celery runs it.
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
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument()

if os.environ.get("DURABLE_BENCH_SENTRY") == "1":
    # The "Sentry on" variants: sentry-sdk with its Celery integration, every transaction
    # sampled, its envelopes dropped by the transport.
    import sentry_sdk
    from sentry_sdk.envelope import Envelope
    from sentry_sdk.integrations.celery import CeleryIntegration
    from sentry_sdk.transport import Transport

    class DroppedEnvelopes(Transport):
        def capture_envelope(self, envelope: Envelope) -> None:
            pass

    sentry_sdk.init(
        dsn="http://public@127.0.0.1:9/1",
        transport=DroppedEnvelopes,
        integrations=[CeleryIntegration()],
        traces_sample_rate=1.0,
    )
