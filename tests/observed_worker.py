"""A worker process observed by the real Sentry and OpenTelemetry SDKs, each writing what
it would send to a file of ``DURABLE_TEST_OBSERVED`` (a directory) instead of the network:
``sentry.jsonl`` (one event a line) and ``spans.jsonl`` (one span a line). The worker
imports this module (``--include``); the test reads the files.

Its workflow, ``tests.observed.charge``, is imported by the test module as well.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from durable_django import workflow


class CardDeclined(Exception):
    """What the charge's step raises."""


def decline(amount: int) -> None:
    raise CardDeclined(f"card declined for {amount}")


@workflow(name="tests.observed.charge")
def charge(ctx: Any, input: Any) -> Any:
    ctx.step("decline", decline, input["amount"])


def _append(path: Path, lines: list[str]) -> None:
    with _lock, path.open("a") as file:
        file.writelines(f"{line}\n" for line in lines)


_lock = threading.Lock()


def _observe(directory: Path) -> None:
    import sentry_sdk
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from sentry_sdk.integrations.logging import LoggingIntegration
    from sentry_sdk.transport import Transport

    from durable_django.observability import ask_again

    class FileTransport(Transport):
        def capture_envelope(self, envelope: Any) -> None:
            events = [item.payload.json for item in envelope.items if item.type == "event"]
            _append(directory / "sentry.jsonl", [json.dumps(event) for event in events])

    class FileExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            _append(
                directory / "spans.jsonl",
                [span.to_json(indent=None) for span in spans],
            )
            return SpanExportResult.SUCCESS

    sentry_sdk.init(
        dsn="http://public@127.0.0.1:9/1",
        transport=FileTransport(),
        default_integrations=False,
        auto_enabling_integrations=False,
        integrations=[LoggingIntegration(level=logging.INFO, event_level=logging.ERROR)],
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)
    ask_again()


if "DURABLE_TEST_OBSERVED" in os.environ:
    _observe(Path(os.environ["DURABLE_TEST_OBSERVED"]))
