"""What a team's tools see: the log lines of failures and refusals (caplog, and real
sentry-sdk with an in-memory transport), the run for user code (``current_run()``,
``RunFilter``), and the OpenTelemetry spans of starts, turns and steps (the SDK's
in-memory exporter)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.transport import Transport

from durable_django import (
    Concurrency,
    ConcurrencyLimitError,
    Engine,
    RateLimit,
    RateLimitError,
    RunInfo,
    current_run,
)
from durable_django.observability import Observer, RunFilter, ask_again, forget, observe
from durable_django.testing import run_until_idle

RUN_FIELDS = {
    "durable_run_id",
    "durable_workflow",
    "durable_version",
    "durable_namespace",
    "durable_step",
    "durable_attempt",
}


def divide(n: int) -> float:
    return 1 / n


def flaky_body(ctx: Any, input: Any) -> Any:
    return ctx.step("divide", divide, input["n"], retries=input["retries"], backoff=0)


def settle(engine: Engine) -> None:
    """Run every turn there is, a step's retry included (its timer woken by the tick)."""
    while run_until_idle(engine) or engine.tick().total:
        pass


def records_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == logger]


# logs ----------------------------------------------------------------------------------


def test_a_failed_step_is_a_warning_saying_what_comes_next_and_the_run_an_error(
    engine: Engine, caplog: pytest.LogCaptureFixture
):
    engine.register("flaky", "3", flaky_body)
    handle = engine.start("flaky", {"n": 0, "retries": 1}, namespace="team-a")
    caplog.set_level(logging.DEBUG, logger="durable_django")
    settle(engine)
    assert engine.get_run(handle.run_id).status == "failed"

    first, second = records_of(caplog, "durable_django.runs")[:2]
    assert first.levelno == logging.WARNING
    assert "step 'divide' failed on attempt 1 (ZeroDivisionError: division by zero)" in (
        first.getMessage()
    )
    assert "attempt 2 in 0s" in first.getMessage()
    assert second.levelno == logging.WARNING and "no retries left" in second.getMessage()
    fields = {name: getattr(second, name) for name in RUN_FIELDS}
    assert fields == {
        "durable_run_id": handle.run_id,
        "durable_workflow": "flaky",
        "durable_version": "3",
        "durable_namespace": "team-a",
        "durable_step": "divide",
        "durable_attempt": 2,
    }

    (failed,) = [r for r in records_of(caplog, "durable_django.runs") if r.levelno >= 40]
    assert failed.levelno == logging.ERROR
    assert f"run {handle.run_id} (flaky) failed: StepError" in failed.getMessage()
    assert failed.exc_info is not None
    error = failed.exc_info[1]
    assert type(error).__name__ == "StepError"
    assert isinstance(error.__cause__, ZeroDivisionError)
    assert failed.durable_run_id == handle.run_id and failed.durable_step is None


def test_a_body_that_raises_is_logged_with_its_live_exception(
    engine: Engine, caplog: pytest.LogCaptureFixture
):
    def body(ctx: Any, input: Any) -> None:
        raise KeyError("missing")

    engine.register("raises", "1", body)
    engine.start("raises", {})
    run_until_idle(engine)
    (record,) = records_of(caplog, "durable_django.runs")
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert isinstance(record.exc_info[1], KeyError)
    # The frames are the body's own: the traceback reaches the line that raised.
    frames = []
    trace_ = record.exc_info[2]
    while trace_ is not None:
        frames.append(trace_.tb_frame.f_code.co_name)
        trace_ = trace_.tb_next
    assert frames[-1] == "body"


def test_the_happy_path_logs_nothing_above_debug(engine: Engine, caplog: pytest.LogCaptureFixture):
    engine.register("fine", "1", lambda ctx, input: ctx.step("one", lambda: 1))
    caplog.set_level(logging.DEBUG, logger="durable_django")
    handles = [engine.start("fine", {}) for _ in range(3)]
    engine.start_many("fine", [{}, {}])
    run_until_idle(engine)
    assert all(handle.status == "completed" for handle in handles)
    assert [r for r in caplog.records if r.levelno > logging.DEBUG] == []


