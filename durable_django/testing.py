"""Helpers for a project's own tests: drive workflows in-process, without a worker
(:func:`run_until_idle`), and check a store of your own against the store contract
(``StoreContract``, a pytest suite; it imports pytest, so it is loaded on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .engines import Engine, default_engine
from .status import RunStatus

if TYPE_CHECKING:
    from .stores.contract import StoreContract


def run_until_idle(engine: Engine | None = None, *, max_turns: int = 10_000) -> int:
    """Execute every run that is ready, again and again until none is left.

    Runs that this process cannot execute (remote workflows, unknown versions) and runs
    waiting on a timer, a signal or a child are left as they are. Returns how many run
    turns were executed; raises ``RuntimeError`` past ``max_turns`` (a run that never
    settles).
    """
    if engine is None:
        engine = default_engine
    turns = 0
    while True:
        ready = [
            run
            for run in reversed(
                engine.store.list_runs(
                    statuses=[RunStatus.PENDING], namespace=engine.read_namespace
                )
            )
            if (definition := engine.registry.get(run.workflow, run.version)) is not None
            and definition.body is not None
        ]
        executed = sum(engine.execute(run.run_id) for run in ready)
        if not executed:
            return turns
        turns += executed
        if turns > max_turns:
            raise RuntimeError(f"run_until_idle: runs still ready after {max_turns} turns")


def __getattr__(name: str) -> object:
    if name == "StoreContract":
        from .stores.contract import StoreContract

        return StoreContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["StoreContract", "run_until_idle"]
