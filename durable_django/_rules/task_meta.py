"""What a run of Django's tasks framework carries besides its task's arguments: the
workflow every task runs as (:data:`TASK_WORKFLOW`, whose input names the task by its
dotted path), the name such a run is shown by (:func:`shown_name`), and the task's
priority (:func:`task_priority`) as a Celery message's (:func:`message_priority`)."""

from __future__ import annotations

from typing import Any

#: The workflow every task of ``django.tasks`` runs as.
TASK_WORKFLOW = "django.task"

#: Django's range of task priorities (``django.tasks.base``): larger runs sooner.
TASK_MIN_PRIORITY, TASK_MAX_PRIORITY = -100, 100
#: The highest Celery message priority a task is given (0 to 9, Celery's convention).
MESSAGE_MAX_PRIORITY = 9


def task_path(workflow: str, input: Any) -> str | None:
    """The dotted path of the task a run executes, or ``None`` for a workflow's run (or a
    task run whose input names no task)."""
    if workflow != TASK_WORKFLOW or not isinstance(input, dict):
        return None
    path = input.get("task")
    return path if isinstance(path, str) and path else None


def shown_name(workflow: str, input: Any) -> str:
    """The name a run is shown by: its task's dotted path for a task's run, else its
    workflow's name."""
    return task_path(workflow, input) or workflow


def task_priority(workflow: str, input: Any) -> int | None:
    """The Django priority of the task a run executes, or ``None`` for a workflow's run
    (or a task run whose input gives none)."""
    if workflow != TASK_WORKFLOW or not isinstance(input, dict):
        return None
    priority = input.get("priority")
    return priority if type(priority) is int else None


def message_priority(priority: int, *, lowest_first: bool = False) -> int:
    """The Celery message priority (0 to 9) of a task of Django ``priority`` (-100 to
    100, larger sooner), in ten bands of about 20: -100 to -80 give 0, -19 to 0 give 4,
    1 to 20 give 5, 81 to 100 give 9, on a broker that delivers the larger first
    (RabbitMQ). With ``lowest_first``, for a broker that delivers the smaller first
    (kombu's Redis transport), the same reversed: 0 gives 5, 100 gives 0."""
    clamped = min(max(priority, TASK_MIN_PRIORITY), TASK_MAX_PRIORITY)
    # The 201 priorities in ten bands of about 20.
    values = TASK_MAX_PRIORITY - TASK_MIN_PRIORITY + 1
    level = (clamped - TASK_MIN_PRIORITY) * (MESSAGE_MAX_PRIORITY + 1) // values
    return MESSAGE_MAX_PRIORITY - level if lowest_first else level


__all__ = [
    "MESSAGE_MAX_PRIORITY",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "TASK_WORKFLOW",
    "message_priority",
    "shown_name",
    "task_path",
    "task_priority",
]
