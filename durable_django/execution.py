"""One turn of a run: replay its recorded steps, run the new ones, suspend or finish.

A run's body replays from the top on every turn. Each durable call (``ctx.step``,
``ctx.sleep``, ``ctx.wait_for_signal``, ``ctx.child`` ...) takes the next position; what
it did is recorded at that position, and a replay returns the recording instead of doing
it again. A call that must wait raises :class:`Suspend`, which ends the turn with the run
``suspended`` until a timer, a signal or a child wakes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import socket
import sys
import threading
import time
import traceback
import uuid
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

from django.db import DatabaseError, connections
from django.db import transaction as db_transaction
from django.utils import timezone

from . import metrics
from .concurrency import ConcurrencyOption
from .context import current_context
from .db import (
    close_connections,
    close_dropped_connections,
    one_line,
)
from .errors import (
    ChildWorkflowError,
    ConcurrencyLimitError,
    DurableError,
    NonDeterminismError,
    SignalTimeout,
    StepError,
    UnstorableValueError,
)
from .limits import (
    CHILD_STEP_PREFIX,
    MAX_ERROR_MESSAGE,
    MAX_ERROR_TRACEBACK,
    SIGNAL_STEP_PREFIX,
    text_lengths,
)
from .observability import events as observing
from .records import RunRecord, StepRecord
from .serialization import json_copy, storable_text, validate_text
from .starting import RunHandle, WorkflowRef
from .status import TERMINAL_STATUSES, RunStatus
from .user_code import ControlFlow, user_failure

if TYPE_CHECKING:
    from .engines import Engine
    from .stores.base import BaseStore

logger = logging.getLogger(__name__)

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


class Suspend(ControlFlow):
    """Ends the turn: the run waits for ``wait`` (until ``wake_at``, when given)."""

    def __init__(self, wait: dict[str, Any], wake_at: datetime.datetime | None = None) -> None:
        self.wait = wait
        self.wake_at = wake_at
        super().__init__(wait)


class LeaseLost(ControlFlow):
    """The worker no longer holds the run (cancelled, or its lease was handed on)."""


class DatabaseLost(ControlFlow):
    """The store's database went away during a durable call (a restart, a failover, a
    network cut). The turn ends and records nothing; the run is handed back, to be
    replayed, rather than failed for what was no fault of its own."""


class TimeUp(ControlFlow):
    """Celery's soft time limit fired after the turn completed a step: the turn ends
    there and the run is handed back, to go on in a turn of its own (the interrupted
    step runs again). A step that alone outlasts the limit fails its attempt instead."""


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


def error_payload(error: BaseException) -> dict[str, Any]:
    """A failure as JSON any store holds: its type, message and traceback, with the
    characters a database refuses replaced and their length bounded. For a value that
    could not be stored, also which value (``value``), where in it (``path``) and why
    (``rule``)."""
    try:
        message = str(error)
    except Exception:
        message = f"<str() of {type(error).__name__} failed>"
    try:
        trace = "".join(traceback.format_exception(error))
    except Exception:
        trace = ""
    payload = {
        "type": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": message,
        "traceback": trace,
    }
    if isinstance(error, UnstorableValueError):
        payload.update(value=error.what, path=error.path, rule=error.rule)
    return {
        name: storable_text(
            text,
            MAX_ERROR_TRACEBACK if name == "traceback" else MAX_ERROR_MESSAGE,
            keep_end=name == "traceback",
        )
        for name, text in payload.items()
    }


def refusal_payload(error: ConcurrencyLimitError) -> dict[str, Any]:
    """A quota refusal as JSON, so a replay can raise the same refusal."""
    return {
        **error_payload(error),
        "workflow": error.workflow,
        "key": error.key,
        "limit": error.limit,
        "active": error.active,
        "retry_after": error.retry_after,
    }


def _refusal_from(payload: dict[str, Any]) -> ConcurrencyLimitError:
    # retry_after is recorded so that every replay sees the same; older records lack it.
    return ConcurrencyLimitError(
        payload["workflow"],
        payload["key"],
        payload["limit"],
        payload["active"],
        payload.get("retry_after", 0),
    )


def _backoff_seconds(backoff: float | Callable[[int], float], attempt: int) -> float:
    if callable(backoff):
        return float(backoff(attempt))
    return float(backoff) * 2.0 ** (attempt - 1)


class Context:
    """What a workflow body receives as ``ctx``: its durable calls and its run's identity."""

    def __init__(self, engine: Engine, run: RunRecord, steps: list[StepRecord], owner: str) -> None:
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
        if not held:
            self.lease_lost.set()
            raise LeaseLost(self.run_id)
        self._recorded[step.position] = step

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
        validate_text(name, "step name", text_lengths().step_name)
        position, recorded = self._next(name)
        replayed, attempt = _replayed(name, recorded)
        if attempt == 0:
            return replayed
        try:
            with observing.step(self.run, name, attempt, "step"):
                what = f"the result of step {name!r}"
                result = json_copy(_outside_body(fn, *args, **kwargs), what)
        except BaseException as error:
            self._stop_if_time_up(error, f"in step {name!r}")
            if not user_failure(error):
                raise
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
        validate_text(name, "step name", text_lengths().step_name)
        position, recorded = self._next(name, flush=False)
        if recorded is not None:
            self._flush()
        replayed, attempt = _replayed(name, recorded)
        if attempt == 0:
            return replayed
        step = StepRecord(position, name)
        try:
            with observing.step(self.run, name, attempt, "transaction"):
                result = self._in_transaction(step, attempt > 1, fn, args, kwargs)
        except BaseException as error:
            self._stop_if_time_up(error, f"in step {name!r}")
            if not user_failure(error):
                raise
            self._flush()
            self._fail(position, name, error, attempt, retries, backoff, "transaction")
        self.ran += 1
        self._recorded[position] = dataclasses.replace(step, result=result)
        return result

    def _in_transaction(
        self,
        step: StepRecord,
        replace: bool,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``fn``'s call and ``step``'s record (with its result), and the unwritten record
        if any, in one transaction under the holder's check. Raises what ``fn`` raised,
        or :class:`LeaseLost`, with everything rolled back."""
        store = self.engine.store
        unwritten, self.unwritten = self.unwritten, None
        what = f"the result of step {step.name!r}"
        try:
            # The connection is judged inside the transaction, before its end replaces a
            # dropped connection with a new one: a lost database hands the run back.
            with _transaction_of(store), _reaching(store):
                result = json_copy(_outside_body(fn, *args, **kwargs), what)
                record = dataclasses.replace(step, result=result)
                if unwritten is not None:
                    store.record_step(self.run_id, unwritten)
                # Last: the run's row is locked (FOR SHARE) only until the commit, which
                # the store may send with the record (one round trip).
                if replace:
                    held = store.record_held_step(self.run_id, record, self.owner, replace=True)
                else:
                    held = store.commit_held_step(self.run_id, record, self.owner)
                if not held:
                    self.lease_lost.set()
                    raise LeaseLost(self.run_id)
        except BaseException:
            # Rolled back: the earlier step's record is still to be written.
            self.unwritten = unwritten
            raise
        return result

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
        """Record a step's failed ``attempt``: suspend until the next one is due while
        ``retries`` remain, else raise :class:`StepError`."""
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
            if not held:
                self.lease_lost.set()
                raise LeaseLost(self.run_id)
            return store.take_signal(self.run_id, token, step)

    def start_child(
        self,
        workflow: WorkflowRef,
        input: Any = None,
        child_id: str | None = None,
        *,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
    ) -> str:
        """Start a child run and go on; returns its run id.

        ``child_id`` defaults to one made from this run's id and the call's position.
        ``concurrency=`` and ``tags=`` work as on any start. A start refused by the
        child's quota raises :class:`ChildWorkflowError` (``cause``: the refusal).
        """
        return self._start_child(workflow, input, child_id, concurrency, tags)[0]

    def start_child_handle(
        self,
        workflow: WorkflowRef,
        input: Any = None,
        child_id: str | None = None,
        *,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
    ) -> RunHandle:
        """``start_child``, returning the child's handle (``Wf.dispatch`` in a body)."""
        run_id, created = self._start_child(workflow, input, child_id, concurrency, tags)
        return RunHandle(self.engine, run_id, self.engine.definition(workflow).name, created)

    def child(
        self,
        workflow: WorkflowRef,
        input: Any = None,
        child_id: str | None = None,
        *,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
    ) -> Any:
        """Start a child run, suspend until it settles, and return its output.

        Raises :class:`ChildWorkflowError` when the child failed or was cancelled, when
        its start was refused by its quota (``cause`` is the ``ConcurrencyLimitError``),
        or when the child was deleted before this run read its outcome.
        """
        run_id, _ = self._start_child(workflow, input, child_id, concurrency, tags)
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
    ) -> tuple[str, bool]:
        definition = self.engine.definition(workflow)
        name = CHILD_STEP_PREFIX + definition.name
        position, recorded = self._next(name)
        if recorded is None:
            run_id = child_id if child_id is not None else f"{self.run_id}/{position}"
            try:
                with _reaching(self.engine.store):
                    handle = self.engine.start_child(
                        self.run, definition, input, run_id, concurrency=concurrency, tags=tags
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
            refusal = _refusal_from(recorded.error)
            refusal.engine = self.engine  # for its holders()
            raise ChildWorkflowError(
                f"child workflow {definition.name!r} was refused: {refusal}",
                cause=refusal,
            )
        return recorded.result["child_id"], recorded.result["created"]


def _check_own_child(context: Context, run_id: str) -> None:
    # Only this run's own children wake it when they end.
    existing = context.engine.store.get_run(run_id)
    if existing is not None and existing.parent_id != context.run_id:
        raise DurableError(
            f"child id {run_id!r} is taken by a run that is not a child of {context.run_id!r}"
        )


def _transaction_of(store: BaseStore) -> contextlib.AbstractContextManager[Any]:
    """A transactional step's transaction: on the store's Django database, or, for a
    store kept elsewhere (``MemoryStore``), none: ``fn`` runs, then the record is made."""
    if store.using is None:
        return contextlib.nullcontext()
    return db_transaction.atomic(using=store.using)


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


def worker_id() -> str:
    """A name for this worker thread, unique enough to tell leases apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


@dataclasses.dataclass(slots=True)
class _Lease:
    """A turn's lease as its keeper sees it; times on this process's monotonic clock."""

    engine: Engine
    seconds: float
    #: When the lease lapses unless it is renewed before.
    expires: float
    #: When the next renewal is due; None once the lease is lost.
    due: float | None
    #: Renewals that failed in a row.
    failures: int = 0


def _lease_expiry(run: RunRecord, seconds: float) -> float:
    """When the lease the claim took lapses, on the monotonic clock."""
    now = time.monotonic()
    if run.lease_expires_at is None:
        return now + seconds
    left = (run.lease_expires_at - timezone.now()).total_seconds()
    return now + min(left, seconds)


def _retry_delay(lease: _Lease) -> float:
    """How long after a failed renewal the next one is tried: 1 s, 2 s, 4 s ... at most a
    sixth of the lease, and never after the moment the lease lapses."""
    delay = min(2.0 ** (min(lease.failures, 16) - 1), lease.seconds / 6)
    return min(delay, max(lease.expires - time.monotonic(), 0.0))


class _LeaseKeeper:
    """Renews the leases of the turns running in this process, from one daemon thread.

    A turn hands its lease to the keeper while its body runs; every third of the lease's
    length the keeper renews it, over a connection of its own that it closes after each
    round. A renewal that fails (the database restarting or out of reach) is tried again
    after 1 s, 2 s, 4 s ... (at most a sixth of the lease) until the lease lapses. The
    turn is flagged (``lease_lost``) when a renewal finds the run no longer held, or when
    the lease lapsed before a renewal got through: another worker may take the run from
    then on. One long-lived thread, started on first use, instead of one thread per
    turn: starting and joining a thread cost more than most turns' renewals (most turns
    end before their first renewal is due).
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # In a forked child the keeper thread is gone, and its lock may have been held.
        self._changed = threading.Condition()
        self._leases: dict[Context, _Lease] = {}
        self._renewing: Context | None = None
        self._wakes_at: float | None = None  # when the keeper's wait ends (None: never)
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def kept(self, engine: Engine, context: Context, seconds: float) -> Iterator[None]:
        """Renew ``context``'s lease every third of ``seconds`` until the block ends."""
        due = time.monotonic() + seconds / 3
        lease = _Lease(engine, seconds, _lease_expiry(context.run, seconds), due)
        with self._changed:
            self._leases[context] = lease
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="durable lease keeper", daemon=True
                )
                self._thread.start()
            elif self._wakes_at is None or due < self._wakes_at:
                self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                # A renewal under way ends before the turn goes on to finish the run.
                while self._renewing is context:
                    self._changed.wait()
                del self._leases[context]
            # The turn's end is written next, perhaps after a long last step.
            context.check_connections()

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    now = time.monotonic()
                    times = [
                        (lease.due, context)
                        for context, lease in self._leases.items()
                        if lease.due is not None
                    ]
                    due = [c for at, c in times if at <= now]
                    if due:
                        break
                    self._wakes_at = min((at for at, _ in times), default=None)
                    self._changed.wait(None if self._wakes_at is None else self._wakes_at - now)
                self._wakes_at = now
            try:
                for context in due:
                    self._renew(context)
            finally:
                # A fresh connection for the next round, and none held in between.
                close_connections()

    def _renew(self, context: Context) -> None:
        with self._changed:
            lease = self._leases.get(context)
            if lease is None:
                return  # the turn ended meanwhile
            self._renewing = context
        started = time.monotonic()
        try:
            held = lease.engine.store.transition(
                context.run_id,
                [RunStatus.RUNNING],
                RunStatus.RUNNING,
                owner=context.owner,
                lease_expires_at=timezone.now() + datetime.timedelta(seconds=lease.seconds),
            )
        except Exception as error:
            close_connections()
            with self._renewal_done():
                lease.failures += 1
                lapsed = time.monotonic() >= lease.expires
                lease.due = None if lapsed else time.monotonic() + _retry_delay(lease)
            if lapsed:
                context.lease_lost.set()
                logger.warning(
                    "lost the lease of run %r: it lapsed before a renewal got through (%s); "
                    "the turn stops at its next durable call and records nothing",
                    context.run_id,
                    one_line(error),
                )
            else:
                assert lease.due is not None
                (logger.warning if lease.failures == 1 else logger.debug)(
                    "renewing the lease of run %r failed (%s); trying again in %.1fs, "
                    "before it lapses in %.1fs",
                    context.run_id,
                    one_line(error),
                    lease.due - time.monotonic(),
                    lease.expires - time.monotonic(),
                )
            return
        with self._renewal_done():
            failures, lease.failures = lease.failures, 0
            lease.expires = started + lease.seconds
            # Not held: cancelled, or handed on after this process stalled.
            lease.due = time.monotonic() + lease.seconds / 3 if held else None
        if not held:
            context.lease_lost.set()
        elif failures:
            logger.info(
                "renewed the lease of run %r after %d failed attempt(s)", context.run_id, failures
            )

    @contextlib.contextmanager
    def _renewal_done(self) -> Iterator[None]:
        """Update a lease once its renewal is done, and wake a turn waiting for that."""
        with self._changed:
            try:
                yield
            finally:
                self._renewing = None
                self._changed.notify_all()


