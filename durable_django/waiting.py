"""Waiting a little for a quota slot (``wait=``) instead of being refused at once.

A start with ``wait`` (seconds, or a ``timedelta``) that a quota refuses tries again, with
the same atomic lock-count-insert of the store, until it is admitted or ``wait`` has
passed; then the last refusal is raised (:class:`ConcurrencyLimitError`, with its
``retry_after``). Waiting never admits more than the limit: each attempt is a whole
start. ``wait=None`` or ``0`` is the start of today, at its cost.

- **Woken on release**: between attempts, a store that can tell (the ORM store on
  PostgreSQL: ``LISTEN``/``NOTIFY``, see :mod:`durable_django.stores.postgres.listening`)
  is listened to, on a connection of its own opened *before* the next attempt (so a
  release between a refusal and the listening is not missed); the wait for a release
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
- **Refused where waiting cannot work**: inside a workflow body (a child start does not
  wait) and inside a transaction on the store's database (its locks would be held while
  waiting, and the releases it waits for may stay unseen), a start with ``wait`` raises
  :class:`DurableError` before anything is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from datetime import timedelta
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from .errors import ConcurrencyLimitError, DurableError

if TYPE_CHECKING:
    from .stores.base import AsyncReleaseListener, BaseStore, ReleaseListener

logger = logging.getLogger(__name__)

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
    from .execution import current_context  # execution imports the start path

    if current_context.get() is not None:
        raise DurableError(
            "wait= is not available inside a workflow body: a child start does not wait "
            "for a slot (it is refused at once, and the body may retry it durably)"
        )


def check_may_wait(store: BaseStore) -> None:
    """Raise :class:`DurableError` where a start may not wait: inside a workflow body, or
    inside a transaction on the store's database."""
    refuse_in_body()
    if store.in_transaction():
        raise DurableError(
            "wait= is not available inside a transaction on the store's database "
            f"({store.using!r}): waiting would hold its locks and might never see a slot "
            "free; start outside atomic() (or without wait=)"
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

    def next(self, remaining: float, refusal: ConcurrencyLimitError, listening: bool) -> float:
        if listening:
            return max(min(remaining, refusal.retry_after, SAFETY_SECONDS), 0.0)
        pause = min(remaining, refusal.retry_after, self.poll)
        self.poll = min(self.poll * 2, MAX_POLL_SECONDS)
        return max(pause, 0.0)


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


def start_waiting(
    store: BaseStore, keys: Collection[str], wait: float, attempt: Callable[[], _T]
) -> _T:
    """``attempt()`` (a start), tried again while its quota refuses it, for up to ``wait``
    seconds; then the last refusal is raised."""
    deadline = time.monotonic() + wait
    if not keys:
        return attempt()
    ticket = _ticket(store, keys)
    refusal: ConcurrencyLimitError | None = None
    if not _queued(ticket):
        try:
            return attempt()
        except ConcurrencyLimitError as error:
            refusal = error
    _join(ticket)
    listener: ReleaseListener | None = None
    listened = False
    pause_first = refusal is not None
    pauses = _Pauses()
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            ticket.event.clear()  # before looking: a wake from now on is not lost
            if not _at_head(ticket):
                ticket.event.wait(min(remaining, SAFETY_SECONDS))
                pause_first = False
                continue
            if not listened:
                listened = True
                listener = _listener(store, keys)
                pause_first = pause_first and listener is None
            if pause_first and refusal is not None:
                pause = pauses.next(remaining, refusal, listener is not None)
                if listener is None:
                    time.sleep(pause)
                elif not _waited(listener, pause):
                    listener = None
                pause_first = False
                continue
            try:
                return attempt()
            except ConcurrencyLimitError as error:
                refusal = error
                pause_first = True
    finally:
        _leave(ticket)
        if listener is not None:
            listener.close()
    if refusal is None:  # queued behind others, and never tried
        return attempt()
    raise refusal


async def astart_waiting(
    store: BaseStore, keys: Collection[str], wait: float, attempt: Callable[[], Awaitable[_T]]
) -> _T:
    """:func:`start_waiting` for async code: it waits without blocking the event loop. A
    cancelled wait leaves its queue and closes its listener; nothing was started."""
    deadline = time.monotonic() + wait
    if not keys:
        return await attempt()
    ticket = _ticket(store, keys)
    ticket.loop = asyncio.get_running_loop()
    ticket.async_event = asyncio.Event()
    refusal: ConcurrencyLimitError | None = None
    if not _queued(ticket):
        try:
            return await attempt()
        except ConcurrencyLimitError as error:
            refusal = error
    _join(ticket)
    listener: AsyncReleaseListener | None = None
    listened = False
    pause_first = refusal is not None
    pauses = _Pauses()
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            ticket.async_event.clear()  # before looking: a wake from now on is not lost
            if not _at_head(ticket):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        ticket.async_event.wait(), min(remaining, SAFETY_SECONDS)
                    )
                pause_first = False
                continue
            if not listened:
                listened = True
                listener = await _alistener(store, keys)
                pause_first = pause_first and listener is None
            if pause_first and refusal is not None:
                pause = pauses.next(remaining, refusal, listener is not None)
                if listener is None:
                    await asyncio.sleep(pause)
                elif not await _awaited(listener, pause):
                    listener = None
                pause_first = False
                continue
            try:
                return await attempt()
            except ConcurrencyLimitError as error:
                refusal = error
                pause_first = True
    finally:
        _leave(ticket)
        if listener is not None:
            await asyncio.shield(listener.close())
    if refusal is None:
        return await attempt()
    raise refusal


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
