"""The purge: delete finished runs, with their tags and steps, taken signals and expired
tickets, through the store.

A run still inside the window of a rate limit it counts in (the longest ``per`` declared)
is kept, whatever ``older_than`` says: deleting it would free its units early.

It deletes in batches, each its own transaction, so a large purge neither holds locks for
long nor loads many runs at once. Which runs may go is retention's rule
(:mod:`durable_django._rules.retention`).
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from typing import TYPE_CHECKING

from django.utils import timezone

from .._rules.retention import PurgeResult, cutoff, finished_statuses

if TYPE_CHECKING:
    from .._core.runtime import Runtime


def purge(
    engine: Runtime,
    older_than: datetime.timedelta | datetime.datetime,
    statuses: Collection[str] | None,
    batch_size: int,
) -> PurgeResult:
    """See :meth:`durable_django.Engine.purge`."""
    now = timezone.now()
    before = cutoff(older_than, now)
    statuses = finished_statuses(statuses)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
    runs_before = min(before, rate_windows_start(engine, now))
    store = engine.store
    runs = signals = 0
    after = None
    while True:
        deleted, after = store.purge_runs(
            runs_before, statuses, engine.read_namespace, batch_size, after
        )
        runs += deleted
        if after is None:
            break
    while True:
        deleted = store.purge_signals(before, batch_size)
        signals += deleted
        if deleted < batch_size:
            break
    tickets = 0
    while True:
        deleted = store.purge_tickets(timezone.now(), batch_size)
        tickets += deleted
        if deleted < batch_size:
            break
    return PurgeResult(runs=runs, signals=signals, tickets=tickets)


def rate_windows_start(engine: Runtime, now: datetime.datetime) -> datetime.datetime:
    """The start of the longest rate limit window declared on the engine's workflows at
    ``now`` (``now`` when none is declared): a run that finished before it was created
    before it too, so it counts in no declared window any more and may be purged."""
    longest = max(
        (rate.per for definition in engine.registry.all() for rate in definition.rate_limits),
        default=0.0,
    )
    return now - datetime.timedelta(seconds=longest)


__all__ = ["purge", "rate_windows_start"]
