"""Concurrent starters under a rate limit and a concurrency quota, for
``tests/processes/test_hammer_rates.py``, in threads and in spawned processes.

Each trial has one fresh rate key (:data:`RATE_LIMIT` units per :data:`PER` seconds) and
one fresh concurrency key (:data:`SLOTS`). Every starter makes :data:`STARTS` starts per
trial, a few milliseconds apart, each under both (in an order drawn per start) with a
weight of its own on the rate key: the plan is drawn from a seed, so a spawned process
draws the same plans as the test that checks them.
"""

from __future__ import annotations

import random
import time
import traceback
from dataclasses import dataclass
from typing import Any

from .hammering import django_in_child, in_threads

#: The workflow the hammer starts (declared in ``tests.testapp.workflows``).
WORKFLOW = "tests.plain"
RATE_LIMIT = 8
PER = 0.25
SLOTS = 6
STARTS = 6
WEIGHTS = (1, 1, 1, 2)


@dataclass(frozen=True)
class Plan:
    """One start: its run id, its weight on the rate key, whether the rate limit comes
    first in its list, and the pause before it (seconds)."""

    run_id: str
    weight: int
    rate_first: bool
    pause: float


@dataclass(frozen=True)
class Result:
    """What one start did: ``created``, ``refused`` (by ``key``, a rate limit when
    ``per``, with ``active`` units and ``retry_after``) or ``error`` (``detail``)."""

    trial: int
    run_id: str
    kind: str
    key: str = ""
    active: int = 0
    per: float = 0.0
    retry_after: float = 0.0
    detail: str = ""


def trial_keys(prefix: str, trial: int) -> tuple[str, str]:
    """The trial's rate key and concurrency key."""
    return f"rate:{prefix}:{trial:02d}", f"slots:{prefix}:{trial:02d}"


def plans(prefix: str, trial: int, starter: str) -> list[Plan]:
    """The starts ``starter`` makes in ``trial``: the same in every process."""
    draw = random.Random(f"{prefix}/{trial}/{starter}")
    return [
        Plan(
            f"{prefix}-{trial}-{starter}-{number}",
            draw.choice(WEIGHTS),
            draw.random() < 0.5,
            draw.uniform(0, 0.03),
        )
        for number in range(STARTS)
    ]


def start_once(engine: Any, prefix: str, trial: int, start: Plan) -> Result:
    """Start ``start``; never raises."""
    from durable_django import ConcurrencyLimitError, RateLimit, RateLimitError

    rate_key, slot_key = trial_keys(prefix, trial)
    rate = RateLimit(rate_key, RATE_LIMIT, PER, weight=start.weight)
    slots = {"key": slot_key, "limit": SLOTS}
    try:
        handle = engine.start(
            WORKFLOW, {"trial": trial}, start.run_id, concurrency=slots, rate_limit=rate
        )
    except RateLimitError as error:
        return Result(
            trial, start.run_id, "refused", error.key, error.active, error.per, error.retry_after
        )
    except ConcurrencyLimitError as error:
        return Result(trial, start.run_id, "refused", error.key, error.active)
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
    """One starter: for each trial, wait for every other starter, then start its starts."""
    from django.db import connection

    try:
        for trial in range(trials):
            barrier.wait(barrier_timeout)
            for start in plans(prefix, trial, name):
                time.sleep(start.pause)
                results.append(start_once(engine, prefix, trial, start))
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
    in_threads(starter_loop, argsets, "rates")
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