_lease_keeper = _LeaseKeeper()


def _lease_kept(engine: Engine, context: Context, seconds: float) -> Any:
    """Renew the run's lease every third of its length while the body runs."""
    if not engine.store.is_shared:
        return contextlib.nullcontext()
    return _lease_keeper.kept(engine, context, seconds)


#: What every end of a turn sets: the run is no longer held.
_RELEASED = {"lease_owner": "", "lease_expires_at": None, "blocked_reason": ""}


def execute_run(engine: Engine, run_id: str) -> bool:
    """Claim a pending run, replay its body, and suspend or finish it.

    Returns False when the run was not waiting for a worker (another took it, or it
    ended). A run whose workflow version this process does not have is ``blocked``.
    """
    store = engine.store
    config = engine.config
    owner = worker_id()
    now = timezone.now()
    lease = datetime.timedelta(seconds=config.lease_seconds)
    claim = {"lease_owner": owner, "lease_expires_at": now + lease, "started_at": now}
    # The claim, the run and its steps at once (one round trip on PostgreSQL).
    claimed = store.claim_run(run_id, **claim, wake_at=None)
    if claimed is None:
        return False
    run, steps = claimed
    metrics.run_claimed(run, steps, now)
    with observing.turn(run, now) as turn:
        turn.outcome = _turn(engine, run, steps, owner, turn)
    return True


