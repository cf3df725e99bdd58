"""Metrics: the OpenTelemetry SDK's in-memory reader and a prometheus_client registry,
both real, read after the same scenario: starts admitted and refused, a step failing
then failing its run, a tick, a lease lost, a start that waited."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory, override_settings
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from durable_django import ConcurrencyLimitError, Engine, RateLimit, RateLimitError, metrics
from durable_django.metrics.opentelemetry import OpenTelemetryMetrics
from durable_django.metrics.prometheus import PrometheusMetrics, metrics_view
from durable_django.observability import observers
from durable_django.testing import run_until_idle

QUOTA = {"key": lambda i: "k", "limit": 1}


class Read:
    """The metrics both libraries hold after a scenario."""

    def __init__(self, engine: Engine, quota_keys: int = metrics.QUOTA_KEYS) -> None:
        self.reader = InMemoryMetricReader()
        self.registry = CollectorRegistry()
        provider = MeterProvider(metric_readers=[self.reader])
        self.sinks = (
            OpenTelemetryMetrics(provider, engine=engine, quota_keys=quota_keys),
            PrometheusMetrics(self.registry, engine=engine, quota_keys=quota_keys),
        )

    def otel(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """``{name: [(attributes, value)]}``; a histogram's value is ``(count, sum)``."""
        found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                assert scope.scope.name == "durable_django"
                for metric in scope.metrics:
                    points = found.setdefault(metric.name, [])
                    for point in metric.data.data_points:
                        value = (point.count, point.sum) if hasattr(point, "count") else point.value
                        points.append((dict(point.attributes), value))
        return found

    def prometheus(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """``{sample name: [(labels, value)]}`` from the scraped text."""
        text = generate_latest(self.registry).decode()
        found: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                found.setdefault(sample.name, []).append((sample.labels, sample.value))
        return found


@pytest.fixture
def read(engine: Engine) -> Iterator[Read]:
    read = Read(engine)
    previous = metrics.install(*read.sinks)
    yield read
    metrics.reset(previous)


def fail() -> None:
    raise RuntimeError("no")


def test_starts_a_failing_run_and_a_tick(engine: Engine, read: Read):
    engine.register(
        "metered",
        "1",
        lambda ctx, i: ctx.step("call", fail, retries=1, backoff=0),
        concurrency=QUOTA,
    )
    engine.start("metered", 1)
    with pytest.raises(ConcurrencyLimitError):
        engine.start("metered", 2)
    run_until_idle(engine)  # the step fails, to be retried at once
    result = engine.tick()
    assert result.woken == 1
    run_until_idle(engine)  # it fails again: the run fails
    engine.start("metered", 3)  # holds the key's slot

    otel = read.otel()
    assert sorted(
        (a["durable.outcome"], a.get("durable.reason"), v) for a, v in otel["durable.starts"]
    ) == [
        ("admitted", None, 2),
        ("refused", "limit", 1),
    ]
    assert all(a["durable.workflow"] == "metered" for a, _ in otel["durable.starts"])
    assert sorted((a["durable.outcome"], v) for a, v in otel["durable.step.failures"]) == [
        ("failed", 1),
        ("retry", 1),
    ]
    [(attributes, (count, seconds))] = otel["durable.run.duration"]
    assert attributes == {"durable.workflow": "metered", "durable.outcome": "failed"}
    assert count == 1 and seconds >= 0
    [(attributes, (count, _))] = otel["durable.run.queue_lag"]
    assert attributes == {"durable.workflow": "metered"} and count == 1  # its first claim only
    assert otel["durable.tick.items"] == [({"durable.kind": "woken"}, 1)]
    assert otel["durable.quota.usage"] == [({"durable.key": "k"}, 1)]
    assert "durable.lease.losses" not in otel

    scraped = read.prometheus()
    assert sorted(
        (labels["outcome"], labels["reason"], value)
        for labels, value in scraped["durable_starts_total"]
    ) == [("admitted", "", 2.0), ("refused", "limit", 1.0)]
    failures = scraped["durable_step_failures_total"]
    assert sorted((labels["outcome"], value) for labels, value in failures) == [
        ("failed", 1.0),
        ("retry", 1.0),
    ]
    assert scraped["durable_run_duration_seconds_count"] == [
        ({"workflow": "metered", "outcome": "failed"}, 1.0)
    ]
    assert scraped["durable_run_queue_lag_seconds_count"] == [({"workflow": "metered"}, 1.0)]
    assert scraped["durable_tick_items_total"] == [({"kind": "woken"}, 1.0)]
    assert scraped["durable_quota_units"] == [({"key": "k"}, 1.0)]


def test_a_lease_lost_and_a_cancelled_run(engine: Engine, read: Read):
    def body(ctx: Any, i: Any) -> None:
        ctx.step("cancel", lambda: engine.cancel(ctx.run_id))
        ctx.step("never", lambda: None)

    engine.register("cancelled", "1", body)
    engine.start("cancelled")
    run_until_idle(engine)
    otel = read.otel()
    assert otel["durable.lease.losses"] == [({"durable.workflow": "cancelled"}, 1)]
    [(attributes, _)] = otel["durable.run.duration"]
    assert attributes == {"durable.workflow": "cancelled", "durable.outcome": "cancelled"}
    scraped = read.prometheus()
    assert scraped["durable_lease_losses_total"] == [({"workflow": "cancelled"}, 1.0)]


def test_an_existing_run_id_and_a_batch(engine: Engine, read: Read):
    engine.register("metered", "1", lambda ctx, i: i, concurrency=QUOTA)
    engine.start("metered", 1, "same")
    engine.start("metered", 1, "same")
    batch = engine.start_many("metered", [2, 3])
    assert len(batch.refused) == 2
    outcomes = sorted(
        (labels["outcome"], value) for labels, value in read.prometheus()["durable_starts_total"]
    )
    assert outcomes == [("admitted", 1.0), ("existing", 1.0), ("refused", 2.0)]


@pytest.fixture
def memory_read(memory_engine: Engine) -> Iterator[Read]:
    read = Read(memory_engine)
    previous = metrics.install(*read.sinks)
    yield read
    metrics.reset(previous)


def test_a_start_that_waited(memory_engine: Engine, memory_read: Read):
    memory_engine.register("metered", "1", lambda ctx, i: i, concurrency=QUOTA)
    memory_engine.start("metered", 1)
    with pytest.raises(ConcurrencyLimitError):
        memory_engine.start("metered", 2, wait=0.2)
    run_until_idle(memory_engine)
    memory_engine.start("metered", 3, wait=5)
    [(attributes, (count, seconds))] = [
        (a, v)
        for a, v in memory_read.otel()["durable.start.wait.duration"]
        if a["durable.outcome"] == "refused"
    ]
    assert attributes["durable.workflow"] == "metered" and count == 1 and seconds >= 0.2
    scraped = memory_read.prometheus()["durable_start_wait_seconds_count"]
    assert sorted((labels["outcome"], value) for labels, value in scraped) == [
        ("admitted", 1.0),
        ("refused", 1.0),
    ]


def test_the_gauge_reports_the_busiest_keys_only(memory_engine: Engine):
    memory_engine.register(
        "keyed", "1", lambda ctx, i: i, concurrency={"key": lambda i: i["key"], "limit": 5}
    )
    for key, count in (("a", 1), ("b", 3), ("c", 2)):
        for _ in range(count):
            memory_engine.start("keyed", {"key": key})
    assert metrics.busiest_keys(memory_engine, 2) == [("b", 3), ("c", 2)]
    read = Read(memory_engine, quota_keys=2)
    assert sorted(read.otel()["durable.quota.usage"], key=lambda point: point[1]) == [
        ({"durable.key": "c"}, 2),
        ({"durable.key": "b"}, 3),
    ]
    assert read.prometheus()["durable_quota_units"] == [({"key": "b"}, 3.0), ({"key": "c"}, 2.0)]


def test_no_library_records_nothing(memory_engine: Engine):
    previous = metrics.install()
    try:
        memory_engine.register("wf", "1", lambda ctx, i: i)
        assert metrics.MetricsObserver not in map(type, observers())  # no cost at a start
        memory_engine.start("wf")  # nothing to record to, and nothing fails
    finally:
        metrics.reset(previous)


def test_a_rate_limit_refusal_counts_with_its_own_reason(engine: Engine, read: Read):
    engine.register(
        "rated", "1", lambda ctx, i: 1, rate_limit=RateLimit(key=lambda i: "r", limit=1, per=60)
    )
    engine.start("rated", 1)
    with pytest.raises(RateLimitError):
        engine.start("rated", 2)
    otel = read.otel()
    assert sorted(
        (a["durable.outcome"], a.get("durable.reason"), v) for a, v in otel["durable.starts"]
    ) == [("admitted", None, 1), ("refused", "rate", 1)]
    scraped = read.prometheus()
    assert sorted(
        (labels["outcome"], labels["reason"], value)
        for labels, value in scraped["durable_starts_total"]
    ) == [("admitted", "", 1.0), ("refused", "rate", 1.0)]


@pytest.mark.parametrize("value", ["prometheus", ["statsd"], [1]])
def test_a_bad_setting_is_refused_by_name(value: Any):
    with (
        override_settings(DURABLE={"METRICS": value}),
        pytest.raises(ImproperlyConfigured, match=r"DURABLE\['METRICS'\]"),
    ):
        metrics.configured_libraries()


def test_the_setting_chooses_the_libraries():
    previous = metrics.install()
    try:
        with override_settings(DURABLE={"METRICS": []}):
            metrics.reset()
            assert metrics._active() == ()
        with override_settings(DURABLE={"METRICS": ["opentelemetry"]}):
            metrics.reset()
            [sink] = metrics._active()
            assert isinstance(sink, OpenTelemetryMetrics)
    finally:
        metrics.reset(previous)


def test_the_view_serves_the_default_registry(orm_engine: Engine):
    """Outside multiprocess mode, ``metrics_view`` serves prometheus_client's default
    registry, where the metrics ``DURABLE["METRICS"]`` chose are registered."""
    previous = metrics.install()
    try:
        metrics.reset()  # chosen from the settings: both libraries, the default registry
        orm_engine.register("served", "1", lambda ctx, i: i)
        orm_engine.start("served")
        response = metrics_view(RequestFactory().get("/metrics"))
    finally:
        metrics.reset(previous)
    assert response["Content-Type"].startswith("text/plain")
    samples = [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if sample.name == "durable_starts_total" and sample.labels["workflow"] == "served"
    ]
    labels = {"workflow": "served", "outcome": "admitted", "reason": ""}
    assert samples == [("durable_starts_total", labels, 1.0)]


class Broken:
    """A sink that fails at every measurement."""

    def add(self, metric: metrics.Metric, amount: float, labels: tuple[str, ...]) -> None:
        raise RuntimeError("the sink is down")

    def record(self, metric: metrics.Metric, value: float, labels: tuple[str, ...]) -> None:
        raise RuntimeError("the sink is down")


def test_a_failing_sink_changes_nothing_the_engine_does(
    memory_engine: Engine, caplog: pytest.LogCaptureFixture
):
    engine = memory_engine
    engine.register("metered", "1", lambda ctx, i: ctx.step("call", fail), concurrency=QUOTA)
    previous = metrics.install(Broken())
    try:
        handle = engine.start("metered", 1)
        with pytest.raises(ConcurrencyLimitError):  # the refusal, not the sink's error
            engine.start("metered", 2, wait=0.1)
        run_until_idle(engine)  # claimed, a step failed, the run failed
        assert engine.get_run(handle.run_id).status == "failed"
        assert engine.cancel(engine.start("metered", 3).run_id)  # the slot was freed
    finally:
        metrics.reset(previous)
    failed = {
        record.getMessage() for record in caplog.records if record.name == "durable_django.metrics"
    }
    assert {
        "could not record the metric durable.starts",
        "could not record the metric durable.start.wait.duration",
        "could not record the metric durable.run.queue_lag",
        "could not record the metric durable.step.failures",
        "could not record the metric durable.run.duration",
    } <= failed


def test_the_system_check_names_a_bad_setting():
    with override_settings(DURABLE={"METRICS": ["statsd"]}):
        [error] = metrics.check_setting()
    assert error.id == "durable_django.E010" and "statsd" in error.msg
    with override_settings(DURABLE={"METRICS": []}):
        assert metrics.check_setting() == []


def test_a_library_that_fails_to_load_records_nothing(
    memory_engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """An OpenTelemetry API too old for the histograms' bucket advice, say."""

    def too_old(self: OpenTelemetryMetrics, *args: Any, **kwargs: Any) -> None:
        raise TypeError("unexpected keyword argument 'explicit_bucket_boundaries_advisory'")

    monkeypatch.setattr(OpenTelemetryMetrics, "__init__", too_old)
    previous = metrics.install()
    try:
        with override_settings(DURABLE={"METRICS": ["opentelemetry"]}):
            metrics.reset()
            memory_engine.register("wf", "1", lambda ctx, i: i)
            memory_engine.start("wf")
            assert metrics._active() == ()
    finally:
        metrics.reset(previous)
    assert "no metric is recorded to opentelemetry" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_reading_the_quota_gauge_keeps_the_threads_open_connection_and_closes_its_own(
    orm_engine: Engine,
):
    """A scrape in a request's thread keeps the request's connection (persistent
    connections stay persistent); a thread that had none open is left with none."""
    import threading

    from django.db import connection

    connection.ensure_connection()
    kept = connection.connection
    metrics.observed_usage(orm_engine, 5)
    assert connection.connection is kept

    left_open: list[bool] = []

    def scrape() -> None:
        metrics.observed_usage(orm_engine, 5)
        left_open.append(connection.connection is not None)

    thread = threading.Thread(target=scrape)
    thread.start()
    thread.join()
    assert left_open == [False]
