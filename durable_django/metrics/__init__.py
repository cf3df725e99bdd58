"""durable_django's metrics: what each one is, and the functions the engine records them with.

The metrics go to the libraries named in ``DURABLE["METRICS"]`` that are installed:
OpenTelemetry's API (the ``otel`` extra, :mod:`durable_django.metrics.opentelemetry`) and
prometheus_client (the ``prometheus`` extra, :mod:`durable_django.metrics.prometheus`).
Neither is imported until the first metric is recorded, nor at all when it is not
installed. Most metrics are recorded by :class:`MetricsObserver`, an observer of the
engine's moments (:mod:`durable_django.observability.events`), in place only while a
library may be recorded to; with none installed, the three recorded outside the seam (a
run's end, its first claim, a start's wait) cost a check of an empty tuple.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from ..concurrency import DEFAULT_CONCURRENCY_STATUSES
from ..conf import durable_settings
from ..db import closing_what_it_opens
from ..errors import ConcurrencyLimitError
from ..observability.events import (
    AfterTurn,
    Observer,
    StartEvent,
    StepEvent,
    TurnEvent,
    forget,
    observe,
)
from ..records import RunRecord, StepRecord

if TYPE_CHECKING:
    from ..engines import Engine
    from ..tick import TickResult

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

_sinks: tuple[Sink, ...] | None = None


def install(*sinks: Sink) -> tuple[Sink, ...] | None:
    """Record the process's metrics to ``sinks`` from now on, in place of those
    ``DURABLE["METRICS"]`` chooses; returns the sinks replaced (``None``: not chosen
    yet). ``install()`` with no sink records nothing."""
    global _sinks
    previous, _sinks = _sinks, sinks
    _observed()
    return previous


def reset(previous: tuple[Sink, ...] | None = None) -> None:
    """Put back the sinks :func:`install` returned (``None``: chosen again from the
    settings at the next metric)."""
    global _sinks
    _sinks = previous
    _observed()


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


@checks.register()
def check_setting(**kwargs: Any) -> list[checks.CheckMessage]:
    """``durable_django.E010``: ``DURABLE["METRICS"]`` is not a list of known libraries."""
    try:
        configured_libraries()
    except ImproperlyConfigured as error:
        return [checks.Error(str(error), id="durable_django.E010")]
    return []


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):  # its parent package is missing, or hidden
        return False


def _any_installed() -> bool:
    return any(_installed(module) for module in LIBRARIES.values())


def _chosen() -> tuple[Sink, ...]:
    """The sinks of the libraries ``DURABLE["METRICS"]`` names that are installed,
    made once per process. A bad setting (the system check ``durable_django.E010``) or a
    library that fails to load (too old a version) is logged and records nothing: never
    an error raised into a start or a turn."""
    global _sinks
    sinks: list[Sink] = []
    try:
        names = configured_libraries()
    except ImproperlyConfigured:
        logger.exception("no metric is recorded")
        names = []
    for name in names:
        if _installed(LIBRARIES[name]):
            try:
                sinks.append(_made(name))
            except Exception:
                logger.exception("no metric is recorded to %s", name)
    _sinks = tuple(sinks)
    _observed()
    return _sinks


def _made(library: str) -> Sink:
    """The sink of one library of :data:`LIBRARIES`."""
    if library == "opentelemetry":
        from .opentelemetry import OpenTelemetryMetrics

        return OpenTelemetryMetrics()
    from .prometheus import default_metrics

    return default_metrics()


def _active() -> tuple[Sink, ...]:
    return _chosen() if _sinks is None else _sinks


# recording ------------------------------------------------------------------------------


def _add(metric: Metric, amount: float, labels: tuple[str, ...]) -> None:
    """Add to a counter in every sink; a sink's failure is logged, never raised into the
    engine (a start, a turn's end)."""
    for sink in _active():
        try:
            sink.add(metric, amount, labels)
        except Exception:
            logger.exception("could not record the metric %s", metric.name)


def _record(metric: Metric, value: float, labels: tuple[str, ...]) -> None:
    """Record in a histogram in every sink, as :func:`_add` does."""
    for sink in _active():
        try:
            sink.record(metric, value, labels)
        except Exception:
            logger.exception("could not record the metric %s", metric.name)


@contextlib.contextmanager
def waited(workflow: str) -> Iterator[None]:
    """Around a start with ``wait=``: how long it waited, ``admitted`` or ``refused``
    (by its quota; another error records nothing)."""
    began = time.monotonic()
    try:
        yield
    except ConcurrencyLimitError:
        _record(START_WAIT, time.monotonic() - began, (workflow, "refused"))
        raise
    _record(START_WAIT, time.monotonic() - began, (workflow, "admitted"))


def run_ended(run: RunRecord, outcome: str) -> None:
    """``run`` ended now: ``outcome`` is its terminal status."""
    if _active() and run.created_at is not None:
        seconds = (timezone.now() - run.created_at).total_seconds()
        _record(RUN_DURATION, seconds, (run.workflow, outcome))


def run_claimed(run: RunRecord, steps: Sequence[StepRecord], now: datetime.datetime) -> None:
    """A worker claimed ``run`` at ``now``, with its recorded ``steps``: its first claim
    when it is its first attempt and no step is recorded yet."""
    if _active() and run.attempt == 1 and not steps and run.created_at is not None:
        _record(QUEUE_LAG, (now - run.created_at).total_seconds(), (run.workflow,))


class MetricsObserver(Observer):
    """Records the metrics of the engine's moments (:mod:`durable_django.observability`):
    a start's decision, a turn that lost its lease, a failed step attempt, a tick."""

    def start(self, start: StartEvent) -> _Decided:
        return _Decided(start)

    def turn(self, turn: TurnEvent) -> AfterTurn:
        return AfterTurn(turn, _count_lease_loss)

    def step_failed(self, step: StepEvent) -> None:
        outcome = "failed" if step.retry_in is None else "retry"
        _add(STEP_FAILURES, 1, (step.run.workflow, outcome))

    def refused(self, start: str, error: ConcurrencyLimitError) -> None:
        _add(STARTS, 1, (start, "refused", "held" if error.held else "limit"))

    def ticked(self, result: TickResult) -> None:
        for kind in result.__dataclass_fields__:
            count = getattr(result, kind)
            if count:
                _add(TICK_ITEMS, count, (kind,))


class _Decided:
    """Around a start: once decided, the runs it admitted, created or found
    (``existing``). Its refusals are counted as they are announced
    (:meth:`MetricsObserver.refused`). A class, not a generator: a start pays for it."""

    __slots__ = ("start",)

    def __init__(self, start: StartEvent) -> None:
        self.start = start

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        start = self.start
        if kind is not None or not start.run_ids:
            return
        if start.created:
            _add(STARTS, start.created, (start.workflow, "admitted", ""))
        if len(start.run_ids) > start.created:
            _add(STARTS, len(start.run_ids) - start.created, (start.workflow, "existing", ""))


def _count_lease_loss(turn: TurnEvent) -> None:
    """Counts a turn that stopped because its worker lost the run."""
    if turn.outcome == "lease_lost":
        _add(LEASE_LOSSES, 1, (turn.run.workflow,))


def busiest_keys(engine: Engine | None = None, limit: int = QUOTA_KEYS) -> list[tuple[str, int]]:
    """``[(key, units in use)]`` of the ``limit`` busiest quota keys, busiest first (of
    the engine's namespace when it scopes its reads): one grouped count by the store.
    What the gauge ``durable.quota.usage`` reports."""
    if engine is None:
        from ..engines import default_engine

        engine = default_engine
    keys = engine.store.quota_keys(DEFAULT_CONCURRENCY_STATUSES, engine.read_namespace)
    units = sorted(
        ((key, sum(by_workflow.values())) for key, by_workflow in keys.items()),
        key=lambda item: (-item[1], item[0]),
    )
    return units[:limit]


def observed_usage(engine: Engine | None, limit: int) -> Sequence[tuple[str, int]]:
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


_OBSERVER = MetricsObserver()


def _observed() -> None:
    """The observer in place while metrics may be recorded: sinks installed or chosen,
    or (not chosen yet: the settings are read at the first moment) a library installed."""
    recording = _any_installed() if _sinks is None else bool(_sinks)
    (observe if recording else forget)(_OBSERVER)


_observed()

__all__ = [
    "METRICS",
    "QUOTA_KEYS",
    "Metric",
    "MetricsObserver",
    "Sink",
    "busiest_keys",
    "install",
    "reset",
]
