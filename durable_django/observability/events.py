"""The observability seam: the moments of the engine that logs, spans and metrics see.

The engine calls this module, and only this module, at the moments that matter; what
observes them plugs in here as an :class:`Observer` (:func:`observe`). The log lines
(:mod:`~durable_django.observability.logs`) and the OpenTelemetry spans
(:mod:`~durable_django.observability.spans`, when ``opentelemetry-api`` is installed)
are two such observers; metrics may be a third.

The contract, for an observer:

- **Around** a moment (a context manager, entered before, exited after; the engine's code
  runs inside, so a span made current there is the parent of what it does, the database
  statements of a start included):

  - :meth:`Observer.start`: a start's admission in the store, single (``kind``
    ``"start"``, ``"child"``, ``"retry"``) or a batch (``"batch"``), with its
    :class:`StartEvent` (workflow, namespace, quotas: keys, limits, weights; the seconds
    already ``waited`` by a start with ``wait=``). When the block exits the decision is
    filled in: ``run_ids`` and ``created`` for the admitted runs (an idempotent re-start
    is admitted, not created), ``refused`` for the refusals, each a
    :class:`~durable_django.ConcurrencyLimitError` with its ``active`` and its
    ``retry_after`` already explained. Any other exception passes through the block.
  - :meth:`Observer.turn`: a worker's turn of a run, from just after the claim to the
    end written (:class:`TurnEvent`: the run as claimed, ``claimed_at``). On exit,
    ``outcome`` is one of :data:`TURN_OUTCOMES`, and ``error`` the exception that failed
    the run when it was raised in this turn (``None`` for a failure replayed from the
    record, or one of the turn's end).
  - :meth:`Observer.step`: one attempt of a step's function (:class:`StepEvent`:
    the turn, the step's name, ``attempt``, ``kind`` ``"step"`` or ``"transaction"``),
    around the user's code only. An exception of the function passes through the block,
    as it was raised.

- **At** a moment (a plain call):

  - :meth:`Observer.step_failed`: a step attempt failed, with what happens next
    (:class:`StepEvent` with ``error``, and ``retry_in``: the seconds until the next
    attempt, ``None`` when the step has failed for good and raises ``StepError`` into
    the body). Called while the exception is handled, so ``sys.exc_info()`` is it.
  - :meth:`Observer.refused`: a start refused, once its ``retry_after`` is explained
    (for each refusal of a batch too).
  - :meth:`Observer.subscriber_skipped`: an event's subscriber not started (refused, or
    its quota could not be resolved on the payload).
  - :meth:`Observer.ticked`: what one tick did (a ``TickResult``).

An observer's method that raises is logged (logger ``durable_django.observability``) and
does not change what the engine does. Methods run in the engine's thread, inside its
transaction where there is one (a start's): keep them quick, and never write to the
database.

Cost: the engine asks for a moment's observation only from the observers that override
its method (:func:`observe` sorts them once); with none, a call returns a shared no-op
at once and builds no event. The log observer overrides only the failure moments, so the
happy path pays for nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from .._core.records import RunRecord
from ..errors import ConcurrencyLimitError

if TYPE_CHECKING:
    from .._rules.concurrency import Quota

logger = logging.getLogger("durable_django.observability")

_T = TypeVar("_T")

#: How a turn ends: the run's status after it (``completed``, ``failed``, ``suspended``),
#: ``blocked`` (its version is not registered here), ``handed_back`` (the database went
#: away; the run is pending again, or will be once its lease lapses), ``lease_lost``
#: (cancelled, or handed on after this worker stalled: the turn recorded nothing more).
TURN_OUTCOMES = ("completed", "failed", "suspended", "blocked", "handed_back", "lease_lost")

StartKind = Literal["start", "child", "retry", "batch"]


@dataclass(slots=True, eq=False)
class StartEvent:
    """A start's admission; the decision is filled in before the block exits."""

    kind: StartKind
    workflow: str
    namespace: str
    #: The quotas checked, one per key (for a batch, the first element's quota of each key).
    quotas: tuple[Quota, ...]
    #: How many runs the start asks for (a batch's size; 1 otherwise).
    size: int = 1
    #: Seconds a start with ``wait=`` had already waited before this attempt.
    waited: float = 0.0
    #: The ids of the runs admitted (created, or found by an idempotent re-start).
    run_ids: list[str] = field(default_factory=list)
    #: How many of them this start created.
    created: int = 0
    refused: list[ConcurrencyLimitError] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class TurnEvent:
    """A worker's turn of a run; ``outcome`` and ``error`` are filled in by its end."""

    run: RunRecord
    claimed_at: datetime
    outcome: str = ""
    error: BaseException | None = None