def _turn(
    engine: Engine, run: RunRecord, steps: list[StepRecord], owner: str, turn: observing.TurnEvent
) -> str:
    """A claimed run's turn: its body replayed, then its end written; returns how the
    turn ended (:data:`~durable_django.observability.events.TURN_OUTCOMES`)."""
    store = engine.store
    config = engine.config
    now = turn.claimed_at
    run_id = run.run_id
    definition = engine.registry.get(run.workflow, run.version)
    if definition is None or definition.body is None:
        store.transition(
            run_id,
            [RunStatus.RUNNING],
            RunStatus.BLOCKED,
            owner=owner,
            lease_owner="",
            lease_expires_at=None,
            wake_at=now + datetime.timedelta(seconds=config.blocked_retry_seconds),
            blocked_reason=(
                f"workflow {run.workflow!r} version {run.version!r} is not registered "
                f"for execution in this process"
            ),
        )
        return "blocked"
    context = Context(engine, run, steps, owner)
    token = current_context.set(context)
    try:
        with _lease_kept(engine, context, config.lease_seconds):
            status, fields = _run_body(observing.watched(turn, definition.body), context)
    except LeaseLost:
        return "lease_lost"
    except DatabaseLost as lost:
        _hand_back(engine, run, owner, str(lost))
        return "handed_back"
    except TimeUp as up:
        _hand_back(engine, run, owner, str(up), cause="its turn ran out of time")
        return "handed_back"
    finally:
        current_context.reset(token)
    try:
        status, fields, finished = _write_turn_end(
            store, run_id, owner, status, context.unwritten, {**fields, **_RELEASED}
        )
    except DatabaseLost as lost:
        _hand_back(engine, run, owner, str(lost))
        return "handed_back"
    if not finished:
        return "lease_lost"
    _after_turn(engine, run, status, fields.get("wait"))
    return status


