"""The store contract suite (``durable_django.testing.StoreContract``) run against both
stores: ``MemoryStore``, and ``OrmStore`` on each test database (on PostgreSQL and
MariaDB its fast path and its portable path). And a broken store, which the suite must catch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any

import pytest
from django.db import connection

from durable_django._core.records import StepRecord
from durable_django._rules.concurrency import Quota
from durable_django.status import RunStatus
from durable_django.stores import BaseStore, MemoryStore, OrmStore
from durable_django.testing import StoreContract

#: ``OrmStore``'s paths on this database: two on PostgreSQL (the functions, the portable
#: path), two on MySQL and MariaDB (the procedure, the portable path), one on SQLite.
PATHS = [True] if connection.vendor == "sqlite" else [True, False]


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> BaseStore:
        return MemoryStore()


class TestOrmStore(StoreContract):
    @pytest.fixture(params=PATHS, ids=lambda fast: "fast-path" if fast else "portable-path")
    def store(
        self, request: pytest.FixtureRequest, kept_tickets_forgotten: None, db: None
    ) -> BaseStore:
        return OrmStore(fast_path=request.param)


# a store that breaks the contract --------------------------------------------------------


class IgnoresFromStatuses(MemoryStore):
    """Changes a run whatever its status: two workers racing would both claim it."""

    def transition(
        self, run_id: str, from_statuses: Collection[str], status: str, **options: Any
    ) -> bool:
        return super().transition(run_id, RunStatus.values, status, **options)


class CountsEveryStatus(MemoryStore):
    """Counts finished runs too: a quota whose slots never free."""

    def count_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        return super().count_runs(tag=tag, namespace=namespace)

    def quota_units(self, quotas: Sequence[Quota], namespace: str | None) -> list[int]:
        return super().quota_units(
            [dataclasses.replace(q, count_statuses=tuple(RunStatus.values)) for q in quotas],
            namespace,
        )


class CountsRunsNotUnits(MemoryStore):
    """Counts each run as one unit, whatever its weight: a weighted quota over-admits."""

    def quota_units(self, quotas: Sequence[Quota], namespace: str | None) -> list[int]:
        return [
            self.count_runs(tag=q.tag, statuses=q.count_statuses, namespace=namespace)
            for q in quotas
        ]


class SettlesEveryTagOfTheRun(MemoryStore):
    """Settles the units on every tag of the run: one key's settle changes the others."""

    def settle_units(self, run_id: str, tag: str, units: int) -> bool:
        run = self.get_run(run_id)
        if run is None or tag not in run.tags:
            return False
        for other in run.tags:
            super().settle_units(run_id, other, units)
        return True


class ChecksTheFirstQuotaOnly(MemoryStore):
    """Checks the first quota of a list only: a start over another key's limit gets in."""

    def start_run(self, run: Any, quotas: Any, **options: Any) -> Any:
        return super().start_run(run, list(quotas)[:1], **options)


class LosesTakenSignals(MemoryStore):
    """Consumes a signal before recording it: a failed record loses the signal."""

    def take_signal(self, run_id: str, token: str, step: StepRecord) -> tuple[bool, Any]:
        with self._lock:
            kept = self._signals.get(token)
            if not kept:
                return False, None
            payload = kept.pop(0)
            self.record_step(run_id, dataclasses.replace(step, result=payload))
            return True, payload


class PurgesTheWrongEnd(MemoryStore):
    """Lets a purge through runs that finished after the cutoff."""

    def purge_runs(
        self,
        finished_before: datetime,
        statuses: Collection[str],
        namespace: str | None,
        limit: int,
        after: str | None = None,
    ) -> tuple[int, str | None]:
        return super().purge_runs(
            datetime.max.replace(tzinfo=finished_before.tzinfo), statuses, namespace, limit, after
        )


def failures(make_store: Callable[[], BaseStore]) -> set[str]:
    """The contract's tests that fail for stores made by ``make_store``, each test
    against a store of its own."""
    failed = set()
    for name in dir(StoreContract):
        if name.startswith("test_"):
            try:
                getattr(StoreContract(), name)(make_store())
            # an assertion, an error a correct store never raises, or pytest.raises failing
            except (Exception, pytest.fail.Exception):
                failed.add(name)
    return failed


def test_the_memory_store_passes_when_called_directly():
    """The way ``failures`` calls the suite finds nothing wrong with a correct store."""
    assert failures(MemoryStore) == set()


@pytest.mark.parametrize(
    ("broken", "caught_by"),
    [
        (
            IgnoresFromStatuses,
            {
                "test_a_transition_happens_only_from_the_statuses_given",
                "test_a_claim_takes_a_pending_run_with_its_steps",
                "test_a_held_step_is_recorded_for_the_holder_only",
            },
        ),
        (
            CountsEveryStatus,
            {
                "test_count_runs_counts_what_list_runs_lists",
                "test_the_count_follows_every_transition",
                "test_only_the_quotas_statuses_hold_a_slot",
            },
        ),
        (
            CountsRunsNotUnits,
            {
                "test_a_run_occupies_its_weight",
                "test_several_weighted_quotas_count_each_key_in_its_namespace",
            },
        ),
        (ChecksTheFirstQuotaOnly, {"test_a_start_under_several_quotas_needs_every_one"}),
        (SettlesEveryTagOfTheRun, {"test_settled_units_replace_the_weight_in_the_window"}),
        (LosesTakenSignals, {"test_a_signal_whose_record_fails_stays_kept"}),
        (PurgesTheWrongEnd, {"test_purge_runs_goes_by_id_in_batches"}),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_the_contract_catches_a_broken_store(broken: type[BaseStore], caught_by: set[str]):
    assert caught_by <= failures(broken)
