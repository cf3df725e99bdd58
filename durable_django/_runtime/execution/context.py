"""The ``Context`` a workflow body receives as ``ctx``: its durable calls.

Each durable call (``ctx.step``, ``ctx.sleep``, ``ctx.wait_for_signal``, ``ctx.child`` ...)
takes the next position; what it did is recorded at that position, and a replay returns
the recording instead of doing it again. A call that must wait raises
:class:`~durable_django._runtime.execution.control.Suspend`.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    NoReturn,
    ParamSpec,
    Protocol,
    TypeVar,
    TypeVarTuple,
    cast,
    overload,
)

from django.db import DatabaseError
from django.utils import timezone

from ..._core.context import current_context
from ..._core.limits import CHILD_STEP_PREFIX, SIGNAL_STEP_PREFIX, text_lengths
from ..._core.records import RunRecord, StepRecord
from ..._core.serialization import json_copy, validate_text
from ..._core.user_code import user_failure
from ..._rules.concurrency import ConcurrencyOption, RateLimitOption
from ...db import close_dropped_connections, one_line
from ...errors import (
    ChildWorkflowError,
    ConcurrencyLimitError,
    DurableError,
    NonDeterminismError,
    SignalTimeout,
    StepError,
)
from ...observability import events as observing
from ...status import TERMINAL_STATUSES, RunStatus
from .. import starting
from ..handles import RunHandle, WorkflowRef
from ..starting.options import StartOptions
from . import settling
from .control import DatabaseLost, LeaseLost, Suspend, TimeUp
from .payloads import error_payload, refusal_from, refusal_payload

if TYPE_CHECKING:
    from ..._core.runtime import Runtime
    from ...stores.base import BaseStore

_P = ParamSpec("_P")
_R = TypeVar("_R")
_Args = TypeVarTuple("_Args")

#: A step's ``backoff``: seconds (doubled at each attempt), or ``backoff(attempt)``.
Backoff = float | Callable[[int], float]


class DurableCall(Protocol):
    """The type of ``ctx.step`` and ``ctx.transaction``, taken from the ``fn`` they call:
    ``fn``'s arguments are checked, and its return type is the call's. With ``retries``
    or ``backoff`` (options a ``ParamSpec`` cannot sit beside), ``fn``'s arguments are
    checked when given by position."""

    @overload
    def __call__(
        self, name: str, fn: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _R: ...

    @overload
    def __call__(
        self,
        name: str,
        fn: Callable[[*_Args], _R],
        /,
        *args: *_Args,
        retries: int = 0,
        backoff: Backoff = 1.0,
    ) -> _R: ...


def _typed_from_fn(method: Callable[..., Any]) -> DurableCall:
    """The method as it is, typed as a :class:`DurableCall` (a protocol needs no
    implementation of its overloads: mypy cannot check one taking ``*args: *_Args``)."""
    return cast(DurableCall, method)


#: A durable call this long after the previous one first checks the connections.
IDLE_CHECK_SECONDS = 1.0


def _time_up(context: Context, error: BaseException) -> bool:
    """Whether ``error`` is Celery's soft time limit, fired after this turn completed a
    step (billiard raises it in the worker's pool process)."""
    limits = sys.modules.get("billiard.exceptions")
    return (
        context.ran > 0 and limits is not None and isinstance(error, limits.SoftTimeLimitExceeded)
    )


@contextlib.contextmanager
def _reaching(store: BaseStore) -> Iterator[None]:
    """A durable call's reads and writes: a database that went away ends the turn
    (:class:`DatabaseLost`); one that refuses a statement raises its error to the body."""
    try:
        yield
    except DatabaseError as error:
        if store.connection_lost(error):
            raise DatabaseLost(one_line(error)) from error
        raise


def _backoff_seconds(backoff: float | Callable[[int], float], attempt: int) -> float:
    if callable(backoff):
        return float(backoff(attempt))
    return float(backoff) * 2.0 ** (attempt - 1)


class Context:
    """What a workflow body receives as ``ctx``: its durable calls and its run's identity."""

    def __init__(
        self, engine: Runtime, run: RunRecord, steps: list[StepRecord], owner: str
    ) -> None:
        self.engine = engine
        self.run = run
        self.owner = owner
        self._recorded = {step.position: step for step in steps}
        self._position = 0
        self.lease_lost = threading.Event()
        #: A record kept in memory until the body's next durable call or the turn's end.
        self.unwritten: StepRecord | None = None
        self._called_at = time.monotonic()
        #: Steps run (not replayed) in this turn.
        self.ran = 0

    @property
    def run_id(self) -> str:
        """The id of the run being executed."""
        return self.run.run_id

    @property
    def input(self) -> Any:
        """The run's input."""
        return self.run.input

    # positions ----------------------------------------------------------------------

    def check_connections(self) -> None:
        """Before the turn's next write: after a long time away from the database (a
        long step), close the connections the server dropped meanwhile (a restart, a
        failover, a network blip), so that the write opens a new one instead of failing."""
        now = time.monotonic()
        if now - self._called_at >= IDLE_CHECK_SECONDS:
            close_dropped_connections()
        self._called_at = now

    def _next(self, name: str, *, flush: bool = True) -> tuple[int, StepRecord | None]:
        """The next position and its record, if any; first the unwritten record, unless
        ``flush`` is false (the caller then writes it in a transaction of its own)."""
        if self.lease_lost.is_set():
            raise LeaseLost(self.run_id)
        self.check_connections()
        if flush:
            self._flush()
        position = self._position
        self._position += 1
        recorded = self._recorded.get(position)
        if recorded is not None and recorded.name != name:
            raise NonDeterminismError(
                f"run {self.run_id!r}: position {position} was recorded as {recorded.name!r} "
                f"but the body now calls {name!r}; a body must make its durable calls in "
                f"the same order on every replay"
            )
        return position, recorded

    def _flush(self) -> None:
        """Write the record kept in memory (:meth:`_record_later`), if any."""
        if self.unwritten is not None:
            step, self.unwritten = self.unwritten, None
            self._record(step)

    def _record(self, step: StepRecord, *, replace: bool = False) -> None:
        """Record ``step`` if this worker still holds the run, in one transaction.

        A worker whose run was cancelled, or whose lease lapsed and was handed on while
        it was stalled, records nothing and stops (:class:`LeaseLost`): its late record
        would clash with the new holder's, and its body must not go on to the next step.
        """
        store = self.engine.store
        with _reaching(store):
            held = store.record_held_step(self.run_id, step, self.owner, replace=replace)
        self._check_held(held)
        self._recorded[step.position] = step

    def _check_held(self, held: bool) -> None:
        """After a write made only while this worker holds the run: when it did not
        (cancelled, or handed on), flag the lease lost and end the turn."""
        if not held:
            self.lease_lost.set()
            raise LeaseLost(self.run_id)

    def _record_later(self, step: StepRecord) -> None:
        """Record ``step`` before the body's next durable call, or with the turn's end.

        The turn's last record is then written by the statement that ends the turn, one
        commit instead of two. A worker that dies before the record is written leaves
        the step to run again, as one dying while the step's function ran would; the
        window also covers the body's own code up to its next durable call.
        """
        self._recorded[step.position] = step
        self.unwritten = step

    def _once(self, name: str, make: Callable[[], Any]) -> Any:
        """Record ``make()`` at the next position the first time; replay it after."""
        position, recorded = self._next(name)
        if recorded is not None:
            return recorded.result
        result = json_copy(_outside_body(make), f"the result of {name!r}")
        self._record_later(StepRecord(position, name, result=result))
        return result

    # durable calls ------------------------------------------------------------------

    @_typed_from_fn
    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        retries: int = 0,
        backoff: Backoff = 1.0,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once and record its JSON result; replay the record.

        A failure is retried up to ``retries`` times, waiting ``backoff`` seconds (doubled
        at each attempt; or ``backoff(attempt)``) on a durable timer, not in the worker.
        A step that fails for good raises :class:`StepError`, on this turn and on replays.
        A result the store cannot hold (not JSON, NUL characters, too deep or too large:
        :class:`~durable_django.UnstorableValueError`) fails the step the same way.

        The result is recorded after ``fn`` returns, in a commit of its own: a worker
        that dies in between runs ``fn`` again (at least once). See :meth:`transaction`
        for exactly once.
        """
        position, replayed, attempt = self._step_at(name)
        if attempt == 0:
            return replayed
        try:
            with observing.step(self.run, name, attempt, "step"):
                what = f"the result of step {name!r}"
                result = json_copy(_outside_body(fn, *args, **kwargs), what)
        except BaseException as error:
            self._fail(position, name, error, attempt, retries, backoff)
        self.ran += 1
        if attempt > 1:
            self._record(StepRecord(position, name, result=result), replace=True)
        else:
            self._record_later(StepRecord(position, name, result=result))
        return result

    @_typed_from_fn
    def transaction(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        retries: int = 0,
        backoff: Backoff = 1.0,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` in a transaction on the store's database, and record
        its JSON result in that same transaction; replay the record.

        ``fn``'s writes to the store's database and the step's record commit together, or
        not at all: a step whose transaction committed never runs again (exactly once),
        one whose worker died before the commit left nothing behind. The record is made
        only while this worker still holds the run; when it lost the run, the whole
        transaction rolls back, ``fn``'s writes with it, and the turn stops. A record of
        an earlier step still unwritten commits in it too.

        ``fn`` raising, or returning a result the store cannot hold, rolls its writes
        back; the failure is then retried and recorded as :meth:`step`'s are
        (``retries``, ``backoff``, :class:`StepError`). Writes ``fn`` makes elsewhere (on
        another database, to a service) are not in the transaction: for them the step
        is at least once, as :meth:`step` is.
        """
        position, replayed, attempt = self._step_at(name, flush=False)
        if attempt == 0:
            return replayed
        try:
            with observing.step(self.run, name, attempt, "transaction"):
                record = self._in_transaction(position, name, attempt > 1, fn, args, kwargs)
        except BaseException as error:
            self._fail(position, name, error, attempt, retries, backoff, "transaction")
        self.ran += 1
        self._recorded[position] = record
        return record.result

    def _step_at(self, name: str, *, flush: bool = True) -> tuple[int, Any, int]:
        """A step's name checked, then its position, with its recorded result and ``0``,
        or ``None`` and the attempt to make now (:func:`_replayed`). A step found recorded
        first writes the record kept in memory; otherwise, unless ``flush`` is false (a
        transactional step, whose transaction writes it), so does a new one."""
        validate_text(name, "step name", text_lengths().step_name)
        position, recorded = self._next(name, flush=flush)
        if recorded is not None:
            self._flush()
        return position, *_replayed(name, recorded)

    def _in_transaction(
        self,
        position: int,
        name: str,
        replace: bool,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> StepRecord:
        """``fn``'s call and the record at ``position`` of its result, and the unwritten
        record if any, in one transaction under the holder's check; the record. Raises
        what ``fn`` raised, or :class:`LeaseLost`, with everything rolled back."""
        store = self.engine.store
        unwritten, self.unwritten = self.unwritten, None
        try:
            # The connection is judged inside the transaction, before its end replaces a
            # dropped connection with a new one: a lost database hands the run back.
            with store.step_transaction(), _reaching(store):
                result = json_copy(
                    _outside_body(fn, *args, **kwargs), f"the result of step {name!r}"
                )
                record = StepRecord(position, name, result=result)
                if unwritten is not None:
                    store.record_step(self.run_id, unwritten)
                # Last: the run's row is locked (FOR SHARE) only until the commit, which
                # the store may send with the record (one round trip).
                if replace:
                    held = store.record_held_step(self.run_id, record, self.owner, replace=True)
                else:
                    held = store.commit_held_step(self.run_id, record, self.owner)
                self._check_held(held)
        except BaseException:
            # Rolled back: the earlier step's record is still to be written.
            self.unwritten = unwritten
            raise
        return record

    def _stop_if_time_up(self, error: BaseException, where: str) -> None:
        """Raise :class:`TimeUp` when ``error`` is Celery's soft time limit fired after
        this turn completed a step, with the records made so far written."""
        if _time_up(self, error):
            self._flush()
            raise TimeUp(f"Celery's soft time limit, {where}") from error

    def _fail(
        self,
        position: int,
        name: str,
        error: BaseException,
        attempt: int,
        retries: int,
        backoff: float | Callable[[int], float],
        kind: Literal["step", "transaction"] = "step",
    ) -> NoReturn:
        """A step's failed ``attempt``, from the handler of what it raised: the engine's
        control flow (and Celery's soft time limit after a completed step, as
        :class:`TimeUp`) raised on; a user failure recorded, with the record kept in
        memory written first, suspending until the next attempt is due while ``retries``
        remain, else raising :class:`StepError`."""
        self._stop_if_time_up(error, f"in step {name!r}")
        if not user_failure(error):
            raise  # the error being handled, as it was
        self._flush()
        failure = {**error_payload(error), "attempts": attempt, "retry_at": None}
        delay = _backoff_seconds(backoff, attempt) if attempt <= retries else None
        observing.step_failed(self.run, name, attempt, kind, error, delay)
        if delay is not None:
            wake_at = timezone.now() + datetime.timedelta(seconds=delay)
            failure["retry_at"] = wake_at.isoformat()
            self._record(StepRecord(position, name, error=failure), replace=attempt > 1)
            raise Suspend({"retry": name}, wake_at) from None
        self._record(StepRecord(position, name, error=failure), replace=attempt > 1)
        raise StepError(name, failure) from error

    def now(self) -> datetime.datetime:
        """The current time, recorded once and replayed verbatim."""
        return datetime.datetime.fromisoformat(
            self._once("durable.now", lambda: timezone.now().isoformat())
        )

    def sleep(self, duration: float | datetime.timedelta) -> None:
        """Suspend the run until ``duration`` has passed; no worker is held meanwhile."""
        seconds = duration.total_seconds() if isinstance(duration, datetime.timedelta) else duration
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"ctx.sleep takes seconds or a timedelta, not {duration!r}")
        until = datetime.datetime.fromisoformat(
            self._once(
                "durable.sleep",
                lambda: (timezone.now() + datetime.timedelta(seconds=seconds)).isoformat(),
            )
        )
        if timezone.now() < until:
            raise Suspend({"sleep": until.isoformat()}, until)

    def settle(self, key: str, units: int) -> None:
        """Count ``units`` for this run in rate limit ``key``'s window, in place of the
        weight its start reserved there: what the run really used (reserve ``max_tokens``
        at the start, settle the tokens the model returned). Returns ``None``.

        Effective at once for the next start's count under ``key``, whose window still
        places the run at its creation time. ``units`` may be more than was reserved: the
        window then holds what was used, over the limit if need be, until it leaves. The
        update and its record commit together, as :meth:`transaction`'s do, so a replay
        settles nothing again; it must call ``settle`` with the same ``key`` and ``units``
        (else :class:`NonDeterminismError`).

        ``key`` must be one of the keys this run started under (a ``ValueError`` names
        them), ``units`` an ``int`` from 0 to the highest limit.
        """
        tag = settling.settled_tag(self.run, key)
        units = settling.settled_units(units)
        position, recorded = self._next(settling.SETTLE_STEP, flush=False)
        if recorded is not None:
            self._flush()
            settling.check_replayed(self.run_id, position, recorded.result, key, units)
            return
        self._recorded[position] = self._in_transaction(
            position, settling.SETTLE_STEP, False, self._settle_held, (key, tag, units), {}
        )

    def _settle_held(self, key: str, tag: str, units: int) -> dict[str, Any]:
        """In the settle's transaction: the holder's check first, which locks the run's
        row before its tag row (the order a transition takes them: a concurrent cancel
        then waits rather than deadlocks), then the tag's new weight."""
        store = self.engine.store
        self._check_held(
            store.transition(self.run_id, [RunStatus.RUNNING], RunStatus.RUNNING, owner=self.owner)
        )
        if not store.settle_units(self.run_id, tag, units):
            raise DurableError(f"run {self.run_id!r} no longer has its tag {tag!r}")
        return settling.settle_record(key, units)

    def wait_for_signal(self, token: str, timeout: float | datetime.timedelta | None = None) -> Any:
        """Suspend until ``engine.signal(token, payload)``; return the payload.

        A signal sent before the wait is kept for it. With ``timeout`` (seconds or a
        ``timedelta``), raises :class:`SignalTimeout` when none came in time.
        """
        validate_text(token, "signal token", text_lengths().signal_token)
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        name = SIGNAL_STEP_PREFIX + token
        deadline_text = self._once(
            name,
            lambda: (
                None
                if timeout is None
                else (timezone.now() + datetime.timedelta(seconds=timeout)).isoformat()
            ),
        )
        position, recorded = self._next(name)
        if recorded is None:
            found, payload = self._take_signal(token, StepRecord(position, name))
            if found:
                self._recorded[position] = StepRecord(position, name, result=payload)
                return payload
            deadline = (
                None if deadline_text is None else datetime.datetime.fromisoformat(deadline_text)
            )
            if deadline is not None and timezone.now() >= deadline:
                recorded = StepRecord(position, name, error={"timeout": timeout})
                self._record(recorded)
            else:
                raise Suspend({"signal": token}, deadline)
        if recorded.error is not None:
            raise SignalTimeout(f"no signal {token!r} came within {recorded.error['timeout']}s")
        return recorded.result

    def _take_signal(self, token: str, step: StepRecord) -> tuple[bool, Any]:
        """Take a kept signal if this worker still holds the run (else :class:`LeaseLost`):
        a stalled worker must not consume the signal meant for the run's new holder."""
        store = self.engine.store
        with _reaching(store), store.atomic():
            held = store.transition(
                self.run_id, [RunStatus.RUNNING], RunStatus.RUNNING, owner=self.owner
            )
            self._check_held(held)
            return store.take_signal(self.run_id, token, step)

    def start_child(
        self,
        workflow: WorkflowRef,
        input: Any = None,
        child_id: str | None = None,
        *,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        rate_limit: RateLimitOption = None,
    ) -> str:
        """Start a child run and go on; returns its run id.

        ``child_id`` defaults to one made from this run's id and the call's position.
        ``concurrency=``, ``rate_limit=`` and ``tags=`` work as on any start. A start refused by the
        child's quota raises :class:`ChildWorkflowError` (``cause``: the refusal).
        """
        return self._start_child(workflow, input, child_id, concurrency, tags, rate_limit)[0]

    def start_child_handle(
        self,
        workflow: WorkflowRef,
        input: Any = None,
        child_id: str | None = None,
        *,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        rate_limit: RateLimitOption = None,
    ) -> RunHandle:
        """``start_child``, returning the child's handle (``Wf.dispatch`` in a body)."""
        run_id, created = self._start_child(
            workflow, input, child_id, concurrency, tags, rate_limit
        )
        return RunHandle(self.engine, run_id, self.engine.definition(workflow).name, created)

    def child(
        self,
        workflow: WorkflowRef,
        input: Any = None,
        child_id: str | None = None,
        *,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        rate_limit: RateLimitOption = None,
    ) -> Any:
        """Start a child run, suspend until it settles, and return its output.

        Raises :class:`ChildWorkflowError` when the child failed or was cancelled, when
        its start was refused by its quota (``cause`` is the ``ConcurrencyLimitError``),
        or when the child was deleted before this run read its outcome.
        """
        run_id, _ = self._start_child(workflow, input, child_id, concurrency, tags, rate_limit)
        with _reaching(self.engine.store):
            child = self.engine.store.get_run(run_id)
        if child is None:
            # Recorded as started, so it was deleted since: waiting would never end.
            raise ChildWorkflowError(
                f"child run {run_id!r} no longer exists: it was deleted before this run "
                f"read its outcome",
                child_id=run_id,
            )
        if child.status not in TERMINAL_STATUSES:
            raise Suspend({"child": run_id})
        if child.status == RunStatus.COMPLETED:
            return child.output
        message = (child.error or {}).get("message", child.status)
        raise ChildWorkflowError(
            f"child run {run_id!r} ({child.workflow}) ended {child.status}: {message}",
            child_id=run_id,
            cause=child.error,
        )

    def _start_child(
        self,
        workflow: WorkflowRef,
        input: Any,
        child_id: str | None,
        concurrency: ConcurrencyOption,
        tags: Iterable[str],
        rate_limit: RateLimitOption = None,
    ) -> tuple[str, bool]:
        definition = self.engine.definition(workflow)
        name = CHILD_STEP_PREFIX + definition.name
        position, recorded = self._next(name)
        if recorded is None:
            run_id = child_id if child_id is not None else f"{self.run_id}/{position}"
            try:
                with _reaching(self.engine.store):
                    options = StartOptions(concurrency, tags, rate_limit=rate_limit)
                    handle = starting.start_child(
                        self.engine, self.run, definition, input, run_id, options
                    )
                    if not handle.created:
                        _check_own_child(self, run_id)
            except ConcurrencyLimitError as error:
                recorded = StepRecord(position, name, error=refusal_payload(error))
            else:
                recorded = StepRecord(
                    position, name, result={"child_id": run_id, "created": handle.created}
                )
            self._record(recorded)
        if recorded.error is not None:
            refusal = refusal_from(recorded.error)
            refusal.engine = self.engine  # for its holders()
            raise ChildWorkflowError(
                f"child workflow {definition.name!r} was refused: {refusal}",
                cause=refusal,
            )
        return recorded.result["child_id"], recorded.result["created"]


def running_context() -> Context | None:
    """The context of the workflow body running in this thread (or task), if any."""
    context = current_context.get()
    return context if isinstance(context, Context) else None


def _check_own_child(context: Context, run_id: str) -> None:
    # Only this run's own children wake it when they end.
    existing = context.engine.store.get_run(run_id)
    if existing is not None and existing.parent_id != context.run_id:
        raise DurableError(
            f"child id {run_id!r} is taken by a run that is not a child of {context.run_id!r}"
        )


def _replayed(name: str, recorded: StepRecord | None) -> tuple[Any, int]:
    """A step's recorded outcome: ``(result, 0)`` for a recorded result, ``(None,
    attempt)`` for the attempt to make now; raises the recorded failure, or suspends
    until its retry is due."""
    if recorded is None:
        return None, 1
    if recorded.error is None:
        return recorded.result, 0
    retry_at = recorded.error.get("retry_at")
    if retry_at is None:
        raise StepError(name, recorded.error)
    wake_at = datetime.datetime.fromisoformat(retry_at)
    if timezone.now() < wake_at:
        raise Suspend({"retry": name}, wake_at)
    return None, recorded.error.get("attempts", 1) + 1


def _outside_body(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a step's function with no workflow context: a start inside it is a plain start,
    not a child start at a position the replay would not reach again."""
    token = current_context.set(None)
    try:
        return fn(*args, **kwargs)
    finally:
        current_context.reset(token)


__all__ = ["IDLE_CHECK_SECONDS", "Backoff", "Context", "DurableCall"]
