"""Refusals that explain themselves: who holds a quota key, and when a slot likely frees.

A refused start's :class:`~durable_django.ConcurrencyLimitError` gets ``retry_after``:
the seconds until a slot of its key is likely to free. It is estimated once the start's
transaction has ended, from two cheap reads through the tag index:

- the **holders**: the runs holding the key now, and their ages (since created);
- the **history**: how long the key's latest :data:`HISTORY_RUNS` runs finished in the
  last :data:`HISTORY_WINDOW` held their slot (from created to finished).

Each holder's expected remaining time is the median of what is left of the recorded
durations longer than its age (a holder of age ``a`` will last as long as runs that
lasted past ``a`` did); a holder older than every recorded duration is given
:data:`OVERDUE_FRACTION` of the typical (median) duration. The slot frees when enough
holders have ended for the start to fit: the soonest such time, never below
:data:`~durable_django.errors.DEFAULT_RETRY_AFTER` (1 second). With no history, or when a
read fails, ``retry_after`` is that 1 second and ``estimate.basis`` says why.

A key whose limit in force admits no start of the refused one's weight (an operator's
pause, an override below the weight) frees no slot that would help: ``retry_after`` is
then the seconds until the override ends, when it has an ``until``, and the 1 second
otherwise, with ``basis`` ``"paused"``.
"""

from __future__ import annotations

import datetime
import heapq
import logging
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.utils import timezone

from .._core.records import RunRecord
from .._rules.concurrency import DEFAULT_CONCURRENCY_STATUSES, quota_tag
from .._rules.overrides import scope_of
from ..errors import DEFAULT_RETRY_AFTER, ConcurrencyLimitError

if TYPE_CHECKING:
    from .._core.runtime import Runtime

logger = logging.getLogger("durable_django.estimates")

#: How many of a key's latest finished runs the estimate reads.
HISTORY_RUNS = 50
#: How far back the estimate looks for them.
HISTORY_WINDOW = datetime.timedelta(hours=24)
#: The share of the typical duration left to a holder older than every recorded run.
OVERDUE_FRACTION = 0.5

#: What an estimate was based on.
HISTORY = "history"
NO_HISTORY = "no history"
READ_FAILED = "read failed"
PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class Holder:
    """A run holding a quota key: its id, workflow and status, when it was created and
    (last) started, its ``age`` in seconds since created, and the ``units`` of the key it
    occupies (its weight under the key's quota)."""

    run_id: str
    workflow: str
    status: str
    created_at: datetime.datetime | None
    started_at: datetime.datetime | None
    age: float
    units: int = 1


@dataclass(frozen=True, slots=True)
class Estimate:
    """How ``retry_after`` was reached: the ``seconds`` (at least 1), its ``basis``
    (``"history"``, ``"no history"``, ``"read failed"`` or ``"paused"``), how many finished runs it
    read (``samples``), their median slot-holding time (``typical``, seconds, ``None``
    without history), and the age of the key's oldest holder (``oldest_age``, ``None``
    when nothing holds it)."""

    seconds: float
    basis: str
    samples: int = 0
    typical: float | None = None
    oldest_age: float | None = None


def units(holder: Holder) -> int:
    """The units of its key one holder occupies (its weight, 1 unless weighted)."""
    return holder.units


def holders(
    engine: Runtime,
    key: str,
    statuses: Collection[str] = DEFAULT_CONCURRENCY_STATUSES,
    now: datetime.datetime | None = None,
) -> list[Holder]:
    """The runs holding ``key`` (in ``statuses``, in the engine's read namespace), oldest
    first."""
    now = now or timezone.now()
    tag = quota_tag(key)
    runs = engine.store.quota_holders(tag, statuses, engine.read_namespace)
    return [_holder(run, tag, now) for run in runs]


def _holder(run: RunRecord, tag: str, now: datetime.datetime) -> Holder:
    age = (now - run.created_at).total_seconds() if run.created_at else 0.0
    return Holder(
        run.run_id,
        run.workflow,
        run.status,
        run.created_at,
        run.started_at,
        age,
        run.weights.get(tag, 1),
    )


def durations(engine: Runtime, key: str, now: datetime.datetime | None = None) -> list[float]:
    """How long (seconds, created to finished) the key's latest finished runs held their
    slot, at most :data:`HISTORY_RUNS` of those finished within :data:`HISTORY_WINDOW`."""
    now = now or timezone.now()
    spans = engine.store.finished_spans(
        quota_tag(key), engine.read_namespace, now - HISTORY_WINDOW, HISTORY_RUNS
    )
    return [max(0.0, (finished - created).total_seconds()) for created, finished in spans]


def remaining(age: float, recorded: Sequence[float]) -> float:
    """A holder's expected remaining seconds at ``age``: the median of what is left of the
    ``recorded`` durations longer than ``age``, or :data:`OVERDUE_FRACTION` of their median
    when none is."""
    left = [duration - age for duration in recorded if duration > age]
    if left:
        return statistics.median(left)
    return OVERDUE_FRACTION * statistics.median(recorded)


