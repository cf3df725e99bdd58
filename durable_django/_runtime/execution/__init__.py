"""One turn of a run: replay its recorded steps, run the new ones, suspend or finish.

A run's body replays from the top on every turn. Each durable call (``ctx.step``,
``ctx.sleep``, ``ctx.wait_for_signal``, ``ctx.child`` ...) takes the next position; what
it did is recorded at that position, and a replay returns the recording instead of doing
it again. A call that must wait raises :class:`Suspend`, which ends the turn with the run
``suspended`` until a timer, a signal or a child wakes it.

The package's modules, one job each: :mod:`.context` (the ``Context`` a body receives),
:mod:`.control` (how a turn ends early), :mod:`.lease` (the lease keeper thread),
:mod:`.turn` (the turn driver: claim, run, end, hand back, after the turn),
:mod:`.settling` (``ctx.settle``'s rules and record) and :mod:`.payloads` (errors and
refusals as stored JSON).
"""

from ..._core.context import current_context
from ...errors import NonDeterminismError, SignalTimeout, StepError
from .context import Context, running_context
from .control import LeaseLost, Suspend
from .payloads import error_payload as error_payload
from .turn import execute_run

__all__ = [
    "Context",
    "LeaseLost",
    "NonDeterminismError",
    "SignalTimeout",
    "StepError",
    "Suspend",
    "current_context",
    "execute_run",
    "running_context",
]