def _write_turn_end(
    store: BaseStore, run_id: str, owner: str, status: str, step: StepRecord | None, fields: Any
) -> tuple[str, dict[str, Any], bool]:
    """End the turn as the body left it: ``(status, fields, whether the run was held)``.

    The values were checked before (what the store cannot hold failed the run or its
    step already), so a write the database still refuses is tried once more (a deadlock
    or a dropped connection passes). Refused again, the run ends ``failed`` with an
    error record every database holds instead: a run must never stay ``running``, to be
    handed on and replayed at each lease, holding its slot. A database that went away
    rather than refused (its connection no longer answers) raises :class:`DatabaseLost`:
    the run is handed back (:func:`_hand_back`), not failed. Only when the failed end's
    write fails too does the error propagate; the run's lease then lapses and the tick
    hands it on.
    """
    refusal: Exception | None = None
    for _ in range(2):
        try:
            with _refusable(store):
                return status, fields, _end_turn(store, run_id, owner, status, step, **fields)
        except Exception as error:
            logger.warning("run %r: the end of its turn was refused", run_id, exc_info=True)
            refusal = error
    assert refusal is not None
    if store.connection_lost(refusal):
        # Not refused: unreachable. Nothing of the run is at fault.
        raise DatabaseLost(one_line(refusal)) from refusal
    failed: dict[str, Any] = {
        **_RELEASED,
        "output": None,
        "error": _unwritten_payload(status, refusal),
        "finished_at": timezone.now(),
        "wait": None,
        "wake_at": None,
    }
    with _refusable(store):
        held = store.transition(
            run_id, [RunStatus.RUNNING], RunStatus.FAILED, owner=owner, **failed
        )
    return RunStatus.FAILED, failed, held


