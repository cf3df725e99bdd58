"""``ctx.settle``'s rules: which of a run's rate limit keys it may settle, with which
units, and what its record holds (the step ``durable.settle``).

The call itself, a transactional step, is :meth:`Context.settle
<durable_django._runtime.execution.context.Context.settle>`.
"""

from __future__ import annotations

from typing import Any

from ..._core.limits import MAX_LIMIT, RATE_TAG_PREFIX
from ..._core.records import RunRecord
from ...errors import NonDeterminismError

#: The name of the step recording a ``ctx.settle``.
SETTLE_STEP = "durable.settle"


def settled_tag(run: RunRecord, key: object) -> str:
    """The tag of ``run``'s rate limit ``key``; a clear error when ``key`` is not a str or
    not one of the run's rate limit keys."""
    if not isinstance(key, str):
        raise TypeError(f"ctx.settle key must be a str, not {type(key).__name__} {key!r}")
    tag = RATE_TAG_PREFIX + key
    if tag not in run.tags:
        keys = sorted(t[len(RATE_TAG_PREFIX) :] for t in run.tags if t.startswith(RATE_TAG_PREFIX))
        has = f"its rate limit keys are {keys!r}" if keys else "it started under no rate limit"
        raise ValueError(f"ctx.settle: run {run.run_id!r} has no rate limit of key {key!r}; {has}")
    return tag


def settled_units(units: object) -> int:
    """``units`` if a rate limit's tag may weigh it: an int from 0 to the highest limit."""
    if isinstance(units, bool) or not isinstance(units, int):
        raise TypeError(f"ctx.settle units must be an int, not {type(units).__name__} {units!r}")
    if not 0 <= units <= MAX_LIMIT:
        raise ValueError(f"ctx.settle units must be between 0 and {MAX_LIMIT}, not {units}")
    return units


def settle_record(key: str, units: int) -> dict[str, Any]:
    """The result recorded for ``ctx.settle(key, units)``."""
    return {"key": key, "units": units}


def check_replayed(run_id: str, position: int, recorded: Any, key: str, units: int) -> None:
    """A replayed settle must settle what was recorded: the units were settled once, from
    the first call's arguments, so other arguments now mean the body changed."""
    if recorded != settle_record(key, units):
        was = recorded if isinstance(recorded, dict) else {}
        raise NonDeterminismError(
            f"run {run_id!r}: position {position} was recorded as ctx.settle"
            f"({was.get('key')!r}, {was.get('units')!r}) but the body now calls "
            f"ctx.settle({key!r}, {units!r}); a settle replays with the key and units it "
            f"recorded"
        )


__all__ = ["SETTLE_STEP", "check_replayed", "settle_record", "settled_tag", "settled_units"]
