"""Tasks of Django's tasks framework (Django >= 6.0) that the tests enqueue on the durable
task backend (``TASKS`` in tests/settings.py); the test process and the workers import
them from here, by their dotted paths."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import django
from django.tasks import TaskContext, task


class ReportFailed(Exception):
    """What the failing task raises."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def fail(message: str) -> None:
    raise ReportFailed(message)


@task
def leave(code: int) -> None:
    sys.exit(code)


@task
async def double(value: int) -> int:
    return value * 2


@task(takes_context=True)
def whoami(context: TaskContext[Any, Any], label: str) -> dict[str, Any]:
    result = context.task_result
    return {"id": result.id, "label": label, "attempt": context.attempt}


@task
def gated(gate: str, key: str, value: int = 0) -> int:
    """Waits until the file ``gate`` exists (a minute at most), then returns ``value``."""
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


@task
def unstorable() -> set[int]:
    """Returns what is not JSON: the task fails after its function returned."""
    return {1, 2}


def gate_key(gate: str, key: str, value: int = 0) -> str | None:
    """The quota key of ``gated``: one per ``key``; none for the key ``"free"``."""
    return None if key == "free" else f"gated:{key}"


def broken_key(*args: Any, **kwargs: Any) -> str:
    raise LookupError("no tenant in the arguments")


def exiting_key(*args: Any, **kwargs: Any) -> str:
    sys.exit(4)


@task
def keyed_badly(value: int) -> int:
    return value


if django.VERSION[:2] >= (6, 1):  # @task passes its other options to the backend

    @task(concurrency={"key": "own-quota", "limit": 1})
    def own_quota(gate: str) -> str:
        gated.call(gate, "own")
        return "done"
