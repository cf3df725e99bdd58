"""Concurrent batches of starts for ``tests/processes/test_hammer_batches.py``, in threads and in
spawned processes.

Each starter, in each trial, waits on a shared barrier, then starts one batch naming every
key of the trial several times, the keys in an order of its own (starter ``n`` rotates
them by ``n`` and every other starter reverses them), inside a transaction of its own:
a deadlock there is raised, never retried away. A starter alternates between the ORM
store's PostgreSQL fast path and its portable path where the database has both, so the
two paths' key orders are tested against each other.

The mixed hammer (:func:`mixed_start`) has, in each trial, batches whose elements each
name a list of one to three weighted quotas, and single starts under such lists, every
list in an order of its own: batches and single multi-key starts lock overlapping keys
against each other.
"""

from __future__ import annotations

import random
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

from .hammering import django_in_child, in_threads

#: The workflow the batches start: keyed by the input's ``key``.
WORKFLOW = "hammer.batch"
#: How many elements of each batch name each key.
PER_KEY = 3
#: The workflow of the mixed hammer: up to three quotas, each ``(key, weight)`` of the
#: input's ``quotas`` list, in its order, each with limit :data:`MIXED_LIMIT` units.
MIXED_WORKFLOW = "hammer.mixed"
MIXED_LIMIT = 6
MIXED_KEYS = ("a", "B", "é", "b")
MIXED_WEIGHTS = (1, 1, 2, 3)
#: The elements of each batch of the mixed hammer.
MIXED_BATCH = 5


@dataclass
class BatchOutcome:
    """What one batch did in one trial: its started run ids by key and its refusals, or
    the error it failed with."""

    trial: int
    starter: str
    created: dict[str, list[str]] = field(default_factory=dict)
    refused: list[tuple[str, int, int]] = field(default_factory=list)  # key, limit, active
    error: str = ""
    #: The mixed hammer's: the run ids created, and ``(run_id, key, limit, active)`` of
    #: each refusal.
    runs: list[str] = field(default_factory=list)
    refused_runs: list[tuple[str, str, int, int]] = field(default_factory=list)


def make_engines(limit: int) -> list[Any]:
    """Engines on the ORM store that send nothing: the default store and the portable path
    on PostgreSQL and MariaDB (whose default stores start a run in one call), the portable
    path alone elsewhere."""
    from django.db import connection

    from durable_django import Engine
    from durable_django._rules.registry import Registry
    from durable_django.stores import OrmStore

    registry = Registry()
    one_call = connection.vendor == "postgresql" or (
        connection.vendor == "mysql" and connection.mysql_is_mariadb
    )
    paths = [True, False] if one_call else [False]
    engines = [
        Engine(store=OrmStore(fast_path=fast), registry=registry, enqueue=False) for fast in paths
    ]
    engines[0].register(
        WORKFLOW,
        "1",
        lambda ctx, input: None,
        concurrency={"key": lambda input: input["key"], "limit": limit},
    )
    engines[0].register(
        MIXED_WORKFLOW,
        "1",
        lambda ctx, input: None,
        concurrency=[
            {
                "key": lambda input, i=i: (
                    input["quotas"][i][0] if i < len(input["quotas"]) else None
                ),
                "limit": MIXED_LIMIT,
                "weight": lambda input, i=i: (
                    input["quotas"][i][1] if i < len(input["quotas"]) else 1
                ),
            }
            for i in range(3)
        ],
    )
    for engine in engines:
        engine.config  # noqa: B018  (resolve the options once, before the threads share it)
    return engines


def order_for(index: int, keys: list[str]) -> list[str]:
    """Starter ``index``'s order of the keys: rotated by ``index``, reversed every other."""
    shift = index % len(keys)
    order = keys[shift:] + keys[:shift]
    return order[::-1] if index % 2 else order


def start_batch(engine: Any, trial: int, starter: str, index: int, keys: list[str]) -> BatchOutcome:
    """One batch, inside a transaction of its own; never raises."""
    from django.db import transaction

    outcome = BatchOutcome(trial, starter)
    order = order_for(index, keys)
    inputs = [{"key": key, "n": n} for n in range(PER_KEY) for key in order]
    try:
        with transaction.atomic():
            batch = engine.start_many(WORKFLOW, inputs)
    except Exception:
        outcome.error = traceback.format_exc()
        return outcome
    for handle, input in zip(batch.handles, inputs, strict=True):
        if handle is not None:
            if not handle.created:
                outcome.error = f"{handle.run_id} was not created"
            outcome.created.setdefault(input["key"], []).append(handle.run_id)
    outcome.refused = [(error.key, error.limit, error.active) for _, error in batch.refused]
    return outcome


def mixed_keys(prefix: str, trial: int) -> list[str]:
    """A trial's keys in the mixed hammer: ordered differently by code point and by a
    linguistic collation."""
    return [f"mixed:{prefix}:{trial:02d}:{name}" for name in MIXED_KEYS]


