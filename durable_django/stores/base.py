"""The store contract: what the engine needs from the place runs are kept.

A store keeps runs, their tags, their recorded steps and the signals sent to them. The
engine talks to it only through :class:`Store`; ``OrmStore`` (the default) and
``MemoryStore`` implement it.

Every change of a run's status goes through ``transition``: a conditional update (the
run must be in one of ``from_statuses``, and optionally held by a given worker) that
changes the run and its tags' copy of the status together, and says whether it happened.
That one primitive makes claiming, finishing, waking, cancelling and recovering runs safe
when several workers and tickers race.

Two parts are optional:

- ``count_runs(tag=, statuses=, namespace=)``: the quota count. A store without it is
  counted with ``len(list_runs(...))``.
- ``quota_lock(key)``: a context manager that serialises starts of one quota key and
  makes the count and the insert that follow it one transaction. A store without it
  gets only ``atomic()``, which serialises nothing: safe with a single starter only.

A store may also offer ``start_run(run, quota, *, check_existing, read_namespace)``, one
call doing the whole start (see :func:`start_with_primitives` for its meaning); the
ORM store uses it for its PostgreSQL fast path. For executing runs it may offer, each
doing in one call what the engine otherwise composes from the members below:
``claim_run(run_id, **fields)`` (the claim, returning the run and its recorded steps),
``record_held_step(run_id, step, owner, *, replace=False)`` (a record made only while
``owner`` holds the run) and ``end_turn(run_id, owner, status, step, **fields)`` (the
holder's transition ending a turn, with its last record).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from ..concurrency import Quota
from ..errors import ConcurrencyLimitError, DurableError


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run about to be created: its id, workflow name and version, namespace, JSON
    input, tags (the quota's included), Celery queue, parent run and attempt number."""

    run_id: str
    workflow: str
    version: str
    namespace: str
    input: Any
    tags: tuple[str, ...] = ()
    queue: str = ""
    parent_id: str | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as read from the store: what :class:`NewRun` gave it, plus its ``status``,
    ``output`` or ``error``, why it is ``blocked``, when it was created, last updated,
    started and finished, and what a suspended run waits for (``wait``, ``wake_at``)
    and who holds a running one (``lease_owner`` until ``lease_expires_at``)."""

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


@runtime_checkable
class Store(Protocol):
    """Where runs live. See the module docstring for the optional parts."""

    #: True when other processes (workers) see what this store holds.
    is_shared: bool

    def create_run(self, run: NewRun) -> None:
        """Insert a pending run and its tags."""

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run with this id in any namespace, or ``None``."""

    def list_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        workflow: str | None = None,
        namespace: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs matching every filter given, newest first."""

    def transition(
        self,
        run_id: str,
        from_statuses: Collection[str],
        status: str,
        *,
        owner: str | None = None,
        lease_expired_before: datetime | None = None,
        updated_before: datetime | None = None,
        **fields: Any,
    ) -> bool:
        """Set ``status`` and ``fields`` if the run is in ``from_statuses`` (and, when given,
        held by ``owner``, with a lease expired before ``lease_expired_before``, last
        updated before ``updated_before``); the tags' status copy changes with it, at once.
        Returns whether the run changed."""

    def due_runs(self, now: datetime, pending_before: datetime, limit: int) -> list[RunRecord]:
        """Runs the tick must hand on: suspended or blocked ones due at ``now``, running ones
        whose lease expired, pending ones untouched since ``pending_before``."""

    def get_steps(self, run_id: str) -> list[StepRecord]:
        """The run's recorded steps, by position."""

    def record_step(self, run_id: str, step: StepRecord, *, replace: bool = False) -> None:
        """Record one step's outcome; ``replace`` overwrites a recorded failure (a retry).

        Recording a position twice without ``replace`` raises (a duplicate execution)."""

    def forget_failed_steps(self, run_id: str) -> None:
        """Delete the run's recorded step failures, so a retry executes them again."""

    def set_quota_tag(self, run_id: str, tag: str | None) -> None:
        """Replace the run's ``concurrency:`` tag with ``tag`` (or none)."""

    def send_signal(self, token: str, payload: Any) -> None:
        """Keep ``payload`` for the first run that waits on ``token``."""

    def take_signal(self, run_id: str, token: str, step: StepRecord) -> tuple[bool, Any]:
        """Consume the oldest signal kept for ``token`` and record it as ``step`` (its
        payload as the result), in one transaction. Returns ``(found, payload)``."""

    def has_signal(self, token: str) -> bool:
        """Whether a signal is kept for ``token``."""

    def runs_waiting_on_signal(self, token: str) -> list[RunRecord]:
        """Suspended runs waiting on ``token``."""

    def atomic(self) -> AbstractContextManager[Any]:
        """A transaction; nested calls join the outer one."""

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the current transaction commits (at once outside one)."""


def count_active(store: Any, tag: str, statuses: Sequence[str], namespace: str | None) -> int:
    """Count through ``count_runs`` when the store has it, else the length of a listing."""
    count_runs = getattr(store, "count_runs", None)
    if count_runs is not None:
        return count_runs(tag=tag, statuses=statuses, namespace=namespace)
    return len(store.list_runs(tag=tag, statuses=statuses, namespace=namespace))


def quota_transaction(store: Any, quota: Quota | None) -> AbstractContextManager[Any]:
    """A transaction that holds ``quota``'s key lock (just a transaction without a quota)."""
    if quota is None:
        return store.atomic()
    lock = getattr(store, "quota_lock", None)
    return lock(quota.key) if lock is not None else store.atomic()


