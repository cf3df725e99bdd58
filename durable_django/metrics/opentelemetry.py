"""The metrics recorded through OpenTelemetry's metrics API (the ``otel`` extra).

They go to the meter provider the project configures (``opentelemetry-sdk`` and an
exporter, or the OpenTelemetry distro); until one is set, the API's no-op provider drops
them. The meter is named ``durable_django``.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics as otel

from .catalogue import (
    METRICS,
    QUOTA_KEYS,
    QUOTA_USAGE,
    SECONDS_BUCKETS,
    Metric,
    observed_usage,
)

if TYPE_CHECKING:
    from .._core.runtime import Runtime


def _version() -> str:
    try:
        return version("durable-django")
    except PackageNotFoundError:  # a checkout on the path, not installed
        return ""


class OpenTelemetryMetrics:
    """A sink making durable_django's instruments on ``meter_provider`` (the global one
    by default). The gauge ``durable.quota.usage`` reports the ``quota_keys`` busiest
    keys of ``engine`` (the default engine), read when the provider collects; 0 leaves
    the gauge out."""

    def __init__(
        self,
        meter_provider: otel.MeterProvider | None = None,
        *,
        engine: Runtime | None = None,
        quota_keys: int = QUOTA_KEYS,
    ) -> None:
        meter = otel.get_meter("durable_django", _version(), meter_provider=meter_provider)
        self.engine = engine
        self.quota_keys = quota_keys
        self._instruments: dict[str, Any] = {}
        for metric in METRICS:
            if metric.kind == "counter":
                self._instruments[metric.name] = meter.create_counter(
                    metric.name, metric.unit, metric.description
                )
            elif metric.kind == "histogram":
                self._instruments[metric.name] = meter.create_histogram(
                    metric.name,
                    metric.unit,
                    metric.description,
                    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
                )
            elif quota_keys:
                meter.create_observable_gauge(
                    metric.name, [self._observe_usage], metric.unit, metric.description
                )

    def add(self, metric: Metric, amount: float, labels: tuple[str, ...]) -> None:
        self._instruments[metric.name].add(amount, _attributes(metric, labels))

    def record(self, metric: Metric, value: float, labels: tuple[str, ...]) -> None:
        self._instruments[metric.name].record(value, _attributes(metric, labels))

    def _observe_usage(self, options: otel.CallbackOptions) -> Iterable[otel.Observation]:
        (attribute,) = QUOTA_USAGE.attributes
        return [
            otel.Observation(units, {attribute: key})
            for key, units in observed_usage(self.engine, self.quota_keys)
        ]


def _attributes(metric: Metric, labels: tuple[str, ...]) -> dict[str, str]:
    """The attributes of one measurement; a label left empty is left out."""
    return {name: value for name, value in zip(metric.attributes, labels, strict=True) if value}


__all__ = ["OpenTelemetryMetrics"]