@dataclass(slots=True, eq=False)
class StepEvent:
    """One attempt of a step; ``error`` and ``retry_in`` are set when it failed."""

    run: RunRecord
    name: str
    attempt: int
    kind: Literal["step", "transaction"]
    error: BaseException | None = None
    retry_in: float | None = None


class Observer:
    """What observes the engine: override the methods for the moments you want (the
    others cost nothing), and :func:`observe` an instance. A method around a moment
    returns a context manager, or ``None`` to let this one pass."""

    def ready(self) -> bool:
        """Whether the observer has anything to do yet (an exporter, a provider set).
        One that is not is asked again at most once a :data:`READY_CHECK_SECONDS`,
        before a start, turn or step, and costs nothing else until it says yes."""
        return True

    def start(self, start: StartEvent) -> contextlib.AbstractContextManager[Any] | None:
        """Around a start's admission."""
        return None

    def turn(self, turn: TurnEvent) -> contextlib.AbstractContextManager[Any] | None:
        """Around a worker's turn, from the claim to the end written."""
        return None

    def step(self, step: StepEvent) -> contextlib.AbstractContextManager[Any] | None:
        """Around one attempt of a step's function."""
        return None

    def step_failed(self, step: StepEvent) -> None:
        """A step attempt failed (its exception being handled)."""

    def refused(self, workflow: str, error: ConcurrencyLimitError) -> None:
        """A start of ``workflow`` was refused, ``error`` explained."""

    def subscriber_skipped(
        self, event: str, event_id: str | None, workflow: str, error: Exception
    ) -> None:
        """An event's subscriber ``workflow`` was not started."""

    def ticked(self, result: Any) -> None:
        """A tick ended (``result``: its ``TickResult``)."""


class AfterTurn:
    """What :meth:`Observer.turn` may return to act once a turn is over: calls
    ``ended(turn)`` when the turn's block exits, its outcome (and error) set."""

    __slots__ = ("ended", "turn")

    def __init__(self, turn: TurnEvent, ended: Callable[[TurnEvent], None]) -> None:
        self.turn = turn
        self.ended = ended

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exited: object) -> None:
        self.ended(self.turn)


_MOMENTS = ("start", "turn", "step", "step_failed", "refused", "subscriber_skipped", "ticked")


#: How often an observer not yet :meth:`~Observer.ready` is asked again.
READY_CHECK_SECONDS = 1.0


class _Hooks:
    """The observers' methods, per moment, of the ready observers that override it."""

    observers: ClassVar[list[Observer]] = []
    #: Observers added but not ready yet, and when to ask them again.
    waiting: ClassVar[list[Observer]] = []
    ask_at: ClassVar[float] = 0.0
    start: ClassVar[tuple[Callable[[StartEvent], Any], ...]] = ()
    turn: ClassVar[tuple[Callable[[TurnEvent], Any], ...]] = ()
    step: ClassVar[tuple[Callable[[StepEvent], Any], ...]] = ()
    step_failed: ClassVar[tuple[Callable[[StepEvent], None], ...]] = ()
    refused: ClassVar[tuple[Callable[[str, ConcurrencyLimitError], None], ...]] = ()
    subscriber_skipped: ClassVar[tuple[Callable[..., None], ...]] = ()
    ticked: ClassVar[tuple[Callable[[Any], None], ...]] = ()

    @classmethod
    def sort(cls) -> None:
        ready = [o for o in cls.observers if o not in cls.waiting]
        for moment in _MOMENTS:
            base = getattr(Observer, moment)
            methods = tuple(
                getattr(observer, moment)
                for observer in ready
                if getattr(type(observer), moment) is not base
            )
            setattr(cls, moment, methods)

    @classmethod
    def ask_waiting(cls) -> None:
        """Ask the observers not ready yet again, if it is time."""
        now = time.monotonic()
        if now < cls.ask_at:
            return
        cls.ask_at = now + READY_CHECK_SECONDS
        still = [o for o in cls.waiting if not _ready(o)]
        if len(still) != len(cls.waiting):
            cls.waiting = still
            cls.sort()


