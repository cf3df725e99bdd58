"""One turn of a run: replay its recorded steps, run the new ones, record how it ends."""

from __future__ import annotations

import datetime
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from .errors import DurableError
from .serialization import json_copy
from .status import RunStatus
from .stores.base import RunRecord, StepRecord

if TYPE_CHECKING:
    from .engines import Engine


class NonDeterminismError(DurableError):
    """A replay reached a different step than the one recorded at that position."""


class StepError(DurableError):
    """A recorded step failed; replaying it raises this with the recorded error."""

    def __init__(self, name: str, error: Any) -> None:
        self.name = name
        self.error = error
        message = error.get("message") if isinstance(error, dict) else error
        super().__init__(f"step {name!r} failed: {message}")


def error_payload(error: BaseException) -> dict[str, Any]:
    """A failure as JSON: its type, message and traceback."""
    return {
        "type": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
    }


class Context:
    """What a workflow body receives as ``ctx``: durable steps and recorded time."""

    def __init__(self, engine: Engine, run: RunRecord, steps: list[StepRecord]) -> None:
        self.engine = engine
        self.run = run
        self._recorded = {step.position: step for step in steps}
        self._position = 0

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once and record its JSON result; replay the record."""
        position = self._position
        self._position += 1
        recorded = self._recorded.get(position)
        if recorded is not None:
            if recorded.name != name:
                raise NonDeterminismError(
                    f"run {self.run_id!r}: step {position} was recorded as {recorded.name!r} "
                    f"but the body now calls {name!r}; a body must call its steps in the "
                    f"same order on every replay"
                )
            if recorded.error is not None:
                raise StepError(name, recorded.error)
            return recorded.result
        try:
            result = json_copy(fn(*args, **kwargs), f"the result of step {name!r}")
        except Exception as error:
            self._record(StepRecord(position, name, error=error_payload(error)))
            raise
        self._record(StepRecord(position, name, result=result))
        return result

    def now(self) -> datetime.datetime:
        """The current time, recorded once and replayed verbatim."""
        stamp = self.step("durable.now", lambda: timezone.now().isoformat())
        return datetime.datetime.fromisoformat(stamp)

    def _record(self, step: StepRecord) -> None:
        self.engine.store.record_step(self.run_id, step)
        self._recorded[step.position] = step


def execute_run(engine: Engine, run_id: str) -> bool:
    """Claim a pending run, run its body to the end, and record the outcome.

    Returns False when the run was not waiting for a worker (another took it, or it
    ended). A run whose workflow version this process does not have is ``blocked``.
    """
    store = engine.store
    run = store.claim_run(run_id, (RunStatus.PENDING,))
    if run is None:
        return False
    definition = engine.registry.get(run.workflow, run.version)
    if definition is None or definition.body is None:
        store.set_status(
            run_id,
            RunStatus.BLOCKED,
            blocked_reason=(
                f"workflow {run.workflow!r} version {run.version!r} is not registered "
                f"for execution in this process"
            ),
        )
        return True
    context = Context(engine, run, store.get_steps(run_id))
    try:
        output = json_copy(
            definition.body(context, run.input), f"the output of workflow {run.workflow!r}"
        )
    except Exception as error:
        store.set_status(
            run_id, RunStatus.FAILED, error=error_payload(error), finished_at=timezone.now()
        )
    else:
        store.set_status(run_id, RunStatus.COMPLETED, output=output, finished_at=timezone.now())
    return True
