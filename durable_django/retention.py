"""Retention: delete finished runs, with their tags and steps, and taken signals.

Nothing is deleted on its own: finished runs stay for the admin, ``durable show`` and
``engine.get_run`` until ``engine.purge`` (or ``manage.py durable purge``) removes those
that finished before a cutoff. It deletes in batches, each its own transaction, so a
large purge neither holds locks for long nor loads many runs at once.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.utils import timezone

from .errors import DurableError
from .status import TERMINAL_STATUSES

if TYPE_CHECKING:
    from .engines import Engine


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """What a purge deleted: finished runs (with their tags and steps) and taken signals."""

    runs: int = 0
    signals: int = 0


def cutoff(
    older_than: datetime.timedelta | datetime.datetime, now: datetime.datetime
) -> datetime.datetime:
    """The moment before which things are old: ``now - older_than``, or a given moment."""
    if isinstance(older_than, datetime.datetime):
        return older_than
    if not isinstance(older_than, datetime.timedelta) or older_than <= datetime.timedelta(0):
        raise ValueError(
            f"older_than must be a positive timedelta or a datetime, not {older_than!r}"
        )
    return now - older_than


def finished_statuses(statuses: Collection[str] | None) -> list[str]:
    """The statuses to purge: the terminal ones given, all of them by default."""
    if statuses is None:
        return sorted(TERMINAL_STATUSES)
    if isinstance(statuses, str):
        statuses = [statuses]
    statuses = list(statuses)
    active = [s for s in statuses if s not in TERMINAL_STATUSES]
    if active or not statuses:
        raise ValueError(
            f"only finished runs can be purged: statuses must be among "
            f"{sorted(TERMINAL_STATUSES)}, not {statuses!r}"
        )
    return statuses


def purge(
    engine: Engine,
    older_than: datetime.timedelta | datetime.datetime,
    statuses: Collection[str] | None,
    batch_size: int,
) -> PurgeResult:
    """See :meth:`durable_django.Engine.purge`."""
    before = cutoff(older_than, timezone.now())
    statuses = finished_statuses(statuses)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
    store = engine.store
    purge_runs = getattr(store, "purge_runs", None)
    purge_signals = getattr(store, "purge_signals", None)
    if purge_runs is None or purge_signals is None:
        raise DurableError(f"{store!r} cannot purge: it has no purge_runs/purge_signals")
    runs = signals = 0
    while True:
        deleted = purge_runs(before, statuses, engine.read_namespace, batch_size)
        runs += deleted
        if deleted < batch_size:
            break
    while True:
        deleted = purge_signals(before, batch_size)
        signals += deleted
        if deleted < batch_size:
            break
    return PurgeResult(runs=runs, signals=signals)