def _ready(observer: Observer) -> bool:
    try:
        return observer.ready()
    except Exception:
        logger.exception("observer %r failed", observer)
        return False


def observe(observer: Observer) -> Observer:
    """Make ``observer`` see the engine's moments in this process (once; returns it)."""
    if observer not in _Hooks.observers:
        _Hooks.observers = [*_Hooks.observers, observer]
        if not _ready(observer):
            _Hooks.waiting = [*_Hooks.waiting, observer]
            _Hooks.ask_at = time.monotonic() + READY_CHECK_SECONDS
        _Hooks.sort()
    return observer


def ask_again() -> None:
    """Ask the observers not ready yet whether they are, now (say, just after setting a
    tracer provider), instead of within :data:`READY_CHECK_SECONDS`."""
    _Hooks.ask_at = 0.0
    _Hooks.ask_waiting()


def forget(observer: Observer) -> None:
    """Stop ``observer`` seeing the engine's moments."""
    _Hooks.observers = [o for o in _Hooks.observers if o is not observer]
    _Hooks.waiting = [o for o in _Hooks.waiting if o is not observer]
    _Hooks.sort()


def observers() -> tuple[Observer, ...]:
    """The observers in place, in the order they were added."""
    return tuple(_Hooks.observers)


class _Around:
    """Enters the context managers the observers gave for one moment, in order, and exits
    them in reverse; an observer's error is logged, never raised into the engine."""

    __slots__ = ("entered", "event", "hooks")

    def __init__(self, hooks: Sequence[Callable[[Any], Any]], event: Any) -> None:
        self.hooks = hooks
        self.event = event
        self.entered: list[contextlib.AbstractContextManager[Any]] = []

    def __enter__(self) -> Any:
        for hook in self.hooks:
            try:
                manager = hook(self.event)
                if manager is not None:
                    manager.__enter__()
                    self.entered.append(manager)
            except Exception:
                logger.exception("observer %r failed", hook)
        return self.event

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for manager in reversed(self.entered):
            try:
                manager.__exit__(kind, error, trace)
            except Exception:
                logger.exception("observer %r failed", manager)


class _Starting(_Around):
    """Around a start: a refusal raised through it is the start's decision."""

    __slots__ = ()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if isinstance(error, ConcurrencyLimitError):
            self.event.refused.append(error)
        super().__exit__(kind, error, trace)


_UNOBSERVED: contextlib.nullcontext[None] = contextlib.nullcontext()

#: A start with ``wait=``: when it began (``time.monotonic()``), while it waits.
_waiting_since: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "durable_django_waiting_since", default=None
)


def start(
    kind: StartKind, workflow: str, namespace: str, quotas: Iterable[Quota], size: int = 1
) -> contextlib.AbstractContextManager[StartEvent | None]:
    """Around a start's admission under ``quotas`` (a batch's: every element's, read only
    when observed); yields its :class:`StartEvent` to fill in, or ``None`` when nothing
    observes starts."""
    if _Hooks.waiting:
        _Hooks.ask_waiting()
    if not _Hooks.start:
        return _UNOBSERVED
    since = _waiting_since.get()
    waited = 0.0 if since is None else time.monotonic() - since
    first: dict[str, Quota] = {}
    for quota in quotas:
        first.setdefault(quota.key, quota)
    event = StartEvent(kind, workflow, namespace, tuple(first.values()), size, waited)
    return _Starting(_Hooks.start, event)


