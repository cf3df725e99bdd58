"""Concurrent starters under overlapping lists of weighted quotas, for
``tests/processes/test_hammer_multikey.py``, in threads and in spawned processes.

Each trial has its own :data:`KEYS_PER_TRIAL` fresh keys, each with limit :data:`LIMIT`
units. Every starter of a trial starts one run under a list of one to three of them, in
an order of its own, each with a weight of its own (most weigh 1): the plan is drawn from
a seed, so a spawned process draws the same plans as the test that checks them.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass
from typing import Any

from .hammering import django_in_child, in_threads

#: The workflow the hammer starts (declared in ``tests.testapp.workflows``).
WORKFLOW = "tests.plain"
LIMIT = 6
KEYS_PER_TRIAL = 4
WEIGHTS = (1, 1, 1, 2, 3)


@dataclass(frozen=True)
class Plan:
    """One start: its run id and its quotas, ``(key, weight)`` in declared order."""

    run_id: str
    quotas: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Result:
    """What one start did: ``created``, ``refused`` (by ``key`` with ``active`` units)
    or ``error`` (``detail``)."""

    trial: int
    run_id: str
    kind: str
    key: str = ""
    limit: int = 0
    active: int = 0
    detail: str = ""


def trial_keys(prefix: str, trial: int) -> list[str]:
    return [f"multi:{prefix}:{trial:02d}:{name}" for name in "abcd"[:KEYS_PER_TRIAL]]


def plan(prefix: str, trial: int, starter: str) -> Plan:
    """The start ``starter`` makes in ``trial``: the same in every process."""
    draw = random.Random(f"{prefix}/{trial}/{starter}")
    keys = trial_keys(prefix, trial)
    chosen = draw.sample(keys, draw.randint(1, 3))  # a random order: the declared one
    return Plan(f"{prefix}-{trial}-{starter}", tuple((key, draw.choice(WEIGHTS)) for key in chosen))


def start_once(engine: Any, trial: int, start: Plan) -> Result:
    """Start ``start``; never raises."""
    from durable_django import ConcurrencyLimitError

    quotas = [{"key": key, "limit": LIMIT, "weight": weight} for key, weight in start.quotas]
    try:
        handle = engine.start(WORKFLOW, {"trial": trial}, start.run_id, concurrency=quotas)
    except ConcurrencyLimitError as error:
        return Result(trial, start.run_id, "refused", error.key, error.limit, error.active)
    except Exception:
        return Result(trial, start.run_id, "error", detail=traceback.format_exc())
    return Result(trial, start.run_id, "created" if handle.created else "error")


def starter_loop(
    engine: Any,
    prefix: str,
    name: str,
    trials: int,
    barrier: Any,
    results: list[Result],
    barrier_timeout: float,
) -> None:
    """One starter: for each trial, wait for every other starter, then start once."""
    from django.db import connection

    try:
        for trial in range(trials):
            barrier.wait(barrier_timeout)
            results.append(start_once(engine, trial, plan(prefix, trial, name)))
    except Exception:
        results.append(Result(-1, name, "error", detail=traceback.format_exc()))
        barrier.abort()
    finally:
        connection.close()


def run_threads(
    engine: Any,
    prefix: str,
    names: list[str],
    trials: int,
    barrier: Any,
    barrier_timeout: float,
) -> list[Result]:
    """Run one starter thread per name over every trial; return all their results."""
    results: list[Result] = []  # list.append is atomic
    argsets = [(engine, prefix, name, trials, barrier, results, barrier_timeout) for name in names]
    in_threads(starter_loop, argsets, "multikey")
    return results


def process_main(
    db_name: str,
    fast_path: bool,
    prefix: str,
    names: list[str],
    trials: int,
    barrier: Any,
    barrier_timeout: float,
    out: Any,
) -> None:
    """Entry point of a spawned child: Django on the parent's test database, then hammer.
    Puts one list of :class:`Result` on ``out``."""
    results: list[Result] = []
    try:
        django_in_child(db_name)
        from .hammer_worker import make_engine

        engine = make_engine(fast_path)
        results = run_threads(engine, prefix, names, trials, barrier, barrier_timeout)
    except Exception:
        barrier.abort()
        results.append(Result(-1, names[0], "error", detail=traceback.format_exc()))
    out.put(results)
