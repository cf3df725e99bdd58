"""The metrics as prometheus_client metrics (the ``prometheus`` extra), and a view to
scrape them.

Counters and histograms are prometheus_client's own, so its multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR`` set before the processes start: Celery's prefork pool,
gunicorn's workers) works as it does for any metric. The gauge of quota usage is read
from the store when scraped (:class:`QuotaCollector`), in the process that serves the
scrape.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric as Family
from prometheus_client.registry import Collector

from .catalogue import (
    METRICS,
    QUOTA_KEYS,
    QUOTA_USAGE,
    SECONDS_BUCKETS,
    Metric,
    chosen_libraries,
    observed_usage,
)

if TYPE_CHECKING:
    from .._core.runtime import Runtime


class QuotaCollector(Collector):
    """The gauge ``durable_quota_units``: the units in use of the ``limit`` busiest
    quota keys of ``engine`` (the default engine), one grouped count by the store at
    each scrape."""

    def __init__(self, engine: Runtime | None = None, limit: int = QUOTA_KEYS) -> None:
        self.engine = engine
        self.limit = limit

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            QUOTA_USAGE.prometheus, QUOTA_USAGE.description, labels=QUOTA_USAGE.labels
        )

    def describe(self) -> Iterator[Family]:
        # Registering the collector names its metric without reading the store.
        yield self._family()

    def collect(self) -> Iterator[Family]:
        family = self._family()
        for key, units in observed_usage(self.engine, self.limit):
            family.add_metric([key], units)
        yield family


class PrometheusMetrics:
    """A sink registering durable_django's metrics in ``registry`` (prometheus_client's
    default one by default), with the gauge of quota usage (:class:`QuotaCollector`)
    unless ``quota_keys`` is 0 or the process is in multiprocess mode (the scrape then
    reads the files of every process: see :func:`scrape_registry`)."""

    def __init__(
        self,
        registry: CollectorRegistry = REGISTRY,
        *,
        engine: Runtime | None = None,
        quota_keys: int = QUOTA_KEYS,
    ) -> None:
        self._metrics: dict[str, Any] = {}
        for metric in METRICS:
            if metric.kind == "counter":
                self._metrics[metric.name] = Counter(
                    metric.prometheus, metric.description, metric.labels, registry=registry
                )
            elif metric.kind == "histogram":
                self._metrics[metric.name] = Histogram(
                    metric.prometheus,
                    metric.description,
                    metric.labels,
                    registry=registry,
                    buckets=SECONDS_BUCKETS,
                )
        if quota_keys and not multiprocess_mode():
            registry.register(QuotaCollector(engine, quota_keys))

    def add(self, metric: Metric, amount: float, labels: tuple[str, ...]) -> None:
        self._metrics[metric.name].labels(*labels).inc(amount)

    def record(self, metric: Metric, value: float, labels: tuple[str, ...]) -> None:
        self._metrics[metric.name].labels(*labels).observe(value)


@functools.cache
def default_metrics() -> PrometheusMetrics:
    """The sink on prometheus_client's default registry, made once per process."""
    return PrometheusMetrics()


def multiprocess_mode() -> bool:
    """Whether prometheus_client keeps its values in ``PROMETHEUS_MULTIPROC_DIR``."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def scrape_registry(engine: Runtime | None = None) -> CollectorRegistry:
    """The registry to serve: in multiprocess mode a new one reading every process's
    files, with the gauge of quota usage; else prometheus_client's default registry."""
    if not multiprocess_mode():
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry.register(QuotaCollector(engine))
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``/metrics`` for Prometheus: :func:`scrape_registry` in its text format. Route it
    where only the scraper reaches it (it is not authenticated)."""
    if "prometheus" in chosen_libraries():
        default_metrics()  # the metrics are registered before the first is recorded
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)


__all__ = [
    "PrometheusMetrics",
    "QuotaCollector",
    "default_metrics",
    "metrics_view",
    "multiprocess_mode",
    "scrape_registry",
]
