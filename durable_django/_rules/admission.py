"""The admission rule's decision: whether a start fits under its quotas.

A start is admitted when, for each of its quotas, the key's units (the weights of the
key's runs in the counted statuses), the units held for older fair tickets and the
start's own weight stay within the limit; it is refused at the first quota, in the
order given, where they would not. :func:`decide` takes what a store read and says
which quota refuses, if one does; :meth:`Refusal.error` builds the
:class:`~durable_django.ConcurrencyLimitError` a refusal raises.

Every start path decides here, or decodes a server routine's answer into a
:class:`Refusal` (:func:`refused_by`): the Python reference (``BaseStore``'s start,
batch and retry), the ORM store's portable path, the first start on a PostgreSQL
connection, and the answers of the PostgreSQL functions and the MariaDB procedure,
which apply the same rule in SQL. ``tests/stores/test_differential.py`` holds every path to
the reference.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConcurrencyLimitError, RateLimitError
from .concurrency import Quota
from .overrides import in_force

if TYPE_CHECKING:
    from .tickets import Line

__all__ = ["Refusal", "decide", "rate_retry_after", "refused_by", "window_start"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """The quota that turned a start away: its position among the start's quotas
    (``index``, from 0), the key's ``active`` units, the units ``held`` for older fair
    tickets, and, under a fair quota, the ``line`` the decision saw; a rate limit's
    refusal carries its exact ``retry_after`` (:func:`rate_retry_after`)."""

    index: int
    quota: Quota
    active: int
    held: int = 0
    line: Line | None = None
    retry_after: float | None = None

    def error(self, workflow: str) -> ConcurrencyLimitError:
        """The refusal raised (or returned in a batch's place) for a start of
        ``workflow``: the one place a quota's :class:`ConcurrencyLimitError` (a rate
        limit's :class:`RateLimitError`) is built."""
        if self.quota.per is not None:
            return RateLimitError(
                workflow,
                self.quota.key,
                self.quota.limit,
                self.active,
                self.quota.per,
                self.quota.per if self.retry_after is None else self.retry_after,
            )
        error = ConcurrencyLimitError(
            workflow, self.quota.key, self.quota.limit, self.active, held=self.held
        )
        error.line = self.line
        return error


def decide(
    quotas: Sequence[Quota],
    units: Sequence[int],
    lines: Sequence[Line | None] = (),
) -> Refusal | None:
    """The first of ``quotas`` whose key's ``units`` (one number per quota, in their
    order), the units its ``line`` holds for older tickets (``Line.ahead``; a quota
    without a line holds none) and its weight exceed its limit; ``None`` when every
    quota admits the start."""
    for index, (quota, active) in enumerate(zip(quotas, units, strict=True)):
        line = lines[index] if lines else None
        held = line.ahead if line is not None else 0
        if active + held + quota.weight > quota.limit:
            return Refusal(index, quota, int(active), held, line)
    return None


def refused_by(quotas: Sequence[Quota], position: int, active: int, limit: int) -> Refusal:
    """A server routine's refusal decoded: it names the refusing quota by its
    ``position`` among ``quotas`` (from 1, as SQL counts), the key's ``active`` units and
    the ``limit`` it met (an operator's override's, or the quota's own)."""
    quota = quotas[position - 1]
    (met,) = in_force((quota,), {quota.tag: int(limit)})
    return Refusal(position - 1, met, int(active))


def window_start(quota: Quota, now: datetime.datetime) -> datetime.datetime:
    """The start of a rate limit's window at ``now``: its key's runs created after it
    (strictly) count."""
    assert quota.per is not None
    return now - datetime.timedelta(seconds=quota.per)


def rate_retry_after(
    quota: Quota,
    window: Sequence[tuple[datetime.datetime, int]],
    now: datetime.datetime,
) -> float:
    """The seconds from ``now`` until a start refused by rate limit ``quota`` fits: the
    first moment enough of the ``window``'s units (its key's runs created after
    :func:`window_start`, as ``(created_at, weight)``, oldest first) have left it for
    the rest and the start's weight to be within the limit. A run created at ``c``
    leaves the window at ``c + per`` exactly. ``per`` when no start can ever fit.

    The present is taken as no earlier than the newest run in the window, and the runs
    that have left the window by then are left out: a start reads its clock before it
    waits for its keys' locks, and a run committed while it waited may carry a later
    time. So the answer is never more than ``per``, and is 0 when the start would fit
    at that present."""
    assert quota.per is not None
    if quota.weight > quota.limit:
        return quota.per
    now = max([now, *(created_at for created_at, _ in window)])
    since = window_start(quota, now)
    window = [row for row in window if row[0] > since]
    excess = sum(weight for _, weight in window) + quota.weight - quota.limit
    if excess <= 0:
        return 0.0
    gone = 0
    for created_at, weight in sorted(window, key=lambda row: row[0]):
        gone += weight
        if gone >= excess:
            leaves = created_at + datetime.timedelta(seconds=quota.per)
            return max((leaves - now).total_seconds(), 0.0)
    return quota.per  # not reached: the window holds the excess
