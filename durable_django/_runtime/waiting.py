"""Waiting a little for a quota slot (``wait=``) instead of being refused at once.

A start with ``wait`` (seconds, or a ``timedelta``) that a quota refuses tries again, with
the same atomic lock-count-insert of the store, until it is admitted or ``wait`` has
passed; then the last refusal is raised (:class:`ConcurrencyLimitError`, with its
``retry_after``). Waiting never admits more than the limit: each attempt is a whole
start. ``wait=None`` or ``0`` is the start of today, at its cost.

- **Woken on release**: between attempts, a store that can tell (the ORM store on
  PostgreSQL: ``LISTEN``/``NOTIFY``, see :mod:`durable_django.stores.postgres.listening`)
  is listened to, on a connection of its own registered as a waiter of the keys (the
  release trigger notifies only then) *before* the next attempt (so a release between a
  refusal and the listening is not missed); the wait for a release
  never lasts more than :data:`SAFETY_SECONDS`, so a lost notification costs at most that;
  a listener that cannot be opened, or fails, is logged and the start polls instead.
  Elsewhere (SQLite, MariaDB, MySQL, the memory store) the start polls: 50 ms doubling to
  1 s, never past the deadline nor past the refusal's ``retry_after``.
- **Arrival order in one process**: the starts waiting on a key in one process form a
  queue; only the one at the head of every queue it is in tries again, and it leaves the
  queue admitted, refused at its deadline, or cancelled. A start with ``wait`` arriving
  while others wait on one of its keys joins the queue without trying first. Across
  processes there is no order, and no start is guaranteed a slot before its deadline
  (starts without ``wait`` and other processes may take a freed slot first).
- **Through a database restart**: outside a transaction, an attempt that finds the
  store's database gone (:meth:`BaseStore.connection_lost`) drops its connection
  (:meth:`BaseStore.reconnect`) and the start waits on, polling, listening afresh, until
  it is admitted or its deadline passes; then it raises the last refusal, or the database
  error when the last attempt could not reach the database either.
- **Inside a transaction** on the store's database (a view under ``ATOMIC_REQUESTS``),
  each attempt runs in a savepoint, whose rollback releases what a refused attempt
  locked, where the store allows it (:meth:`BaseStore.waiting_in_transaction`: on
  PostgreSQL, in a ``READ COMMITTED`` transaction that holds no lock of the start's
  keys yet). A lost connection then fails the start: the transaction went with it.
- **Refused where waiting cannot work**: inside a workflow body (a child start does not
  wait), and inside a transaction where the store does not allow it (on SQLite and
  MySQL/MariaDB a refused attempt's locks stay until the transaction ends), a start with
  ``wait`` raises :class:`DurableError` before anything is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Generator, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from asgiref.sync import sync_to_async

from .._core.context import current_context
from ..errors import ConcurrencyLimitError, DurableError

if TYPE_CHECKING:
    from ..stores.base import AsyncReleaseListener, BaseStore, ReleaseListener

logger = logging.getLogger("durable_django.waiting")

#: What ``wait=`` takes: seconds (``int`` or ``float``), a ``timedelta``, or ``None``.
Wait: TypeAlias = "float | timedelta | None"

#: The longest ``wait=`` accepted, in seconds: a start is not a job queue.
MAX_WAIT_SECONDS = 3600.0
#: The first pause of a polling wait, in seconds; it doubles up to :data:`MAX_POLL_SECONDS`.
FIRST_POLL_SECONDS = 0.05
#: The longest pause of a polling wait, in seconds.
MAX_POLL_SECONDS = 1.0
#: The longest wait for a release notification before trying again anyway, in seconds.
SAFETY_SECONDS = 1.0

_T = TypeVar("_T")


def seconds(wait: object) -> float:
    """``wait`` as seconds (``0.0`` for ``None``), or a clear error naming ``wait``."""
    if wait is None:
        return 0.0
    if isinstance(wait, timedelta):
        value = wait.total_seconds()
    elif isinstance(wait, bool) or not isinstance(wait, int | float):
        raise TypeError(
            f"wait must be a number of seconds or a timedelta, not {type(wait).__name__} {wait!r}"
        )
    else:
        value = float(wait)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"wait must be a finite number of seconds >= 0, not {wait!r}")
    if value > MAX_WAIT_SECONDS:
        raise ValueError(
            f"wait must be at most {MAX_WAIT_SECONDS:g} seconds, not {value:g}: a start "
            f"waits a little for a slot; schedule the work for later instead"
        )
    return value


def refuse_in_body() -> None:
    """Raise :class:`DurableError` when called inside a running workflow body."""
    if current_context.get() is not None:
        raise DurableError(
            "wait= is not available inside a workflow body: a child start does not wait "
            "for a slot (it is refused at once, and the body may retry it durably)"
        )


def check_may_wait(store: BaseStore, keys: Collection[str]) -> None:
    """Raise :class:`DurableError` where a start of quota ``keys`` may not wait (besides a
    workflow body, :func:`refuse_in_body`): inside a transaction on the store's database
    that the store does not let it wait in (:meth:`BaseStore.waiting_in_transaction`)."""
    if not keys or not store.in_transaction():
        return
    reason = store.waiting_in_transaction(keys)
    if reason is not None:
        raise DurableError(
            f"wait= is not available inside this transaction on the store's database "
            f"({store.using!r}): {reason}. Start outside atomic(), or without wait=; a view "
            "under ATOMIC_REQUESTS can be decorated with transaction.non_atomic_requests"
        )


# the queues of one process ------------------------------------------------------------


class _Ticket:
    """One waiting start, in the queue of each of its keys."""

    __slots__ = ("async_event", "event", "keys", "loop")

    def __init__(self, keys: tuple[tuple[str, str], ...]) -> None:
        self.keys = keys
        self.event = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.async_event: asyncio.Event | None = None

    def clear(self) -> None:
        """Forget past wakes: called before looking at the queues, so that a wake from
        then on is not lost."""
        self.event.clear()
        if self.async_event is not None:
            self.async_event.clear()

    def wake(self) -> None:
        self.event.set()
        if self.loop is not None and self.async_event is not None:
            # a closed loop raises RuntimeError: nobody waits there any more
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.async_event.set)


_lock = threading.Lock()
_queues: dict[tuple[str, str], deque[_Ticket]] = {}


def _ticket(store: BaseStore, keys: Collection[str]) -> _Ticket:
    scope = store.using if store.using is not None else f"store-{id(store)}"
    return _Ticket(tuple((scope, key) for key in sorted(set(keys))))


def _queued(ticket: _Ticket) -> bool:
    """Whether another start waits on one of the ticket's keys."""
    with _lock:
        return any(key in _queues for key in ticket.keys)


