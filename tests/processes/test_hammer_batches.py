"""Batches of starts under real concurrency: starters released together, each starting a
batch that names every key of the trial several times, the keys in different orders.

Whatever the interleaving, each key admits exactly its limit, and no batch deadlocks: the
batches run inside transactions of their own, where a deadlock is raised, not retried.
On PostgreSQL the starters alternate the fast path and the portable path, and the keys
sort differently by byte and by the database's collation. Server databases only: SQLite
has one database-wide write lock.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from collections import Counter

import pytest
from django.db import connection

from durable_django.models import Run, RunTag

from ..hammer import PATIENCE
from ..hammer_batches import (
    MIXED_LIMIT,
    PER_KEY,
    BatchOutcome,
    make_engines,
    mixed_keys,
    mixed_plan,
    process_main,
    run_mixed_threads,
    run_threads,
)
from ..hammering import reports_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="SQLite has one database-wide write lock: every batch waits for any open one",
    ),
]

LIMIT = 8
TRIALS = 10
THREADS = 12
PROCESSES = 3
THREADS_PER_PROCESS = 4


def trial_keys(trials: int) -> list[list[str]]:
    """Each trial's keys: fresh, and ordered differently by code point and by a linguistic
    collation (upper and lower case, an accent)."""
    prefix = uuid.uuid4().hex[:10]
    return [
        [f"batch:{prefix}:{t:02d}:{name}" for name in ("a", "B", "é", "Z", "b")]
        for t in range(trials)
    ]


def assert_batches(outcomes: list[BatchOutcome], trials: list[list[str]], starters: int) -> None:
    errors = [o for o in outcomes if o.error]
    assert not errors, "\n\n".join(f"{o.starter} (trial {o.trial}):\n{o.error}" for o in errors)
    assert Counter(o.trial for o in outcomes) == dict.fromkeys(range(len(trials)), starters)
    for trial, keys in enumerate(trials):
        created: dict[str, list[str]] = {key: [] for key in keys}
        refused: Counter[str] = Counter()
        for outcome in (o for o in outcomes if o.trial == trial):
            for key, run_ids in outcome.created.items():
                created[key] += run_ids
            for key, limit, active in outcome.refused:
                assert (limit, active) == (LIMIT, LIMIT), (trial, key)
                refused[key] += 1
        for key in keys:
            assert len(created[key]) == LIMIT, (trial, key, len(created[key]))
            assert refused[key] == starters * PER_KEY - LIMIT, (trial, key)
            tag = f"concurrency:{key}"
            stored = set(RunTag.objects.filter(tag=tag).values_list("run_id", flat=True))
            assert stored == set(created[key]), (trial, key)
    assert Run.objects.count() == LIMIT * sum(len(keys) for keys in trials)


@pytest.mark.django_db(transaction=True)
def test_threads_starting_batches_in_different_key_orders() -> None:
    engines = make_engines(LIMIT)
    trials = trial_keys(TRIALS)
    barrier = threading.Barrier(THREADS)

    outcomes = run_threads(engines, "t", 0, trials, THREADS, barrier, PATIENCE)

    assert_batches(outcomes, trials, THREADS)


@pytest.mark.django_db(transaction=True)
def test_processes_starting_batches_in_different_key_orders() -> None:
    context = multiprocessing.get_context("spawn")
    trials = trial_keys(TRIALS)
    starters = PROCESSES * THREADS_PER_PROCESS
    barrier = context.Barrier(starters)
    results = context.Queue()
    db_name = connection.settings_dict["NAME"]
    children = [
        context.Process(
            target=process_main,
            args=(
                db_name,
                index,
                trials,
                LIMIT,
                THREADS_PER_PROCESS,
                barrier,
                PATIENCE * 2,  # the first wait also covers each child's start-up
                results,
            ),
            name=f"hammer-batches-{index}",
        )
        for index in range(PROCESSES)
    ]
    outcomes: list[BatchOutcome] = reports_of(children, results, PATIENCE * 4)

    assert_batches(outcomes, trials, starters)


MIXED_TRIALS = 8
MIXED_THREADS = 10


@pytest.mark.django_db(transaction=True)
def test_batches_and_single_starts_under_overlapping_weighted_quota_lists() -> None:
    # Half the starters start batches whose elements each name one to three weighted
    # quotas, the other half single starts under such lists, every list in an order of
    # its own (on PostgreSQL and MariaDB on the one-call and the portable path in turn):
    # no deadlock, no key over its limit in units, every refusal right, every run under
    # its plan's tags.
    engines = make_engines(LIMIT)
    prefix = uuid.uuid4().hex[:10]
    barrier = threading.Barrier(MIXED_THREADS)

    outcomes = run_mixed_threads(engines, prefix, MIXED_TRIALS, MIXED_THREADS, barrier, PATIENCE)

    errors = [o for o in outcomes if o.error]
    assert not errors, "\n\n".join(f"{o.starter} (trial {o.trial}):\n{o.error}" for o in errors)
    assert len(outcomes) == MIXED_TRIALS * MIXED_THREADS
    plans = {
        input["id"]: {key: weight for key, weight in input["quotas"]}
        for trial in range(MIXED_TRIALS)
        for index in range(MIXED_THREADS)
        for input in mixed_plan(prefix, trial, index)
    }
    created = {run_id for outcome in outcomes for run_id in outcome.runs}
    refused = {
        run_id: (key, limit, active)
        for outcome in outcomes
        for run_id, key, limit, active in outcome.refused_runs
    }
    assert created | set(refused) == set(plans) and not created & set(refused)
    units: Counter[str] = Counter()
    tags = RunTag.objects.filter(tag__startswith=f"concurrency:mixed:{prefix}")
    for run_id, tag, weight in tags.values_list("run_id", "tag", "weight"):
        key = tag.removeprefix("concurrency:")
        assert plans[run_id].get(key) == weight, (run_id, key, weight)
        units[key] += weight
    assert set(Run.objects.values_list("id", flat=True)) == created
    for run_id in created:
        held = set(RunTag.objects.filter(run_id=run_id).values_list("tag", flat=True))
        assert held == {f"concurrency:{key}" for key in plans[run_id]}, run_id
    keys = [key for trial in range(MIXED_TRIALS) for key in mixed_keys(prefix, trial)]
    assert all(units[key] <= MIXED_LIMIT for key in keys), units
    for run_id, (key, limit, active) in refused.items():
        # Runs never end here: a key's units only grow, so a refusal right when it was
        # made is still right against the final units.
        weight = plans[run_id][key]
        assert limit == MIXED_LIMIT and active + weight > limit, (run_id, key, active)
        assert units[key] + weight > limit, (run_id, key, units[key])
    assert refused, "the hammer refused nothing: the keys were never contended"
