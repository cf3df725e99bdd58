"""What each metric is, the setting choosing the libraries they go to, and the gauge of
quota usage: what the libraries' sinks (:mod:`durable_django.metrics.opentelemetry`,
:mod:`durable_django.metrics.prometheus`) and the recording functions
(:mod:`durable_django.metrics`) share. Importable without either library.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .._rules.concurrency import DEFAULT_CONCURRENCY_STATUSES
from ..conf import durable_settings
from ..db import closing_what_it_opens

if TYPE_CHECKING:
    from .._core.runtime import Runtime

logger = logging.getLogger("durable_django.metrics")

#: How many quota keys the gauge ``durable.quota.usage`` reports at most: the busiest.
QUOTA_KEYS = 20

#: Histogram buckets, in seconds, from a quick start to an hour-long run.
SECONDS_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric: its OpenTelemetry ``name``, ``kind`` (``counter``, ``histogram`` or
    ``gauge``), ``unit`` (UCUM, as OpenTelemetry writes it), ``description``, the
    ``labels`` it is recorded with (OpenTelemetry attribute ``durable.<label>``,
    Prometheus label ``<label>``) and its ``prometheus`` name."""

    name: str
    kind: str
    unit: str
    description: str
    labels: tuple[str, ...]
    prometheus: str

    @property
    def attributes(self) -> tuple[str, ...]:
        """The OpenTelemetry attribute names of :attr:`labels`."""
        return tuple(f"durable.{label}" for label in self.labels)


STARTS = Metric(
    "durable.starts",
    "counter",
    "{start}",
    "Starts decided under their quotas: admitted, refused, or finding their run id taken.",
    ("workflow", "outcome", "reason"),
    "durable_starts_total",
)
START_WAIT = Metric(
    "durable.start.wait.duration",
    "histogram",
    "s",
    "How long a start with wait= waited for a slot, until admitted or refused.",
    ("workflow", "outcome"),
    "durable_start_wait_seconds",
)
QUOTA_USAGE = Metric(
    "durable.quota.usage",
    "gauge",
    "{unit}",
    f"Units in use of each quota key (the {QUOTA_KEYS} busiest keys).",
    ("key",),
    "durable_quota_units",
)
RUN_DURATION = Metric(
    "durable.run.duration",
    "histogram",
    "s",
    "From a run's creation to its end: completed, failed or cancelled.",
    ("workflow", "outcome"),
    "durable_run_duration_seconds",
)
QUEUE_LAG = Metric(
    "durable.run.queue_lag",
    "histogram",
    "s",
    "From a run's creation to its first claim by a worker.",
    ("workflow",),
    "durable_run_queue_lag_seconds",
)
STEP_FAILURES = Metric(
    "durable.step.failures",
    "counter",
    "{failure}",
    "Failed step attempts: to be retried, or failing the step for good.",
    ("workflow", "outcome"),
    "durable_step_failures_total",
)
LEASE_LOSSES = Metric(
    "durable.lease.losses",
    "counter",
    "{turn}",
    "Turns stopped because their worker no longer held the run.",
    ("workflow",),
    "durable_lease_losses_total",
)
TICK_ITEMS = Metric(
    "durable.tick.items",
    "counter",
    "{item}",
    "What the tick handed on or fired, by kind (the fields of TickResult).",
    ("kind",),
    "durable_tick_items_total",
)

#: Every metric, in the order the documentation lists them.
METRICS = (
    STARTS,
    START_WAIT,
    QUOTA_USAGE,
    RUN_DURATION,
    QUEUE_LAG,
    STEP_FAILURES,
    LEASE_LOSSES,
    TICK_ITEMS,
)


class Sink(Protocol):
    """Where recorded metrics go: one per metrics library."""

    def add(self, metric: Metric, amount: float, labels: tuple[str, ...]) -> None:
        """Add ``amount`` to a counter."""

    def record(self, metric: Metric, value: float, labels: tuple[str, ...]) -> None:
        """Record ``value`` in a histogram."""


#: The libraries ``DURABLE["METRICS"]`` may name, with the module each needs.
LIBRARIES = {"opentelemetry": "opentelemetry.metrics", "prometheus": "prometheus_client"}


def configured_libraries() -> list[str]:
    """The libraries ``DURABLE["METRICS"]`` names, checked: a list or tuple of names of
    :data:`LIBRARIES`."""
    value = durable_settings()["METRICS"]
    if not isinstance(value, list | tuple) or not all(isinstance(name, str) for name in value):
        raise ImproperlyConfigured(
            f"DURABLE['METRICS'] must be a list of library names, not {value!r}"
        )
    unknown = sorted(set(value) - set(LIBRARIES))
    if unknown:
        raise ImproperlyConfigured(
            f"DURABLE['METRICS'] names unknown metrics librar(ies) {unknown}; "
            f"known: {sorted(LIBRARIES)}"
        )
    return list(value)


def chosen_libraries() -> list[str]:
    """The libraries of :func:`configured_libraries` that are installed; none, logged,
    when the setting is bad (the system check ``durable_django.E010`` reports it)."""
    try:
        names = configured_libraries()
    except ImproperlyConfigured:
        logger.exception("no metric is recorded")
        return []
    return [name for name in names if installed(LIBRARIES[name])]


@checks.register()
def check_setting(**kwargs: Any) -> list[checks.CheckMessage]:
    """``durable_django.E010``: ``DURABLE["METRICS"]`` is not a list of known libraries."""
    try:
        configured_libraries()
    except ImproperlyConfigured as error:
        return [checks.Error(str(error), id="durable_django.E010")]
    return []


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):  # its parent package is missing, or hidden
        return False


#: The engine the gauge reads when given none: the default engine, once
#: :mod:`durable_django.engines` has made it.
_default_engine: list[Runtime] = []


def read_by_default(engine: Runtime) -> None:
    """Make ``engine`` the one :func:`busiest_keys` reads when given none."""
    _default_engine[:] = [engine]


def busiest_keys(engine: Runtime | None = None, limit: int = QUOTA_KEYS) -> list[tuple[str, int]]:
    """``[(key, units in use)]`` of the ``limit`` busiest quota keys, busiest first (of
    the engine's namespace when it scopes its reads; the default engine's by default):
    one grouped count by the store. What the gauge ``durable.quota.usage`` reports."""
    if engine is None:
        if not _default_engine:
            raise LookupError("no default engine: import durable_django.engines first")
        engine = _default_engine[0]
    keys = engine.store.quota_keys(DEFAULT_CONCURRENCY_STATUSES, engine.read_namespace)
    units = sorted(
        ((key, sum(by_workflow.values())) for key, by_workflow in keys.items()),
        key=lambda item: (-item[1], item[0]),
    )
    return units[:limit]


def observed_usage(engine: Runtime | None, limit: int) -> Sequence[tuple[str, int]]:
    """:func:`busiest_keys` as a collector reads it, from whichever thread collects (an
    exporter's, a scrape's): a failure is logged and reports no key, and the thread's
    connections are closed after (outside a transaction), so that a thread which never
    comes back to the database, or a scrape's, keeps none open (the connections it opened
    are closed after; one the thread had open, a request's, is kept)."""
    try:
        with closing_what_it_opens():
            return busiest_keys(engine, limit)
    except Exception:
        logger.warning("could not read the quota usage for the metrics", exc_info=True)
        return ()