def _join(ticket: _Ticket) -> None:
    with _lock:
        for key in ticket.keys:
            _queues.setdefault(key, deque()).append(ticket)


def _at_head(ticket: _Ticket) -> bool:
    with _lock:
        return all(_queues[key][0] is ticket for key in ticket.keys)


def _leave(ticket: _Ticket) -> None:
    """Take the ticket out of its queues, and wake the starts now at a head."""
    heads: list[_Ticket] = []
    with _lock:
        for key in ticket.keys:
            queue = _queues[key]
            was_head = queue[0] is ticket
            queue.remove(ticket)
            if not queue:
                del _queues[key]
            elif was_head:
                heads.append(queue[0])
    for head in heads:
        head.wake()


def waiting_count() -> int:
    """How many starts of this process are waiting for a slot (for tests and metrics)."""
    with _lock:
        return len({id(ticket) for queue in _queues.values() for ticket in queue})


# the waits ----------------------------------------------------------------------------


class _Pauses:
    """The pause before the next attempt: on a listener, until a release or
    :data:`SAFETY_SECONDS`; polling, from :data:`FIRST_POLL_SECONDS` doubling."""

    def __init__(self) -> None:
        self.poll = FIRST_POLL_SECONDS

    def next(self, remaining: float, retry_after: float, listening: bool) -> float:
        if listening:
            return max(min(remaining, retry_after, SAFETY_SECONDS), 0.0)
        pause = min(remaining, retry_after, self.poll)
        self.poll = min(self.poll * 2, MAX_POLL_SECONDS)
        return max(pause, 0.0)