def soonest_free(
    held: Sequence[Holder],
    recorded: Sequence[float],
    limit: int,
    needed: int = 1,
    ahead: int = 0,
) -> float:
    """Seconds until ``needed`` units fit under ``limit``: the holders expected to end
    first end until they do (``0`` when they already fit).

    With ``ahead`` units of a fair quota's tickets served first (:func:`turn_comes`),
    when the start's turn likely comes."""
    over = sum(units(holder) for holder in held) + ahead + needed - limit
    if over <= 0:
        return 0.0
    if ahead and limit > 0:
        return turn_comes(held, recorded, limit, needed, ahead)
    ends = sorted((remaining(holder.age, recorded), units(holder)) for holder in held)
    freed = 0
    for seconds, occupied in ends:
        freed += occupied
        if freed >= over:
            return seconds
    return ends[-1][0] if ends else 0.0


def turn_comes(
    held: Sequence[Holder], recorded: Sequence[float], limit: int, needed: int, ahead: int
) -> float:
    """Seconds until a start weighing ``needed`` units gets them after ``ahead`` units of
    older tickets: each unit of the limit frees when its holder likely ends (at once when
    it is free now), and each ticket ahead then holds one for the typical (median)
    recorded duration before it frees again; the start's turn comes when the last of its
    units frees."""
    typical = statistics.median(recorded)
    slots = [0.0] * max(0, limit - sum(units(holder) for holder in held))
    for holder in held:
        slots += [remaining(holder.age, recorded)] * units(holder)
    heapq.heapify(slots)
    for _ in range(ahead):
        heapq.heappush(slots, heapq.heappop(slots) + typical)
    return max(heapq.heappop(slots) for _ in range(min(needed, len(slots))))


def estimate(
    engine: Runtime,
    key: str,
    limit: int,
    statuses: Collection[str] = DEFAULT_CONCURRENCY_STATUSES,
    now: datetime.datetime | None = None,
    needed: int = 1,
    ahead: int = 0,
) -> Estimate:
    """When a start weighing ``needed`` units under ``key`` (``limit``) likely fits, after
    ``ahead`` units of a fair quota's older tickets: two reads, no writes. A read
    that fails gives the default, with ``basis="read failed"``; it never raises."""
    now = now or timezone.now()
    try:
        with engine.store.atomic():  # a savepoint in a caller's transaction: a failed
            if needed > limit:  # read leaves it usable
                return _paused(engine, key, now)
            held = holders(engine, key, statuses, now)
            recorded = durations(engine, key, now)
    except Exception:  # the refusal stands whatever the reads did
        logger.warning("could not estimate retry_after for key %r", key, exc_info=True)
        return Estimate(DEFAULT_RETRY_AFTER, READ_FAILED)
    oldest = held[0].age if held else None
    if not recorded:
        return Estimate(DEFAULT_RETRY_AFTER, NO_HISTORY, oldest_age=oldest)
    seconds = soonest_free(held, recorded, limit, needed, ahead)
    return Estimate(
        round(max(DEFAULT_RETRY_AFTER, seconds), 3),
        HISTORY,
        samples=len(recorded),
        typical=statistics.median(recorded),
        oldest_age=oldest,
    )


def _paused(engine: Runtime, key: str, now: datetime.datetime) -> Estimate:
    """The estimate of a key whose limit in force admits nothing of the start's weight:
    until its override ends, when it has an ``until``."""
    tag = quota_tag(key)
    ends = [
        o.until
        for o in engine.store.list_overrides(scope_of(engine.read_namespace), now)
        if o.tag == tag and o.until is not None
    ]
    seconds = (ends[0] - now).total_seconds() if ends else 0.0
    return Estimate(round(max(DEFAULT_RETRY_AFTER, seconds), 3), PAUSED)


def explain(
    engine: Runtime,
    error: ConcurrencyLimitError,
    statuses: Collection[str] = DEFAULT_CONCURRENCY_STATUSES,
    *,
    needed: int = 1,
    ahead: int = 0,
) -> None:
    """Give a refusal its ``retry_after``, ``estimate`` and engine (for ``holders()``);
    ``needed`` is the refused start's weight under the key, ``ahead`` the units of the
    older tickets of a fair quota served before it."""
    error.engine = engine
    error.estimate = estimate(engine, error.key, error.limit, statuses, needed=needed, ahead=ahead)
    error.retry_after = error.estimate.seconds


__all__ = [
    "HISTORY_RUNS",
    "HISTORY_WINDOW",
    "OVERDUE_FRACTION",
    "PAUSED",
    "Estimate",
    "Holder",
    "durations",
    "estimate",
    "explain",
    "holders",
    "remaining",
    "soonest_free",
    "turn_comes",
    "units",
]
