"""The store contract: what the engine needs from the place runs are kept.

A store keeps runs, their tags and their recorded steps. The engine talks to it only
through :class:`Store`; ``OrmStore`` (the default) and ``MemoryStore`` implement it.

Two parts are optional:

- ``count_runs(tag=, statuses=, namespace=)``: the quota count. A store without it is
  counted with ``len(list_runs(...))``.
- ``quota_lock(key)``: a context manager that serialises starts of one quota key and
  makes the count and the insert that follow it one transaction. A store without it
  gets only ``atomic()``, which serialises nothing: safe with a single starter only.

A store may also offer ``start_run(run, quota, *, check_existing, read_namespace)``, one
call doing the whole start (see :func:`start_with_primitives` for its meaning); the
ORM store uses it for its PostgreSQL fast path.
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
    """A run about to be created."""

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
    """A run as read from the store."""

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


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One recorded ``ctx.step``: its position in the body, its name and its outcome."""

    position: int
    name: str
    result: Any = None
    error: Any = None


@dataclass(frozen=True, slots=True)
class StartOutcome:
    """What a start did: created a run, or found the run id already taken."""

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

    def claim_run(self, run_id: str, from_statuses: Collection[str]) -> RunRecord | None:
        """Atomically move the run to ``running`` if its status is one of ``from_statuses``."""

    def set_status(self, run_id: str, status: str, **fields: Any) -> None:
        """Change a run's status (and its tags' copy of it) and the given fields at once."""

    def get_steps(self, run_id: str) -> list[StepRecord]:
        """The run's recorded steps, by position."""

    def record_step(self, run_id: str, step: StepRecord) -> None:
        """Record one step's outcome."""

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


def _quota_lock(store: Any, key: str) -> AbstractContextManager[Any]:
    lock = getattr(store, "quota_lock", None)
    return lock(key) if lock is not None else store.atomic()


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
    with _quota_lock(store, quota.key) if quota is not None else store.atomic():
        if check_existing:
            existing = store.get_run(run.run_id)
            if existing is not None:
                return existing_outcome(run, existing.workflow, existing.namespace, read_namespace)
        if quota is not None:
            active = count_active(store, quota.tag, quota.count_statuses, read_namespace)
            if active >= quota.limit:
                raise ConcurrencyLimitError(run.workflow, quota.key, quota.limit, active)
        store.create_run(run)
    return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)
