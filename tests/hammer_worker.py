"""Concurrent starters for the quota hammer tests, in threads and in spawned processes.

Every starter waits on a shared barrier, then starts one run under the trial's quota key,
and records what happened. The same code runs in the test process (threads) and in child
processes started with the ``spawn`` context (:func:`process_main`).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from .hammering import django_in_child, in_threads

#: The workflow the hammer starts (declared in ``tests.testapp.workflows``).
WORKFLOW = "tests.plain"


@dataclass(frozen=True)
class Outcome:
    """What one start did in one trial: created a run, was refused, or failed."""

    trial: int
    starter: str
    kind: str  # "created", "refused" or "error"
    run_id: str = ""
    workflow: str = ""
    key: str = ""
    limit: int = 0
    active: int = 0
    detail: str = ""


def make_engine(fast_path: bool) -> Any:
    """An engine on the ORM store that creates runs and sends nothing."""
    from durable_django import Engine
    from durable_django.stores import OrmStore

    engine = Engine(store=OrmStore(fast_path=fast_path), enqueue=False)
    engine.config  # noqa: B018  (resolve the options once, before the threads share it)
    return engine


def start_once(engine: Any, trial: int, starter: str, key: str, limit: int) -> Outcome:
    """Start one run of :data:`WORKFLOW` under ``key``/``limit``; never raises."""
    from durable_django import ConcurrencyLimitError

    try:
        handle = engine.start(
            WORKFLOW, {"trial": trial, "starter": starter}, concurrency={"key": key, "limit": limit}
        )
    except ConcurrencyLimitError as error:
        return Outcome(
            trial,
            starter,
            "refused",
            workflow=error.workflow,
            key=error.key,
            limit=error.limit,
            active=error.active,
        )
    except Exception:
        return Outcome(trial, starter, "error", detail=traceback.format_exc())
    kind = "created" if handle.created else "error"
    return Outcome(trial, starter, kind, run_id=handle.run_id, workflow=handle.workflow)


def starter_loop(
    engine: Any,
    name: str,
    keys: list[str],
    limit: int,
    barrier: Any,
    outcomes: list[Outcome],
    barrier_timeout: float,
) -> None:
    """One starter: for each trial, wait for every other starter, then start once.

    Closes this thread's database connection at the end, whatever happened.
    """
    from django.db import connection

    try:
        for trial, key in enumerate(keys):
            barrier.wait(barrier_timeout)
            outcomes.append(start_once(engine, trial, name, key, limit))
    except Exception:
        outcomes.append(Outcome(-1, name, "error", detail=traceback.format_exc()))
        barrier.abort()
    finally:
        connection.close()


def run_threads(
    engine: Any,
    prefix: str,
    keys: list[str],
    limit: int,
    threads: int,
    barrier: Any,
    barrier_timeout: float,
) -> list[Outcome]:
    """Run ``threads`` starters over every trial; return all their outcomes."""
    outcomes: list[Outcome] = []  # list.append is atomic
    argsets = [
        (engine, f"{prefix}{n}", keys, limit, barrier, outcomes, barrier_timeout)
        for n in range(threads)
    ]
    in_threads(starter_loop, argsets, f"hammer-{prefix}")
    return outcomes


def process_main(
    db_name: str,
    fast_path: bool,
    index: int,
    keys: list[str],
    limit: int,
    threads: int,
    barrier: Any,
    barrier_timeout: float,
    results: Any,
) -> None:
    """Entry point of a spawned child: set Django up on the parent's test database, hammer.

    Puts one list of :class:`Outcome` on ``results``.
    """
    outcomes: list[Outcome] = []
    try:
        django_in_child(db_name)
        engine = make_engine(fast_path)
        outcomes = run_threads(engine, f"p{index}t", keys, limit, threads, barrier, barrier_timeout)
    except Exception:
        barrier.abort()
        outcomes.append(Outcome(-1, f"p{index}", "error", detail=traceback.format_exc()))
    results.put(outcomes)