def test_a_refused_start_is_an_info_line_with_its_key(
    engine: Engine, caplog: pytest.LogCaptureFixture
):
    engine.register(
        "limited", "1", lambda ctx, input: 1, concurrency=Concurrency(lambda input: "k", limit=1)
    )
    engine.start("limited", {})
    caplog.set_level(logging.INFO, logger="durable_django")
    with pytest.raises(ConcurrencyLimitError) as refused:
        engine.start("limited", {})
    batch = engine.start_many("limited", [{}, {}])
    assert len(batch.refused) == 2
    records = records_of(caplog, "durable_django.starts")
    assert len(records) == 3
    assert all(record.levelno == logging.INFO for record in records)
    assert "start of limited refused: key 'k' holds 1 of 1 unit(s)" in records[0].getMessage()
    assert records[0].durable_key == "k" and records[0].durable_limit == 1
    assert records[0].durable_retry_after == refused.value.retry_after


def test_a_skipped_subscriber_is_a_warning(engine: Engine, caplog: pytest.LogCaptureFixture):
    engine.register(
        "on.signup",
        "1",
        lambda ctx, input: 1,
        on_event=["signup"],
        concurrency=Concurrency(lambda input: "welcome", limit=0),
    )
    result = engine.publish_event("signup", {"user": 1}, id="e1")
    assert [workflow for workflow, _ in result.skipped] == ["on.signup"]
    (record,) = records_of(caplog, "durable_django.events")
    assert record.levelno == logging.WARNING
    assert "event 'signup': subscriber on.signup skipped (ConcurrencyLimitError" in (
        record.getMessage()
    )
    assert record.durable_event_id == "e1"


# the run in user code ------------------------------------------------------------------


def test_current_run_in_a_body_and_a_step_and_none_elsewhere(engine: Engine):
    seen: list[RunInfo | None] = []

    def note() -> None:
        seen.append(current_run())

    def body(ctx: Any, input: Any) -> None:
        seen.append(current_run())
        ctx.step("note", note)
        ctx.transaction("noted", note)
        if len(seen) < 4:
            ctx.step("again", lambda: divide(0), retries=1, backoff=0)

    engine.register("seen", "2", body)
    handle = engine.start("seen", {}, namespace="ns")
    assert current_run() is None
    settle(engine)
    assert current_run() is None
    info = dict(run_id=handle.run_id, workflow="seen", version="2", namespace="ns")
    assert seen[:3] == [
        RunInfo(**info, step=None, attempt=1),
        RunInfo(**info, step="note", attempt=1),
        RunInfo(**info, step="noted", attempt=1),
    ]
    # Replayed on the next turn: the body sees the run again, the recorded steps no call.
    assert seen[3] == RunInfo(**info, step=None, attempt=1)


def test_the_filter_adds_the_run_to_every_record_inside_a_run(
    engine: Engine, caplog: pytest.LogCaptureFixture
):
    app_logger = logging.getLogger("tests.app")
    run_filter = RunFilter()
    caplog.handler.addFilter(run_filter)
    try:

        def body(ctx: Any, input: Any) -> None:
            app_logger.warning("in the body")
            ctx.step("log", lambda: app_logger.warning("in the step"))

        engine.register("logs", "1", body)
        handle = engine.start("logs", {})
        run_until_idle(engine)
        app_logger.warning("outside")
    finally:
        caplog.handler.removeFilter(run_filter)
    body_record, step_record, outside = records_of(caplog, "tests.app")
    assert (body_record.durable_run_id, body_record.durable_step) == (handle.run_id, None)
    assert (step_record.durable_run_id, step_record.durable_step) == (handle.run_id, "log")
    assert step_record.durable_workflow == "logs" and step_record.durable_attempt == 1
    assert all(getattr(outside, name) is None for name in RUN_FIELDS)


# the seam ------------------------------------------------------------------------------


def test_an_observer_that_raises_changes_nothing(engine: Engine, caplog: pytest.LogCaptureFixture):
    class Broken(Observer):
        def start(self, start: Any) -> Any:
            raise RuntimeError("observer bug")

        def step_failed(self, step: Any) -> None:
            raise RuntimeError("observer bug")

    broken = observe(Broken())
    try:
        engine.register("flaky", "1", flaky_body)
        handle = engine.start("flaky", {"n": 0, "retries": 0})
        run_until_idle(engine)
    finally:
        forget(broken)
    assert engine.get_run(handle.run_id).status == "failed"
    assert len(records_of(caplog, "durable_django.observability")) == 2


# Sentry --------------------------------------------------------------------------------


