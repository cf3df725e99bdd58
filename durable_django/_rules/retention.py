"""Retention's rule: which finished runs a purge may delete, and what it deleted.

Nothing is deleted on its own: finished runs stay for the admin, ``durable show`` and
``engine.get_run`` until ``engine.purge`` (or ``manage.py durable purge``) removes those
that finished before a cutoff (:mod:`durable_django._runtime.purging` drives it through the
store, in batches).

A run is deleted only when its whole ancestry has finished too: an active parent (or
grandparent...) replays its body and reads its children's outcomes, and would wait
forever for a child that is gone. :func:`active_ancestors` finds the runs of a batch that
must stay, with one read per level of ancestry for the whole batch.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from .._core.lifecycle import TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """What a purge deleted: finished runs (with their tags and steps), taken signals, and
    fair quotas' expired tickets."""

    runs: int = 0
    signals: int = 0
    tickets: int = 0


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


#: ``{run_id: (status, parent_id)}`` for the runs a read found.
AncestorRows = Mapping[str, tuple[str, str | None]]


def active_ancestors(
    parents: Mapping[str, str | None], read: Callable[[set[str]], AncestorRows]
) -> dict[str, tuple[str, str]]:
    """The runs of ``parents`` (``{run_id: parent_id}``) with an ancestor that has not
    finished, each with that ancestor: ``{run_id: (ancestor_id, its status)}``.

    ``read(ids)`` returns ``(status, parent_id)`` for the ids it finds; it is called once
    per level of ancestry for the whole batch (a status that is not a finished one, such
    as a row another transaction holds, counts as unfinished). A run whose ancestor row is
    gone has a finished ancestry from there on.
    """
    found: dict[str, tuple[str, str]] = {}
    known: dict[str, tuple[str, str | None] | None] = {}
    # Each run still walking up, with the ancestor it has reached and those it has passed
    # (a cycle, which only a hand-edited table can hold, ends the walk).
    walking = {run_id: (parent_id, {run_id}) for run_id, parent_id in parents.items() if parent_id}
    while walking:
        unknown = {ancestor for ancestor, _ in walking.values() if ancestor not in known}
        if unknown:
            rows = read(unknown)
            known.update((ancestor, rows.get(ancestor)) for ancestor in unknown)
        still = {}
        for run_id, (ancestor, passed) in walking.items():
            row = known[ancestor]
            if row is None:
                continue
            status, parent_id = row
            if status not in TERMINAL_STATUSES:
                found[run_id] = (ancestor, status)
            elif parent_id and parent_id not in passed:
                still[run_id] = (parent_id, passed | {ancestor})
        walking = still
    return found
