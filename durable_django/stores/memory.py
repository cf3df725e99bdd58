"""An in-memory store for tests and scripts: runs live in this process only."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from typing import Any

from django.utils import timezone

from ..status import RunStatus
from .base import NewRun, RunRecord, StepRecord


class MemoryStore:
    """Keeps runs in a dict, guarded by one re-entrant lock.

    Nothing it holds is seen by other processes, so an engine on it sends nothing to
    Celery; drive its runs with :func:`durable_django.testing.run_until_idle`.
    """

    is_shared = False

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._runs: dict[str, RunRecord] = {}
        self._steps: dict[str, dict[int, StepRecord]] = {}

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        with self._lock:
            yield

    def quota_lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        return self.atomic()

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
            )

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

    def count_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        return len(self.list_runs(tag=tag, statuses=statuses, namespace=namespace))

    def claim_run(self, run_id: str, from_statuses: Collection[str]) -> RunRecord | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.status not in from_statuses:
                return None
            now = timezone.now()
            claimed = replace(run, status=RunStatus.RUNNING.value, started_at=now, updated_at=now)
            self._runs[run_id] = claimed
            return claimed

    def set_status(self, run_id: str, status: str, **fields: Any) -> None:
        with self._lock:
            run = self._runs[run_id]
            self._runs[run_id] = replace(run, status=status, updated_at=timezone.now(), **fields)

    def get_steps(self, run_id: str) -> list[StepRecord]:
        with self._lock:
            steps = self._steps.get(run_id, {})
            return [steps[position] for position in sorted(steps)]

    def record_step(self, run_id: str, step: StepRecord) -> None:
        with self._lock:
            self._steps.setdefault(run_id, {})[step.position] = step