class _Lost(Exception):
    """An attempt that failed because the store's database went away (``error``); the
    connection was dropped, and the next attempt opens a new one."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _attempting(store: BaseStore, attempt: Callable[[], _T]) -> Callable[[], _T]:
    """``attempt`` as a waiting start tries it, in the thread it runs in: inside a
    transaction, in a savepoint, whose rollback releases a refused attempt's locks (a
    lost connection then fails the start: the transaction is gone with it); outside one,
    a lost connection is dropped and the attempt made again at once on a new one (the
    old one may have died long ago); when that fails too, it is reported as
    :class:`_Lost`, to wait on. Every attempt starts the same run id
    (:func:`durable_django._runtime.starting.start`): one whose answer was lost with its
    connection after its run was created finds that run."""

    def trying() -> _T:
        if store.in_transaction():
            with store.atomic():
                return attempt()
        tries = 0
        while True:
            tries += 1
            try:
                return attempt()
            except ConcurrencyLimitError:
                raise
            except Exception as error:
                if not store.connection_lost(error):
                    raise
                store.reconnect()
                if tries > 1:  # a new connection failed too: the database is away
                    raise _Lost(error) from error

    return trying


class _Waiting:
    """The state of one waiting start, which the sync and async loops share: its place in
    the queues, its deadline, its last failure, and what comes before the next attempt."""

    def __init__(self, store: BaseStore, keys: Collection[str], wait: float) -> None:
        self.deadline = time.monotonic() + wait
        self.ticket = _ticket(store, keys)
        #: The last attempt's refusal, or its lost connection; ``None`` before any.
        self.failure: ConcurrencyLimitError | _Lost | None = None
        #: Whether to pause before the next attempt.
        self.pause_first = False
        #: Whether a listener was asked for since the last lost connection.
        self.listened = False
        self.pauses = _Pauses()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def failed(self, failure: ConcurrencyLimitError | _Lost) -> None:
        """An attempt was refused, or lost its connection: pause before the next; after a
        lost connection, listen afresh (the listener's connection went too)."""
        self.failure = failure
        self.pause_first = True
        if isinstance(failure, _Lost):
            self.listened = False

    def listening(self, opened: bool) -> None:
        """A listener was asked for (``opened``: and one was opened): when one was opened
        after a failure, try at once (a release between that failure and the listening
        would not be heard)."""
        self.listened = True
        self.pause_first = self.pause_first and not opened

    def pause(self, remaining: float, listening: bool) -> float:
        self.pause_first = False
        refusal = self.failure
        if isinstance(refusal, ConcurrencyLimitError):
            return self.pauses.next(remaining, refusal.retry_after, listening)
        return self.pauses.next(remaining, math.inf, listening)

    def give_up(self) -> Exception:
        """What the start raises at its deadline: the last refusal, or the database error of
        a last attempt that lost its connection."""
        assert self.failure is not None
        return self.failure.error if isinstance(self.failure, _Lost) else self.failure


@contextlib.contextmanager
def _unwrapped() -> Iterator[None]:
    """A lost connection of the last attempt raised as the database error it was."""
    try:
        yield
    except _Lost as lost:
        raise lost.error from None


def _listener(store: BaseStore, keys: Collection[str]) -> ReleaseListener | None:
    """The store's listener, or ``None`` to poll: when it has none, or cannot open one."""
    try:
        return store.release_listener(keys)
    except Exception:
        logger.warning("cannot listen for quota releases; polling instead", exc_info=True)
        return None


def _waited(listener: ReleaseListener, pause: float) -> bool:
    """Wait on ``listener``; False (and the listener closed) when it failed."""
    try:
        listener.wait(pause)
    except Exception:
        logger.warning("listening for quota releases failed; polling instead", exc_info=True)
        with contextlib.suppress(Exception):
            listener.close()
        return False
    return True


async def _alistener(store: BaseStore, keys: Collection[str]) -> AsyncReleaseListener | None:
    try:
        return await store.arelease_listener(keys)
    except Exception:
        logger.warning("cannot listen for quota releases; polling instead", exc_info=True)
        return None


async def _awaited(listener: AsyncReleaseListener, pause: float) -> bool:
    try:
        await listener.wait(pause)
    except Exception:
        logger.warning("listening for quota releases failed; polling instead", exc_info=True)
        with contextlib.suppress(Exception):
            await listener.close()
        return False
    return True


#: The moves of a waiting start (:func:`_moves`), which its sync or async driver makes.
_TRY = "try"  # an attempt; its refusal or lost connection is sent back
_TURN = "turn"  # wait, for at most the seconds given, to be woken at the queues' head
_LISTEN = "listen"  # open a listener (closing the one before); whether it opened is sent back
_PAUSE = "pause"  # pause the seconds given, on the listener or polling; False back if it failed
_LAST_TRY = "last try"  # the deadline passed before any attempt: one, whatever it gives
_GIVE_UP = "give up"  # the deadline passed: raise the last failure

_Move: TypeAlias = "tuple[str, float]"
_Answer: TypeAlias = "ConcurrencyLimitError | _Lost | bool | None"


def _moves(waiting: _Waiting) -> Generator[_Move, _Answer, None]:
    """The waiting loop's decisions, without its waits: what to do next, given what the
    last move gave. The sync and async drivers (:func:`start_waiting`,
    :func:`astart_waiting`) carry each move out; closing the generator (the driver
    returning a start) takes the ticket out of its queues."""
    ticket = waiting.ticket
    joined = False
    try:
        if not _queued(ticket):
            waiting.failed(_failure((yield _TRY, 0.0)))
        _join(ticket)
        joined = True
        listening = False
        while (remaining := waiting.remaining()) > 0:
            ticket.clear()
            if not _at_head(ticket):
                yield _TURN, min(remaining, SAFETY_SECONDS)
                waiting.pause_first = False
                continue
            if not waiting.listened:
                listening = (yield _LISTEN, 0.0) is True
                waiting.listening(listening)
            if waiting.pause_first:
                if (yield _PAUSE, waiting.pause(remaining, listening)) is False:
                    listening = False
                    waiting.listened = False  # listen afresh before the next attempt
                continue
            waiting.failed(_failure((yield _TRY, 0.0)))
    finally:
        if joined:
            _leave(ticket)
    # Queued behind others and never tried: one last attempt.
    yield (_LAST_TRY if waiting.failure is None else _GIVE_UP), 0.0


def _failure(answer: _Answer) -> ConcurrencyLimitError | _Lost:
    assert isinstance(answer, ConcurrencyLimitError | _Lost)
    return answer


def start_waiting(
    store: BaseStore, keys: Collection[str], wait: float, attempt: Callable[[], _T]
) -> _T:
    """``attempt()`` (a start), tried again while its quota refuses it or its database is
    out of reach, for up to ``wait`` seconds; then the last refusal is raised (or the
    database error, when the last attempt could not reach it)."""
    if not keys:
        return attempt()
    trying = _attempting(store, attempt)
    waiting = _Waiting(store, keys, wait)
    moves = _moves(waiting)
    listener: ReleaseListener | None = None
    try:
        move, seconds = next(moves)
        while True:
            answer: _Answer = None
            if move == _TRY:
                try:
                    return trying()
                except (ConcurrencyLimitError, _Lost) as failure:
                    answer = failure
            elif move == _TURN:
                waiting.ticket.event.wait(seconds)
            elif move == _LISTEN:
                if listener is not None:
                    with contextlib.suppress(Exception):
                        listener.close()
                listener = _listener(store, keys)
                answer = listener is not None
            elif move == _PAUSE:
                if listener is None:
                    time.sleep(seconds)
                elif not _waited(listener, seconds):
                    listener, answer = None, False
            elif move == _LAST_TRY:
                with _unwrapped():
                    return trying()
            else:
                raise waiting.give_up()
            move, seconds = moves.send(answer)
    finally:
        moves.close()
        if listener is not None:
            with contextlib.suppress(Exception):
                listener.close()


async def astart_waiting(
    store: BaseStore, keys: Collection[str], wait: float, attempt: Callable[[], _T]
) -> _T:
    """:func:`start_waiting` for async code: ``attempt`` (sync) runs in a thread
    (``sync_to_async``), and the start waits without blocking the event loop. A cancelled
    wait leaves its queue and closes its listener; nothing was started."""
    if not keys:
        return await sync_to_async(attempt)()
    trying = sync_to_async(_attempting(store, attempt))
    waiting = _Waiting(store, keys, wait)
    woken = waiting.ticket.async_event = asyncio.Event()
    waiting.ticket.loop = asyncio.get_running_loop()
    moves = _moves(waiting)
    listener: AsyncReleaseListener | None = None
    try:
        move, seconds = next(moves)
        while True:
            answer: _Answer = None
            if move == _TRY:
                try:
                    return await trying()
                except (ConcurrencyLimitError, _Lost) as failure:
                    answer = failure
            elif move == _TURN:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), seconds)
            elif move == _LISTEN:
                if listener is not None:
                    with contextlib.suppress(Exception):
                        await listener.close()
                listener = await _alistener(store, keys)
                answer = listener is not None
            elif move == _PAUSE:
                if listener is None:
                    await asyncio.sleep(seconds)
                elif not await _awaited(listener, seconds):
                    listener, answer = None, False
            elif move == _LAST_TRY:
                with _unwrapped():
                    return await trying()
            else:
                raise waiting.give_up()
            move, seconds = moves.send(answer)
    finally:
        moves.close()
        if listener is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(listener.close())


__all__ = [
    "FIRST_POLL_SECONDS",
    "MAX_POLL_SECONDS",
    "MAX_WAIT_SECONDS",
    "SAFETY_SECONDS",
    "Wait",
    "astart_waiting",
    "check_may_wait",
    "refuse_in_body",
    "seconds",
    "start_waiting",
    "waiting_count",
]
