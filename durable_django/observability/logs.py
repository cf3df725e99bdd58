"""The package's log lines about runs, from the seam (:mod:`.events`).

Named loggers, one per concern:

- ``durable_django.runs``: a step attempt that failed (WARNING, saying what happens
  next), a run that failed (ERROR, with the exception that failed it as ``exc_info``
  when it was raised in this turn), a turn whose worker no longer held the run (INFO:
  it was cancelled, or handed on after the worker stalled).
- ``durable_django.starts``: a start refused by its quota (INFO).
- ``durable_django._runtime.events``: an event's subscriber skipped (WARNING).

Each record carries the run's fields as ``extra`` (:func:`run_fields`); a start's carry
``durable_workflow``, ``durable_key``, ``durable_limit``, ``durable_active`` and
``durable_retry_after``. Nothing is logged above DEBUG on the happy path.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from .._core.records import RunRecord
from ..errors import ConcurrencyLimitError
from .events import AfterTurn, Observer, StepEvent, TurnEvent

runs = logging.getLogger("durable_django.runs")
starts = logging.getLogger("durable_django.starts")
events = logging.getLogger("durable_django.events")


class _RunFields:
    """The ``extra`` fields of a record about a run (also what ``RunFilter`` adds)."""

    NAMES: Final = (
        "durable_run_id",
        "durable_workflow",
        "durable_version",
        "durable_namespace",
        "durable_step",
        "durable_attempt",
    )

    def __call__(self, run: RunRecord, step: str | None, attempt: int) -> dict[str, Any]:
        values = (run.run_id, run.workflow, run.version, run.namespace, step, attempt)
        return dict(zip(self.NAMES, values, strict=True))


run_fields = _RunFields()


class LogObserver(Observer):
    """Logs the failures the seam reports; nothing of the happy path."""

    def step_failed(self, step: StepEvent) -> None:
        if step.retry_in is None:
            then = "no retries left: the step fails, raising StepError into the body"
        else:
            then = f"attempt {step.attempt + 1} in {step.retry_in:g}s"
        runs.warning(
            "run %s (%s): step %r failed on attempt %d (%s); %s",
            step.run.run_id,
            step.run.workflow,
            step.name,
            step.attempt,
            _described(step.error),
            then,
            extra=run_fields(step.run, step.name, step.attempt),
        )

    def turn(self, turn: TurnEvent) -> AfterTurn:
        return AfterTurn(turn, _log_turn_end)

    def refused(self, workflow: str, error: ConcurrencyLimitError) -> None:
        starts.info(
            "start of %s refused: key %r holds %d of %d unit(s); retry after %gs",
            workflow,
            error.key,
            error.active,
            error.limit,
            error.retry_after,
            extra={
                "durable_workflow": workflow,
                "durable_key": error.key,
                "durable_limit": error.limit,
                "durable_active": error.active,
                "durable_retry_after": error.retry_after,
            },
        )

    def subscriber_skipped(
        self, event: str, event_id: str | None, workflow: str, error: Exception
    ) -> None:
        events.warning(
            "event %r: subscriber %s skipped (%s)",
            event,
            workflow,
            _described(error),
            extra={
                "durable_workflow": workflow,
                "durable_event": event,
                "durable_event_id": event_id,
            },
        )


def _log_turn_end(turn: TurnEvent) -> None:
    """Logs how a turn ended, when it did not end well."""
    if turn.outcome not in ("failed", "lease_lost"):
        return
    run = turn.run
    extra = run_fields(run, None, run.attempt)
    if turn.outcome == "failed":
        error = turn.error
        runs.error(
            "run %s (%s) failed%s",
            run.run_id,
            run.workflow,
            f": {_described(error)}" if error is not None else "",
            exc_info=error,
            extra=extra,
        )
    elif turn.outcome == "lease_lost":
        runs.info(
            "run %s (%s): this worker no longer holds the run (cancelled, or handed on "
            "after its lease lapsed); the turn stopped, recording nothing more",
            run.run_id,
            run.workflow,
            extra=extra,
        )


def _described(error: BaseException | None) -> str:
    if error is None:
        return "no exception"
    try:
        return f"{type(error).__name__}: {error}"
    except Exception:
        return type(error).__name__