@contextlib.contextmanager
def waiting() -> Any:
    """Around a start with ``wait=``: its attempts' events say how long it has waited."""
    token = _waiting_since.set(time.monotonic())
    try:
        yield
    finally:
        _waiting_since.reset(token)


def turn(run: RunRecord, claimed_at: datetime) -> contextlib.AbstractContextManager[TurnEvent]:
    """Around a worker's turn of ``run``: yields its :class:`TurnEvent`, to fill in with
    its outcome. Inside, :func:`~durable_django.current_run` tells the run."""
    if _Hooks.waiting:
        _Hooks.ask_waiting()
    return _Running(_Hooks.turn, TurnEvent(run, claimed_at), (run, None, run.attempt))


def watched(turn: TurnEvent, body: Callable[..., _T]) -> Callable[..., _T]:
    """``body``, noting on ``turn`` the exception it raises (which the turn then catches
    and records), so that its observers see the live exception, with its frames."""

    def run_body(*args: Any) -> _T:
        try:
            return body(*args)
        except BaseException as error:  # read only when the run failed
            turn.error = error
            raise

    return run_body


def step(
    run: RunRecord, name: str, attempt: int, kind: Literal["step", "transaction"]
) -> contextlib.AbstractContextManager[Any]:
    """Around one attempt of a step's function (the user's code). Inside,
    :func:`~durable_django.current_run` tells the run and the step."""
    if _Hooks.waiting:
        _Hooks.ask_waiting()
    hooks = _Hooks.step
    event = StepEvent(run, name, attempt, kind) if hooks else None
    return _Running(hooks, event, (run, name, attempt))


class _Running(_Around):
    """Around a moment of a run's code (a turn, a step): :func:`running` tells it."""

    __slots__ = ("running", "token")

    def __init__(
        self,
        hooks: Sequence[Callable[[Any], Any]],
        event: Any,
        running: tuple[RunRecord, str | None, int],
    ) -> None:
        super().__init__(hooks, event)
        self.running = running

    def __enter__(self) -> Any:
        self.token = _running.set(self.running)
        return super().__enter__()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            super().__exit__(kind, error, trace)
        finally:
            _running.reset(self.token)


def step_failed(
    run: RunRecord,
    name: str,
    attempt: int,
    kind: Literal["step", "transaction"],
    error: BaseException,
    retry_in: float | None,
) -> None:
    """A step attempt failed; call it while ``error`` is being handled."""
    if _Hooks.step_failed:
        _each(_Hooks.step_failed, StepEvent(run, name, attempt, kind, error, retry_in))


def refused(workflow: str, error: ConcurrencyLimitError) -> None:
    """A start of ``workflow`` was refused, and ``error`` explained."""
    if _Hooks.refused:
        _each(_Hooks.refused, workflow, error)


def subscriber_skipped(event: str, event_id: str | None, workflow: str, error: Exception) -> None:
    """An event's subscriber ``workflow`` was not started, for ``error``."""
    if _Hooks.subscriber_skipped:
        _each(_Hooks.subscriber_skipped, event, event_id, workflow, error)


def ticked(result: Any) -> None:
    """A tick ended with ``result``."""
    if _Hooks.ticked:
        _each(_Hooks.ticked, result)


def _each(hooks: Sequence[Callable[..., Any]], *arguments: Any) -> None:
    for hook in hooks:
        try:
            hook(*arguments)
        except Exception:
            logger.exception("observer %r failed", hook)


#: The run (and step, attempt) the code running in this thread or task works for.
_running: contextvars.ContextVar[tuple[RunRecord, str | None, int] | None] = contextvars.ContextVar(
    "durable_django_running", default=None
)


def running() -> tuple[RunRecord, str | None, int] | None:
    """The run, the step's name (``None`` in the body) and the attempt the current code
    works for, or ``None`` outside a run."""
    return _running.get()
