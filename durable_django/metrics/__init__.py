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
import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from django.utils import timezone

from .._core.records import RunRecord, StepRecord
from ..errors import ConcurrencyLimitError, RateLimitError
from ..observability.events import (
    AfterTurn,
    Observer,
    StartEvent,
    StepEvent,
    TurnEvent,
    forget,
    observe,
)
from .catalogue import (
    LEASE_LOSSES,
    LIBRARIES,
    METRICS,
    QUEUE_LAG,
    QUOTA_KEYS,
    RUN_DURATION,
    START_WAIT,
    STARTS,
    STEP_FAILURES,
    TICK_ITEMS,
    Metric,
    Sink,
    busiest_keys,
    check_setting,
    chosen_libraries,
    configured_libraries,
    installed,
    observed_usage,
    read_by_default,
)

if TYPE_CHECKING:
    from .._core.records import TickResult

logger = logging.getLogger("durable_django.metrics")

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


def _any_installed() -> bool:
    return any(installed(module) for module in LIBRARIES.values())


def _chosen() -> tuple[Sink, ...]:
    """The sinks of the libraries ``DURABLE["METRICS"]`` names that are installed,
    made once per process. A bad setting (the system check ``durable_django.E010``) or a
    library that fails to load (too old a version) is logged and records nothing: never
    an error raised into a start or a turn."""
    global _sinks
    sinks: list[Sink] = []
    for name in chosen_libraries():
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
        _add(STARTS, 1, (start, "refused", refusal_reason(error)))

    def ticked(self, result: TickResult) -> None:
        for kind in result.__dataclass_fields__:
            count = getattr(result, kind)
            if count:
                _add(TICK_ITEMS, count, (kind,))


def refusal_reason(error: ConcurrencyLimitError) -> str:
    """The ``reason`` of a refused start: ``rate`` (a rate limit's window is full),
    ``held`` (units of a fair quota's limit held for older tickets) or ``limit``."""
    if isinstance(error, RateLimitError):
        return "rate"
    return "held" if error.held else "limit"


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
    "check_setting",
    "configured_libraries",
    "install",
    "observed_usage",
    "read_by_default",
    "reset",
]
