"""Run messages handed to a thread of the process that sends them in batches.

A start's message is sent once its transaction commits. Sending it inline costs the
caller a broker round trip and kombu's work per message; handing it to :class:`Sender`
costs a lock and an append. The sender's thread takes every message waiting, sends them
with one :func:`~durable_django._runtime.publishing.publish_runs` call (one round trip on Redis),
and waits for the next ones. Nothing is handed over before the commit, so a refused or
rolled-back start still sends nothing.

A message the thread cannot send (the broker down past the publish retry policy, the
process killed before the thread sent it) is what an inline send that failed is: the
run is committed and pending, and the tick sends it again after
``PENDING_RESEND_SECONDS``. :func:`flush` waits for what was handed over; it runs at the
interpreter's exit and after each Celery task, so a script or a worker process that
ends does not leave its messages to the tick.

When Celery's publishing is watched (a tracing integration, ``task-sent`` events: see
:meth:`~durable_django._runtime.publishing.Publisher.watched`), the caller's ``contextvars``
context is taken with its messages and the thread sends them in it, so that their publish
spans and the trace in their headers are the caller's (the request's).

Messages are sent inline, as before, with Celery's ``task_always_eager`` (the run
executes at once in the caller, as Celery does) and under uWSGI without threads (an
application's threads never run there unless ``enable-threads`` is set).
"""

from __future__ import annotations

import atexit
import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .publishing import Publisher, Run, Runs, publisher

logger = logging.getLogger("durable_django")

#: How long the interpreter's exit waits for the messages not sent yet.
EXIT_FLUSH_SECONDS = 5.0

#: The most messages one send of the thread takes.
BATCH_LIMIT = 500

#: What is handed over: tuples whose first item is a run id (the module's own sender
#: hands over ``(run_id, run, publisher, context)``).
Items = Sequence[tuple[Any, ...]]


class Sender:
    """Sends the messages handed to it from a thread of its own, in batches, in the
    order they were handed over. ``send`` is called with each batch from that thread."""

    def __init__(self, send: Callable[[Items], None], *, batch_limit: int = BATCH_LIMIT) -> None:
        self._send = send
        self._batch_limit = batch_limit
        self._changed = threading.Condition(threading.Lock())
        self._pending: list[tuple[Any, ...]] = []
        self._handed = 0  # messages handed over so far
        self._settled = 0  # of those, sent or given up (and logged)
        self._thread: threading.Thread | None = None

    def hand_over(self, items: Items) -> None:
        """Queue messages for the thread; return at once. Raises ``RuntimeError``, with
        nothing queued, when the thread cannot start (the interpreter is exiting)."""
        with self._changed:
            if self._thread is None:
                self._thread = self._start()
            self._pending.extend(items)
            self._handed += len(items)
            self._changed.notify_all()

    def _start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name="durable-sender", daemon=True)
        thread.start()
        return thread

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message handed over so far is sent (or given up); False if
        ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            target = self._handed
            while self._settled < target:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
        return True

    @property
    def handed(self) -> int:
        """Messages handed over since the sender was made."""
        with self._changed:
            return self._handed

    @property
    def waiting(self) -> int:
        """Messages handed over and not sent yet."""
        with self._changed:
            return self._handed - self._settled

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
                batch = self._pending[: self._batch_limit]
                del self._pending[: self._batch_limit]
            try:
                self._send(batch)
            except Exception:
                logger.exception(
                    "durable_django: could not send the messages of %d run(s) (%s%s); "
                    "they stay pending and the tick sends them again",
                    len(batch),
                    ", ".join(str(item[0]) for item in batch[:5]),
                    ", ..." if len(batch) > 5 else "",
                )
            with self._changed:
                self._settled += len(batch)
                self._changed.notify_all()


def _send_items(items: Items) -> None:
    """Send ``(run_id, run, publisher, context)`` items, each with the publisher of the
    thread that handed it over (Celery's current app is the creating thread's) and in the
    caller's context when one was taken, one send per publisher and context; raise the
    first error once every send was tried."""
    by_sender: dict[tuple[Publisher, int], tuple[contextvars.Context | None, list[Run]]] = {}
    for _, message, current, context in items:
        key = (current, id(context))  # a Context is not hashable; a hand-over takes its own
        group = by_sender.get(key)
        if group is None:
            group = by_sender[key] = (context, [])
        group[1].append(message)
    failed: Exception | None = None
    for (current, _), (context, runs) in by_sender.items():
        try:
            if context is None:
                current.send(runs)
            else:
                context.run(current.send, runs)
        except Exception as error:
            failed = failed or error
    if failed is not None:
        raise failed


_sender: Sender | None = None
_sender_lock = threading.Lock()


def sender() -> Sender:
    """This process's sender (a forked child makes its own)."""
    global _sender
    current = _sender
    if current is None:
        with _sender_lock:
            current = _sender
            if current is None:
                current = _sender = Sender(_send_items)
    return current


def _forget_after_fork() -> None:
    # the parent's thread does not exist in the child, and its messages are the parent's
    global _sender, _sender_lock
    _sender = None
    _sender_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def send_later(runs: Runs) -> None:
    """Send the ``execute_run`` message of each run (a
    :class:`~durable_django._runtime.publishing.RunMessage` or ``(run_id, queue)``) from the
    sender's thread, with the Celery app current in the caller's thread (and its ``contextvars``
    context when the publishing is watched); inline under Celery's ``task_always_eager``
    or uWSGI without threads."""
    if not runs:
        return
    current = publisher()
    if current.eager or not threads_run():
        current.send(runs)
        return
    context = contextvars.copy_context() if current.watched() else None
    try:
        sender().hand_over([(run[0], run, current, context) for run in runs])
    except RuntimeError:  # no new thread once the interpreter is exiting: send here
        current.send(runs)


def flush(timeout: float | None = None) -> bool:
    """Wait until this process's messages handed to the sender so far are sent; False if
    ``timeout`` seconds passed first. Nothing to wait for: True at once."""
    current = _sender
    return True if current is None else current.flush(timeout)


def threads_run() -> bool:
    """False under uWSGI started without ``enable-threads`` (or ``threads``), where an
    application's threads never run."""
    uwsgi = sys.modules.get("uwsgi")
    if uwsgi is None:
        return True
    options = getattr(uwsgi, "opt", {}) or {}
    return bool(options.get("enable-threads") or options.get("threads"))


def _flush_at_exit() -> None:
    if not flush(EXIT_FLUSH_SECONDS):
        current = _sender
        logger.warning(
            "durable_django: %d run message(s) not sent after %.0f s at exit; the tick "
            "sends them again",
            current.waiting if current is not None else 0,
            EXIT_FLUSH_SECONDS,
        )


atexit.register(_flush_at_exit)

__all__ = ["EXIT_FLUSH_SECONDS", "Sender", "flush", "send_later", "sender", "threads_run"]