def mixed_plan(prefix: str, trial: int, index: int) -> list[dict[str, Any]]:
    """The inputs starter ``index`` starts in ``trial`` (the same in every process): a
    batch of :data:`MIXED_BATCH` for an even ``index``, one single start for an odd one;
    each input a list of one to three ``(key, weight)`` quotas in a random order."""
    draw = random.Random(f"{prefix}/{trial}/{index}")
    keys = mixed_keys(prefix, trial)
    count = MIXED_BATCH if index % 2 == 0 else 1
    return [
        {
            "id": f"{prefix}-{trial}-{index}-{n}",
            "quotas": [
                [key, draw.choice(MIXED_WEIGHTS)] for key in draw.sample(keys, draw.randint(1, 3))
            ],
        }
        for n in range(count)
    ]


def mixed_start(engine: Any, trial: int, starter: str, index: int, prefix: str) -> BatchOutcome:
    """Starter ``index``'s starts of ``trial`` in the mixed hammer, inside a transaction of
    its own (a deadlock is raised, never retried away); never raises."""
    from django.db import transaction

    from durable_django import ConcurrencyLimitError

    outcome = BatchOutcome(trial, starter)
    inputs = mixed_plan(prefix, trial, index)
    ids = [input["id"] for input in inputs]
    refusals: list[tuple[str, Any]] = []
    try:
        with transaction.atomic():
            if len(inputs) > 1:
                batch = engine.start_many(MIXED_WORKFLOW, inputs, run_ids=ids)
                started = batch.started
                refusals = [(ids[i], error) for i, error in batch.refused]
            else:
                try:
                    started = [engine.start(MIXED_WORKFLOW, inputs[0], ids[0])]
                except ConcurrencyLimitError as error:
                    started, refusals = [], [(ids[0], error)]
    except Exception:
        outcome.error = traceback.format_exc()
        return outcome
    outcome.error = "".join(f"{h.run_id} was not created\n" for h in started if not h.created)
    outcome.runs = [handle.run_id for handle in started]
    outcome.refused_runs = [(i, e.key, e.limit, e.active) for i, e in refusals]
    return outcome


def mixed_loop(
    engines: list[Any],
    name: str,
    index: int,
    prefix: str,
    trials: int,
    barrier: Any,
    outcomes: list[BatchOutcome],
    barrier_timeout: float,
) -> None:
    from django.db import connection

    try:
        for trial in range(trials):
            barrier.wait(barrier_timeout)
            engine = engines[(index + trial) % len(engines)]
            outcomes.append(mixed_start(engine, trial, name, index, prefix))
    except Exception:
        outcomes.append(BatchOutcome(-1, name, error=traceback.format_exc()))
        barrier.abort()
    finally:
        connection.close()


def run_mixed_threads(
    engines: list[Any],
    prefix: str,
    trials: int,
    threads: int,
    barrier: Any,
    barrier_timeout: float,
) -> list[BatchOutcome]:
    """The mixed hammer in ``threads`` threads: starter ``n`` batches when ``n`` is even,
    starts singly when odd."""
    outcomes: list[BatchOutcome] = []
    workers = [
        threading.Thread(
            target=mixed_loop,
            args=(engines, f"m{n}", n, prefix, trials, barrier, outcomes, barrier_timeout),
        )
        for n in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return outcomes


def starter_loop(
    engines: list[Any],
    name: str,
    index: int,
    trials: list[list[str]],
    barrier: Any,
    outcomes: list[BatchOutcome],
    barrier_timeout: float,
) -> None:
    from django.db import connection

    try:
        for trial, keys in enumerate(trials):
            barrier.wait(barrier_timeout)
            engine = engines[(index + trial) % len(engines)]
            outcomes.append(start_batch(engine, trial, name, index, keys))
    except Exception:
        outcomes.append(BatchOutcome(-1, name, error=traceback.format_exc()))
        barrier.abort()
    finally:
        connection.close()


def run_threads(
    engines: list[Any],
    prefix: str,
    first_index: int,
    trials: list[list[str]],
    threads: int,
    barrier: Any,
    barrier_timeout: float,
) -> list[BatchOutcome]:
    outcomes: list[BatchOutcome] = []
    argsets = [
        (engines, f"{prefix}{n}", first_index + n, trials, barrier, outcomes, barrier_timeout)
        for n in range(threads)
    ]
    in_threads(starter_loop, argsets, f"batches-{prefix}")
    return outcomes


def process_main(
    db_name: str,
    index: int,
    trials: list[list[str]],
    limit: int,
    threads: int,
    barrier: Any,
    barrier_timeout: float,
    results: Any,
) -> None:
    """Entry point of a spawned child: Django on the parent's test database, then batches.
    Puts one list of :class:`BatchOutcome` on ``results``."""
    outcomes: list[BatchOutcome] = []
    try:
        django_in_child(db_name)
        engines = make_engines(limit)
        outcomes = run_threads(
            engines, f"p{index}t", index * threads, trials, threads, barrier, barrier_timeout
        )
    except Exception:
        barrier.abort()
        outcomes.append(BatchOutcome(-1, f"p{index}", error=traceback.format_exc()))
    results.put(outcomes)