def check_quota(store: Any, quota: Quota, workflow: str, read_namespace: str | None) -> None:
    """Raise :class:`ConcurrencyLimitError` when ``quota``'s key holds ``limit`` runs."""
    active = count_active(store, quota.tag, quota.count_statuses, read_namespace)
    if active >= quota.limit:
        raise ConcurrencyLimitError(workflow, quota.key, quota.limit, active)


def existing_outcome(
    run: NewRun, workflow: str, namespace: str, read_namespace: str | None
) -> StartOutcome:
    """Re-starting ``run.run_id``, already held by a run of ``workflow`` in ``namespace``.

    The same workflow in a namespace this engine may read gets that run back; anything
    else is a clash of ids, refused.
    """
    if read_namespace is not None and namespace != read_namespace:
        raise DurableError(f"run id {run.run_id!r} is taken by a run in namespace {namespace!r}")
    if workflow != run.workflow:
        raise DurableError(
            f"run id {run.run_id!r} is taken by a run of workflow {workflow!r}, "
            f"not {run.workflow!r}"
        )
    return StartOutcome(created=False, workflow=workflow, namespace=namespace)


def start_with_primitives(
    store: Any,
    run: NewRun,
    quota: Quota | None,
    *,
    check_existing: bool,
    read_namespace: str | None,
) -> StartOutcome:
    """Start a run with the store's basic operations, in one transaction.

    The order is the contract: an existing run with this id is returned (never refused);
    then the quota's key is locked and its active runs counted; then the run is inserted.
    Raises :class:`ConcurrencyLimitError` when the count has reached the limit.
    """
    with quota_transaction(store, quota):
        if check_existing:
            existing = store.get_run(run.run_id)
            if existing is not None:
                return existing_outcome(run, existing.workflow, existing.namespace, read_namespace)
        if quota is not None:
            check_quota(store, quota, run.workflow, read_namespace)
        store.create_run(run)
    return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)


def record_held_with_primitives(
    store: Any,
    run_id: str,
    owner: str,
    step: StepRecord,
    status: str = "running",
    *,
    replace: bool = False,
    **fields: Any,
) -> bool:
    """Record ``step`` only while ``owner`` holds the running run, with the store's basic
    operations in one transaction: the holder's transition from running to ``status``
    (by default one that changes nothing and only checks), then ``record_step``. False,
    and nothing recorded, when ``owner`` no longer holds the run. What
    ``record_held_step`` and ``end_turn`` do in one call."""
    with store.atomic():
        if not store.transition(run_id, ["running"], status, owner=owner, **fields):
            return False
        store.record_step(run_id, step, replace=replace)
        return True
