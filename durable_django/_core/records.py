"""The values that cross the store contract: a run about to be created, a run and a step
as read, what a start did, and what a tick did.

Plain frozen dataclasses; this module imports nothing from the ORM or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .limits import RATE_TAG_PREFIX


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run about to be created: its id, workflow name and version, namespace, JSON
    input, tags (its quotas' included), Celery queue, parent run and attempt number, and
    the weight of those of its tags that weigh more than 1 (``{tag: units}``; a tag not
    in ``weights`` weighs 1)."""

    run_id: str
    workflow: str
    version: str
    namespace: str
    input: Any
    tags: tuple[str, ...] = ()
    queue: str = ""
    parent_id: str | None = None
    attempt: int = 1
    weights: dict[str, int] = field(default_factory=dict)

    @property
    def rate_tags(self) -> frozenset[str]:
        """Its rate limits' tags (``rate:<key>``), which keep the run's creation time."""
        return frozenset(tag for tag in self.tags if tag.startswith(RATE_TAG_PREFIX))


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as read from the store: what :class:`NewRun` gave it, plus its ``status``,
    ``output`` or ``error``, why it is ``blocked``, when it was created, last updated,
    started and finished, and what a suspended run waits for (``wait``, ``wake_at``)
    and who holds a running one (``lease_owner`` until ``lease_expires_at``); ``weights``
    holds the units of its tags that do not weigh 1 (more, or a rate limit's tag settled
    lower: :meth:`~durable_django.stores.BaseStore.settle_units`)."""

    run_id: str
    workflow: str
    version: str
    namespace: str
    status: str
    input: Any
    output: Any = None
    error: Any = None
    tags: list[str] = field(default_factory=list)
    queue: str = ""
    parent_id: str | None = None
    blocked_reason: str = ""
    attempt: int = 1
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    wake_at: datetime | None = None
    wait: Any = None
    lease_owner: str = ""
    lease_expires_at: datetime | None = None
    weights: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One recorded durable call: its position in the body, its name, and its outcome
    (a JSON ``result``, or an ``error`` dict with at least ``type`` and ``message``)."""

    position: int
    name: str
    result: Any = None
    error: Any = None


@dataclass(frozen=True, slots=True)
class StartOutcome:
    """What a start did: ``created`` a run, or found the run id already held by a run of
    ``workflow`` in ``namespace``."""

    created: bool
    workflow: str
    namespace: str


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one tick did: runs woken from timers, recovered from dead workers, unblocked,
    sent again after their message seemed lost; schedule windows fired, and skipped
    (over their quota, or failing to start: see the schedule's ``last_error``)."""

    woken: int = 0
    recovered: int = 0
    unblocked: int = 0
    resent: int = 0
    fired: int = 0
    skipped_windows: int = 0

    @property
    def total(self) -> int:
        """Everything the tick handed on or fired."""
        return self.woken + self.recovered + self.unblocked + self.resent + self.fired