def _hand_back(
    engine: Engine,
    run: RunRecord,
    owner: str,
    why: str,
    cause: str = "the database went away during its turn",
) -> None:
    """After the database went away during a turn (or its time ran out): make the run
    pending again, and send it, if the database is back; if not, the run keeps its lease
    until it lapses and the tick hands it on. Either way the turn recorded nothing more,
    and its last step runs again on the next turn (steps run at least once)."""
    close_connections()
    try:
        handed = engine.store.transition(
            run.run_id,
            [RunStatus.RUNNING],
            RunStatus.PENDING,
            owner=owner,
            lease_owner="",
            lease_expires_at=None,
        )
    except DatabaseError as error:
        close_connections()
        logger.warning(
            "run %r: %s (%s); the database cannot be reached (%s), "
            "the run is handed on once its lease lapses",
            run.run_id,
            cause,
            why,
            one_line(error),
        )
        return
    logger.warning(
        "run %r: %s (%s); %s",
        run.run_id,
        cause,
        why,
        "handed back, to be replayed" if handed else "another worker or the tick has it",
    )
    if handed:
        engine.send_each((run,))


def _unwritten_payload(status: str, error: Exception) -> dict[str, Any]:
    """The error record of a run whose turn's end the database refused: ASCII text of
    bounded length, which every database and character set holds."""

    def ascii_text(text: str) -> str:
        return text.encode("ascii", "backslashreplace").decode("ascii")

    refused = error_payload(error)
    message = f"the end of the turn ({status}) could not be stored: {refused['message']}"
    return {
        "type": ascii_text(refused["type"][:200]),
        "message": ascii_text(message[:2000]),
        "traceback": ascii_text(refused["traceback"][-10_000:]),
        "unwritten": status,
    }