class KeptEnvelopes(Transport):
    """A Sentry transport that keeps the envelopes in memory."""

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.envelopes: list[Any] = []

    def capture_envelope(self, envelope: Any) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[dict[str, Any]]:
        return [
            item.payload.json
            for envelope in self.envelopes
            for item in envelope.items
            if item.type == "event"
        ]


@pytest.fixture
def sentry() -> Iterator[KeptEnvelopes]:
    transport = KeptEnvelopes()
    sentry_sdk.init(
        dsn="http://public@127.0.0.1:9/1",
        transport=transport,
        default_integrations=False,
        auto_enabling_integrations=False,
        integrations=[LoggingIntegration(level=logging.INFO, event_level=logging.ERROR)],
    )
    try:
        yield transport
    finally:
        sentry_sdk.flush()
        sentry_sdk.get_global_scope().set_client(None)


def test_a_failed_step_is_a_sentry_event_with_its_frames_and_the_run(
    engine: Engine, sentry: KeptEnvelopes
):
    engine.register("flaky", "1", flaky_body)
    handle = engine.start("flaky", {"n": 0, "retries": 0})
    run_until_idle(engine)
    sentry_sdk.flush()
    (event,) = sentry.events()
    assert event["level"] == "error" and event["logger"] == "durable_django.runs"
    exceptions = event["exception"]["values"]
    assert [value["type"] for value in exceptions] == ["ZeroDivisionError", "StepError"]
    frames = [frame["function"] for frame in exceptions[0]["stacktrace"]["frames"]]
    assert frames[-1] == "divide"
    assert event["extra"]["durable_run_id"] == handle.run_id
    assert event["extra"]["durable_workflow"] == "flaky"
    # The failed attempt's warning went before it, as a breadcrumb.
    crumbs = [crumb["message"] for crumb in event["breadcrumbs"]["values"]]
    assert any("step 'divide' failed on attempt 1" in crumb for crumb in crumbs)


# OpenTelemetry -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """The SDK's in-memory exporter on the process's tracer provider (set here if the
    process has none: a provider is set once per process)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ask_again()  # the span observer sees the provider at once
    return exporter


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    exporter.clear()


