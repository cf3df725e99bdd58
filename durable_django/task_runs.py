"""Tasks of Django's tasks framework (Django >= 6.0) as durable runs: the workflow that
executes them, and a run read back as a ``TaskResult``.

Every task is enqueued as a run of one workflow, :data:`WORKFLOW`, whose input names the
task by its dotted path, with its arguments. The body waits for ``run_after`` on a
durable timer, records when and where the task starts (once per worker that processes
it: a worker that died calling it hands it on to another, which records itself too),
then calls the task function as one step. ``task_started`` is sent by the worker as the
function is called; ``task_finished`` as its failure is handled, in the worker, as
Django's backends send it (its ``django.tasks`` log line carries the exception), or
else once the run has ended (in the process that ended it).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
from typing import Any

from django.dispatch import Signal
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.base import Task, TaskError
from django.tasks.exceptions import InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.module_loading import import_string

from ._core.records import RunRecord, StepRecord
from ._core.runtime import Runtime
from ._core.serialization import json_copy
from ._rules.registry import WorkflowDefinition
from ._rules.task_meta import TASK_WORKFLOW
from ._runtime.execution import Context, error_payload
from .engines import Engine, default_engine
from .errors import RunNotFound
from .signals import run_finished
from .signals import send as send_robustly
from .status import RunStatus

logger = logging.getLogger("durable_django.tasks_backend")

#: The workflow every task runs as.
WORKFLOW = TASK_WORKFLOW
VERSION = "1"
#: The steps of a task's run: when and where the task function was called, and its call.
STARTED_STEP = "django.task.started"
CALL_STEP = "django.task.call"

#: The errors of a run that ended without one of its own: cancelled.
CANCELLED_ERROR = "durable_django.errors.RunFailed"


def register(engine: Engine | None = None) -> WorkflowDefinition:
    """Register :data:`WORKFLOW` on ``engine`` (the default one); again is a no-op."""
    return (engine or default_engine).register(WORKFLOW, VERSION, run_task)


# the run ------------------------------------------------------------------------------


def run_task(ctx: Context, input: dict[str, Any]) -> Any:
    """The body of a task's run: wait until ``run_after``, then call the task once."""
    run_after = input.get("run_after")
    if run_after is not None:
        ctx.sleep(datetime.datetime.fromisoformat(run_after) - ctx.now())
    attempts = _attempts(ctx)
    return ctx.step(CALL_STEP, call_task, ctx.engine, ctx.run_id, input, attempts)


def _attempts(ctx: Context) -> list[dict[str, str]]:
    """The record of each worker that processed the task, this turn's last: the turns
    before it that reached the call were handed on (their worker died calling it), and
    each recorded itself, under :data:`STARTED_STEP`, as this one does."""
    attempts = []
    while True:
        attempt = ctx.step(STARTED_STEP, _started, ctx.owner)
        attempts.append(attempt)
        if attempt.get("turn") == ctx.owner:
            return attempts


def _started(turn: str) -> dict[str, str]:
    return {
        "at": timezone.now().isoformat(),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "turn": turn,
    }


#: The run whose ``task_finished`` this thread sent as its failure was handled.
_announced = threading.local()


def call_task(
    engine: Runtime, run_id: str, input: dict[str, Any], attempts: list[dict[str, str]]
) -> Any:
    """Call the task function with the run's arguments, after ``task_started``
    (``attempts``: the record of each worker that processed it, this one's last); a
    failure (the function's, or a return value that is not JSON) sends ``task_finished``
    while it is handled, as Django's backends do, and fails the step."""
    task = load_task(run_id, input)
    result = task_result(
        task,
        run_id,
        TaskResultStatus.RUNNING,
        input,
        enqueued_at=engine.get_run(run_id).created_at,
        started=attempts,
    )
    send(task_started, input, task_result=result)
    args, kwargs = input["args"], input["kwargs"]
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        return json_copy(value, f"the return value of task {input['task']!r}")
    except KeyboardInterrupt:
        raise  # as Django's backends do: not the task's failure
    except BaseException as error:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", timezone.now())
        result.errors.extend(task_errors(error_payload(error)))
        _announced.run_id = run_id
        send(task_finished, input, task_result=result)
        raise


def _is_attempt(step: StepRecord) -> bool:
    return step.name == STARTED_STEP and step.error is None and isinstance(step.result, dict)


# a run as a TaskResult ----------------------------------------------------------------


def load_task(run_id: str, input: dict[str, Any]) -> Task[..., Any]:
    """The task a run executes, as it was enqueued (its ``run_after`` and queue)."""
    path = input["task"]
    try:
        found = import_string(path)
    except ImportError as error:
        raise TaskResultDoesNotExist(
            f"run {run_id!r} executes task {path!r}, which cannot be imported here: {error}"
        ) from error
    if not isinstance(found, Task):
        raise TaskResultDoesNotExist(f"run {run_id!r}: {path!r} is not a task")
    run_after = input.get("run_after")
    return found.using(
        queue_name=input.get("queue_name"),
        priority=input.get("priority"),
        run_after=datetime.datetime.fromisoformat(run_after) if run_after else None,
    )