@contextlib.contextmanager
def _refusable(store: BaseStore) -> Iterator[None]:
    """A write the database may refuse. Inside a transaction of the caller's (a test's),
    in a savepoint, so that the transaction stays usable after a refusal; outside one, a
    connection the refusal broke is closed (MariaDB closes its end on a statement larger
    than ``max_allowed_packet``), so the next write opens a new one."""
    using = store.using
    if using is None:  # not a database of Django's
        yield
        return
    connection = connections[using]
    if connection.in_atomic_block:
        with store.atomic():
            yield
        return
    try:
        yield
    except Exception:
        if connection.connection is not None and not connection.is_usable():
            connection.close()
        raise


def _end_turn(
    store: BaseStore, run_id: str, owner: str, status: str, step: StepRecord | None, **fields: Any
) -> bool:
    """The holder's transition ending the turn, with the turn's unwritten record if any."""
    if step is None:
        return store.transition(run_id, [RunStatus.RUNNING], status, owner=owner, **fields)
    # One statement on PostgreSQL.
    return store.end_turn(run_id, owner, status, step, **fields)


def _run_body(body: Callable[[Any, Any], Any], context: Context) -> tuple[str, dict[str, Any]]:
    try:
        output = json_copy(
            body(context, context.input), f"the output of workflow {context.run.workflow!r}"
        )
    except Suspend as suspend:
        return RunStatus.SUSPENDED, {"wait": suspend.wait, "wake_at": suspend.wake_at}
    except StepError as error:
        # The run fails with what failed in the step, and says which step it was.
        failure = {**error.error, "step": error.name}
        failure.pop("retry_at", None)
        return RunStatus.FAILED, {"error": failure, "finished_at": timezone.now(), "wait": None}
    except BaseException as error:
        context._stop_if_time_up(error, "between steps")
        if not user_failure(error):
            raise
        return RunStatus.FAILED, {
            "error": error_payload(error),
            "finished_at": timezone.now(),
            "wait": None,
        }
    return RunStatus.COMPLETED, {
        "output": output,
        "error": None,
        "finished_at": timezone.now(),
        "wait": None,
    }


def _after_turn(engine: Engine, run: RunRecord, status: str, wait: Any) -> None:
    """Wake whoever this turn's end concerns, closing the races with signals and children.

    A run that ended is announced (its parent woken). A run that just suspended on a
    signal already sent, or on a child already ended, wakes itself: the sender or the
    child may have looked for it a moment before it was suspended.
    """
    if status in TERMINAL_STATUSES:
        engine.finished(run, status)
        return
    if status != RunStatus.SUSPENDED or not wait:
        return
    if "signal" in wait and engine.store.has_signal(wait["signal"]):
        engine.wake(run.run_id)
    elif "child" in wait:
        child = engine.store.get_run(wait["child"])
        if child is not None and child.status in TERMINAL_STATUSES:
            engine.wake(run.run_id)


__all__ = [
    "Context",
    "LeaseLost",
    "NonDeterminismError",
    "SignalTimeout",
    "StepError",
    "Suspend",
    "current_context",
    "execute_run",
]
