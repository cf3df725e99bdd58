"""The tick: hand on what is due, and fire the due schedule windows.

Each hand-on is a conditional update (``store.transition``) that only one ticker wins, so
ticking is idempotent and safe from several processes at once.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from .._core.records import TickResult
from ..observability import events as observing
from ..status import RunStatus

if TYPE_CHECKING:
    from .._core.runtime import Runtime


def tick(engine: Runtime, now: datetime.datetime, limit: int) -> TickResult:
    """See :meth:`durable_django.Engine.tick`."""
    config = engine.config
    store = engine.store
    pending_before = now - datetime.timedelta(seconds=config.pending_resend_seconds)
    counts = dict.fromkeys(TickResult.__dataclass_fields__, 0)
    for run in store.due_runs(now, pending_before, limit):
        if run.status in (RunStatus.SUSPENDED, RunStatus.BLOCKED):
            kind = "woken" if run.status == RunStatus.SUSPENDED else "unblocked"
            moved = store.transition(
                run.run_id, [run.status], RunStatus.PENDING, wake_at=None, wait=None
            )
        elif run.status == RunStatus.RUNNING:
            kind = "recovered"
            moved = store.transition(
                run.run_id,
                [RunStatus.RUNNING],
                RunStatus.PENDING,
                lease_expired_before=now,
                lease_owner="",
                lease_expires_at=None,
            )
        else:
            kind = "resent"
            moved = store.transition(
                run.run_id,
                [RunStatus.PENDING],
                RunStatus.PENDING,
                updated_before=pending_before,
            )
        if moved:
            counts[kind] += 1
            engine.send_each((run,))
    if store.is_shared:
        from .schedules import fire_due, sync_declared

        sync_declared(engine)
        for firing in fire_due(engine, now):
            if firing.claimed:
                counts["fired" if firing.run_id else "skipped_windows"] += 1
    result = TickResult(**counts)
    observing.ticked(result)
    return result


__all__ = ["TickResult", "tick"]