def read_result(engine: Engine, result_id: str) -> TaskResult[..., Any]:
    """The ``TaskResult`` of the task run ``result_id``, read from the store, or
    ``TaskResultDoesNotExist``."""
    try:
        run = engine.get_run(result_id)
    except (RunNotFound, ValueError):
        raise TaskResultDoesNotExist(result_id) from None
    if run.workflow != WORKFLOW:
        raise TaskResultDoesNotExist(f"run {result_id!r} is not a task (it is {run.workflow!r})")
    return result_of_run(engine, run)


def result_of_run(engine: Engine, run: RunRecord) -> TaskResult[..., Any]:
    """``run`` as a ``TaskResult``, with what its recorded steps say of the task's start."""
    steps = engine.store.get_steps(run.run_id) if run.status != RunStatus.PENDING else []
    attempts = [step.result for step in steps if _is_attempt(step)]
    status = _status(run, bool(attempts))
    result = task_result(
        load_task(run.run_id, run.input),
        run.run_id,
        status,
        run.input,
        enqueued_at=run.created_at,
        started=attempts,
        finished_at=run.finished_at if status in _FINISHED else None,
        errors=_errors(run) if status == TaskResultStatus.FAILED else [],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", run.output)
    return result


_FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)


def _status(run: RunRecord, started: bool) -> TaskResultStatus:
    if run.status == RunStatus.COMPLETED:
        return TaskResultStatus.SUCCESSFUL
    if run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        return TaskResultStatus.FAILED
    if run.status == RunStatus.RUNNING and started:
        return TaskResultStatus.RUNNING
    # Waiting for a worker, for run_after, or to be handed on: ready to be executed.
    return TaskResultStatus.READY


def _errors(run: RunRecord) -> list[TaskError]:
    error = run.error if isinstance(run.error, dict) else {}
    if run.status == RunStatus.CANCELLED:
        error = {**error, "type": CANCELLED_ERROR}
    return task_errors(error)


def task_errors(error: dict[str, Any]) -> list[TaskError]:
    """A failure as recorded (``error_payload``: its class path, message, traceback) as
    the ``TaskResult.errors`` of the task; one without a class path is a cancellation."""
    kind = str(error.get("type", ""))
    return [
        TaskError(
            exception_class_path=kind if "." in kind else CANCELLED_ERROR,
            traceback=str(error.get("traceback") or error.get("message") or ""),
        )
    ]


def task_result(
    task: Task[..., Any],
    run_id: str,
    status: TaskResultStatus,
    input: dict[str, Any],
    *,
    enqueued_at: datetime.datetime | None,
    started: list[dict[str, str]],
    finished_at: datetime.datetime | None = None,
    errors: list[TaskError] | None = None,
) -> TaskResult[..., Any]:
    """A ``TaskResult`` from what a run holds; ``started`` has the record of each worker
    that processed it, in order: ``worker_ids`` (so ``attempts``) lists them, and the
    task was started (and last attempted) when the last one called it."""
    started_at = datetime.datetime.fromisoformat(started[-1]["at"]) if started else None
    return TaskResult(
        task=task,
        id=run_id,
        status=status,
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=started_at,
        args=input["args"],
        kwargs=input["kwargs"],
        backend=input["backend"],
        errors=errors or [],
        worker_ids=[attempt["worker"] for attempt in started],
    )


# signals ------------------------------------------------------------------------------


def send(signal: Signal, input: dict[str, Any], **arguments: Any) -> None:
    """Send one of Django's task signals, from the class of the run's backend (``None``
    when this process has no backend of that alias); a receiver that raises is logged
    (:func:`durable_django.signals.send`), and changes nothing of the run."""
    try:
        sender: Any = type(task_backends[input["backend"]])
    except InvalidTaskBackend:
        sender = None
    send_robustly(signal, sender, **arguments)


def _finished(sender: Any, engine: Engine, run_id: str, workflow: str, **kwargs: Any) -> None:
    """``run_finished`` of a task's run sends ``task_finished`` with its result, unless
    this thread sent it as the task's failure was handled."""
    if workflow != WORKFLOW:
        return
    if getattr(_announced, "run_id", None) == run_id:
        _announced.run_id = None
        return
    try:
        result = read_result(engine, run_id)
    except Exception:
        logger.exception("task run %r ended, but its result cannot be read", run_id)
        return
    send(task_finished, {"backend": result.backend}, task_result=result)


run_finished.connect(_finished, dispatch_uid="durable_django.task_runs.finished")


__all__ = [
    "CALL_STEP",
    "STARTED_STEP",
    "VERSION",
    "WORKFLOW",
    "call_task",
    "load_task",
    "read_result",
    "register",
    "result_of_run",
    "run_task",
    "task_errors",
    "task_result",
]
