"""An in-memory store for tests and scripts: runs live in this process only."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from .._core.limits import TAG_PREFIX
from .._core.records import NewRun, RunRecord, StepRecord
from .._rules.overrides import Override
from .._rules.tickets import KeptTicket
from ..status import RunStatus
from .base import BaseStore, is_holders_check


class MemoryStore(BaseStore):
    """Keeps runs in a dict, guarded by one re-entrant lock.

    Nothing it holds is seen by other processes, so an engine on it sends nothing to
    Celery; drive its runs with :func:`durable_django.testing.run_until_idle`. It has no
    rollback: a start inside a rolled-back ``atomic()`` keeps its run.

    It implements the primitives of :class:`~durable_django.stores.BaseStore` only and
    takes every composite as the base builds it: its ``atomic()`` holds the one lock, so
    the default ``quota_lock`` serialises the starts of this process.
    """

    is_shared = False

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._runs: dict[str, RunRecord] = {}
        self._steps: dict[str, dict[int, StepRecord]] = {}
        self._signals: dict[str, list[Any]] = {}
        self._tickets: dict[str, KeptTicket] = {}
        self._overrides: dict[tuple[str, str], Override] = {}

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        with self._lock:
            yield

    def on_commit(self, callback: Callable[[], None]) -> None:
        callback()

    def create_run(self, run: NewRun) -> None:
        now = timezone.now()
        with self._lock:
            if run.run_id in self._runs:
                raise ValueError(f"run id {run.run_id!r} already exists")
            self._runs[run.run_id] = RunRecord(
                run_id=run.run_id,
                workflow=run.workflow,
                version=run.version,
                namespace=run.namespace,
                status=RunStatus.PENDING.value,
                input=run.input,
                tags=sorted(run.tags),
                queue=run.queue,
                parent_id=run.parent_id,
                attempt=run.attempt,
                created_at=now,
                updated_at=now,
                weights={
                    tag: units
                    for tag, units in run.weights.items()
                    if units != 1 and tag in run.tags
                },
            )

    def set_override(self, override: Override) -> None:
        with self._lock:
            self._overrides[(override.tag, override.scope)] = override

    def clear_override(self, tag: str, scope: str) -> bool:
        with self._lock:
            return self._overrides.pop((tag, scope), None) is not None

    def list_overrides(self, scope: str | None, now: datetime) -> list[Override]:
        with self._lock:
            found = [
                o for o in self._overrides.values() if o.live(now) and scope in (None, o.scope)
            ]
        return sorted(found, key=lambda o: (o.tag, o.scope))

    def override_limits(self, tags: Collection[str], scope: str, now: datetime) -> dict[str, int]:
        with self._lock:
            found = (self._overrides.get((tag, scope)) for tag in tags)
            return {o.tag: o.limit for o in found if o is not None and o.live(now)}

    def ticket_line(self, key: str, namespace: str | None = None) -> list[KeptTicket]:
        with self._lock:
            return [t for t in self._tickets.values() if _in_line(t, key, namespace)]

    def keep_ticket(self, ticket: KeptTicket, *, most: int) -> None:
        now = timezone.now()
        with self._lock:
            for gone in [
                t.id for t in self._tickets.values() if t.key == ticket.key and not t.live(now)
            ]:
                del self._tickets[gone]
            kept = self._tickets.get(ticket.id)
            if kept is not None:  # its place and hold stay; its expiry and weight move
                self._tickets[ticket.id] = dataclasses.replace(
                    kept, expires_at=ticket.expires_at, weight=ticket.weight
                )
            elif len(self.ticket_line(ticket.key, ticket.namespace)) < most:
                self._tickets[ticket.id] = ticket

    def hold_tickets(self, key: str, namespace: str | None, until: datetime) -> None:
        with self._lock:
            for t in self.ticket_line(key, namespace):
                if t.held_until is None:
                    self._tickets[t.id] = dataclasses.replace(t, held_until=until)

    def end_hold(self, key: str, namespace: str | None, now: datetime) -> None:
        with self._lock:
            for t in self.ticket_line(key, namespace):
                if t.held_until is not None and t.held_until > now:
                    self._tickets[t.id] = dataclasses.replace(t, held_until=None)

    def purge_tickets(self, expired_before: datetime, limit: int) -> int:
        with self._lock:
            gone = [t.id for t in self._tickets.values() if not t.live(expired_before)]
            for ticket_id in gone[:limit]:
                del self._tickets[ticket_id]
            return len(gone[:limit])

    def drop_ticket(self, ticket_id: str) -> None:
        with self._lock:
            self._tickets.pop(ticket_id, None)

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            return self._runs.get(run_id)

    def list_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        workflow: str | None = None,
        namespace: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        with self._lock:
            runs = [
                run
                for run in self._runs.values()
                if (tag is None or tag in run.tags)
                and (statuses is None or run.status in statuses)
                and (workflow is None or run.workflow == workflow)
                and (namespace is None or run.namespace == namespace)
            ]
        runs.reverse()
        return runs[:limit] if limit is not None else runs

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
        with self._lock:
            run = self._runs.get(run_id)
            if (
                run is None
                or run.status not in from_statuses
                or (owner is not None and run.lease_owner != owner)
                or (
                    lease_expired_before is not None
                    and (
                        run.lease_expires_at is None or run.lease_expires_at >= lease_expired_before
                    )
                )
                or (
                    updated_before is not None
                    and (run.updated_at is None or run.updated_at >= updated_before)
                )
            ):
                return False
            if not is_holders_check(from_statuses, status, owner, fields):
                self._runs[run_id] = dataclasses.replace(
                    run, status=status, updated_at=timezone.now(), **fields
                )
            return True

    def due_runs(self, now: datetime, pending_before: datetime, limit: int) -> list[RunRecord]:
        with self._lock:
            due = [
                run
                for run in self._runs.values()
                if (run.status in ("suspended", "blocked") and run.wake_at and run.wake_at <= now)
                or (
                    run.status == "running"
                    and run.lease_expires_at is not None
                    and run.lease_expires_at < now
                )
                or (
                    run.status == "pending"
                    and run.updated_at is not None
                    and run.updated_at < pending_before
                )
            ]
        return due[:limit]

    def get_steps(self, run_id: str) -> list[StepRecord]:
        with self._lock:
            steps = self._steps.get(run_id, {})
            return [steps[position] for position in sorted(steps)]

    def record_step(self, run_id: str, step: StepRecord, *, replace: bool = False) -> None:
        with self._lock:
            steps = self._steps.setdefault(run_id, {})
            if step.position in steps and not replace:
                raise ValueError(f"run {run_id!r}: step {step.position} is already recorded")
            steps[step.position] = step

    def forget_failed_steps(self, run_id: str) -> None:
        with self._lock:
            steps = self._steps.get(run_id, {})
            for position in [p for p, step in steps.items() if step.error is not None]:
                del steps[position]

    def set_quota_tags(self, run_id: str, weights: Mapping[str, int]) -> None:
        with self._lock:
            run = self._runs[run_id]
            tags = [t for t in run.tags if not t.startswith(TAG_PREFIX)]
            kept = {t: units for t, units in run.weights.items() if t in tags and t not in weights}
            self._runs[run_id] = dataclasses.replace(
                run,
                tags=sorted({*tags, *weights}),
                weights={**kept, **{tag: units for tag, units in weights.items() if units != 1}},
            )

    def settle_units(self, run_id: str, tag: str, units: int) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or tag not in run.tags:
                return False
            weights = {t: w for t, w in run.weights.items() if t != tag}
            if units != 1:
                weights[tag] = units
            self._runs[run_id] = dataclasses.replace(run, weights=weights)
            return True

    def send_signal(self, token: str, payload: Any) -> None:
        with self._lock:
            self._signals.setdefault(token, []).append(payload)

    def take_signal(self, run_id: str, token: str, step: StepRecord) -> tuple[bool, Any]:
        with self._lock:
            kept = self._signals.get(token)
            if not kept:
                return False, None
            # Recorded first: a record that fails keeps the signal for the next waiter.
            self.record_step(run_id, dataclasses.replace(step, result=kept[0]))
            return True, kept.pop(0)

    def has_signal(self, token: str) -> bool:
        with self._lock:
            return bool(self._signals.get(token))

    def runs_waiting_on_signal(self, token: str) -> list[RunRecord]:
        with self._lock:
            return [
                run
                for run in self._runs.values()
                if run.status == "suspended" and (run.wait or {}).get("signal") == token
            ]

    def delete_run(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
            self._steps.pop(run_id, None)


def _in_line(ticket: KeptTicket, key: str, namespace: str | None) -> bool:
    """Whether ``ticket`` is in ``key``'s line in ``namespace`` (``None``: any)."""
    return ticket.key == key and namespace in (None, ticket.namespace)
