"""The lease keeper: one daemon thread renewing the leases of the turns running in this
process while their bodies run."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import (
    TYPE_CHECKING,
    Any,
)

from django.utils import timezone

from ..._core.records import RunRecord
from ...db import close_connections, one_line
from ...status import RunStatus

if TYPE_CHECKING:
    from ..._core.runtime import Runtime
    from .context import Context

logger = logging.getLogger("durable_django.execution")


@dataclasses.dataclass(slots=True)
class _Lease:
    """A turn's lease as its keeper sees it; times on this process's monotonic clock."""

    engine: Runtime
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
    def kept(self, engine: Runtime, context: Context, seconds: float) -> Iterator[None]:
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


def kept(engine: Runtime, context: Context, seconds: float) -> Any:
    """Renew the run's lease every third of its length while the body runs."""
    if not engine.store.is_shared:
        return contextlib.nullcontext()
    return _lease_keeper.kept(engine, context, seconds)


__all__ = ["kept"]