def named(spans: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [span for span in spans.get_finished_spans() if span.name.startswith(prefix)]


def test_a_start_span_carries_the_admission_and_a_refusal(
    engine: Engine, spans: InMemorySpanExporter
):
    engine.register(
        "limited",
        "1",
        lambda ctx, input: 1,
        concurrency=Concurrency(lambda input: "tenant:a", limit=1),
    )
    handle = engine.start("limited", {})
    with pytest.raises(ConcurrencyLimitError) as refused:
        engine.start("limited", {})
    admitted, refusal = named(spans, "durable.start ")
    assert admitted.name == "durable.start limited"
    assert admitted.kind == trace.SpanKind.PRODUCER
    expected = {
        "messaging.system": "durable_django",
        "durable.workflow": "limited",
        "durable.quota.keys": ("tenant:a",),
        "durable.quota.limits": (1,),
        "durable.quota.weights": (1,),
        "durable.refused": False,
        "durable.created": 1,
        "durable.run_id": handle.run_id,
    }
    assert dict(admitted.attributes or {}).items() >= expected.items()
    attributes = dict(refusal.attributes or {})
    assert attributes["durable.refused"] is True
    assert attributes["durable.quota.active"] == 1
    assert attributes["durable.retry_after"] == refused.value.retry_after
    assert refusal.status.status_code == StatusCode.UNSET  # a decision, not an error


def test_a_rate_limit_refusal_on_the_start_span_says_its_window(
    engine: Engine, spans: InMemorySpanExporter
):
    engine.register(
        "rated", "1", lambda ctx, input: 1, rate_limit=RateLimit(lambda i: "r", limit=1, per=30)
    )
    engine.start("rated", {})
    with pytest.raises(RateLimitError) as refused:
        engine.start("rated", {})
    admitted, refusal = named(spans, "durable.start ")
    assert "durable.rate_limit.per" not in dict(admitted.attributes or {})
    attributes = dict(refusal.attributes or {})
    assert attributes["durable.refused.key"] == "r"
    assert attributes["durable.rate_limit.per"] == 30.0
    assert attributes["durable.retry_after"] == refused.value.retry_after


def test_turn_and_step_spans_nest_and_a_failed_step_is_an_error(
    engine: Engine, spans: InMemorySpanExporter
):
    engine.register("flaky", "1", flaky_body)
    handle = engine.start("flaky", {"n": 0, "retries": 0})
    run_until_idle(engine)
    (turn,) = named(spans, "durable.turn ")
    (step,) = named(spans, "durable.step ")
    assert turn.name == "durable.turn flaky" and turn.kind == trace.SpanKind.CONSUMER
    assert step.name == "durable.step divide" and step.parent is not None
    assert step.parent.span_id == turn.context.span_id
    assert step.status.status_code == StatusCode.ERROR
    assert [event.name for event in step.events] == ["exception"]
    assert step.events[0].attributes["exception.type"] == "ZeroDivisionError"
    assert (step.attributes or {})["durable.step"] == "divide"
    turn_attributes = dict(turn.attributes or {})
    assert turn_attributes["durable.run_id"] == handle.run_id
    assert turn_attributes["durable.outcome"] == "failed"
    assert turn.status.status_code == StatusCode.ERROR


def test_a_batch_has_one_span_with_its_decisions(engine: Engine, spans: InMemorySpanExporter):
    engine.register(
        "limited", "1", lambda ctx, input: 1, concurrency=Concurrency(lambda input: "b", limit=2)
    )
    batch = engine.start_many("limited", [{}, {}, {}])
    assert len(batch.started) == 2
    (span,) = named(spans, "durable.start_many ")
    attributes = dict(span.attributes or {})
    assert attributes["messaging.batch.message_count"] == 3
    assert attributes["durable.created"] == 2
    assert attributes["durable.refused_count"] == 1


class Recorder(Observer):
    """Notes every moment the seam reports."""

    def __init__(self) -> None:
        self.moments: list[tuple[str, Any]] = []

    def start(self, start: Any) -> None:
        self.moments.append(("start", start))

    def turn(self, turn: Any) -> None:
        self.moments.append(("turn", turn))

    def step(self, step: Any) -> None:
        self.moments.append(("step", step))

    def step_failed(self, step: Any) -> None:
        self.moments.append(("step_failed", step))

    def refused(self, workflow: str, error: Any) -> None:
        self.moments.append(("refused", (workflow, error)))

    def subscriber_skipped(self, event: str, event_id: Any, workflow: str, error: Any) -> None:
        self.moments.append(("subscriber_skipped", (event, workflow)))

    def ticked(self, result: Any) -> None:
        self.moments.append(("ticked", result))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = observe(Recorder())
    try:
        yield recorder
    finally:
        forget(recorder)


def test_the_seam_reports_each_moment_with_its_outcome(engine: Engine, recorder: Recorder):
    engine.register("flaky", "1", flaky_body, concurrency=Concurrency(lambda input: "f", limit=1))
    handle = engine.start("flaky", {"n": 0, "retries": 1})
    with pytest.raises(ConcurrencyLimitError):
        engine.start("flaky", {"n": 1, "retries": 0})
    settle(engine)
    kinds = [kind for kind, _ in recorder.moments]
    # The start's moment is entered first; a refusal is reported inside it.
    assert kinds[:3] == ["start", "start", "refused"]
    admitted, refused = recorder.moments[0][1], recorder.moments[1][1]
    assert (admitted.run_ids, admitted.created, admitted.refused) == ([handle.run_id], 1, [])
    assert [quota.key for quota in admitted.quotas] == ["f"]
    assert refused.created == 0 and refused.refused[0].key == "f"
    turns = [event for kind, event in recorder.moments if kind == "turn"]
    assert [turn.outcome for turn in turns] == ["suspended", "failed"]
    assert isinstance(turns[1].error, Exception)
    failures = [event for kind, event in recorder.moments if kind == "step_failed"]
    assert [(f.name, f.attempt, f.retry_in) for f in failures] == [
        ("divide", 1, 0.0),
        ("divide", 2, None),
    ]
    assert "ticked" in kinds


def test_a_waiting_start_says_how_long_it_waited(memory_engine: Engine, recorder: Recorder):
    memory_engine.register(
        "one", "1", lambda ctx, input: 1, concurrency=Concurrency(lambda input: "w", limit=1)
    )
    memory_engine.start("one", {})
    with pytest.raises(ConcurrencyLimitError):
        memory_engine.start("one", {}, wait=0.3)
    starts = [event for kind, event in recorder.moments if kind == "start"]
    assert len(starts) >= 3  # the first start, then the waiting one's attempts
    assert starts[1].waited < starts[-1].waited
    assert 0.1 < starts[-1].waited < 5
