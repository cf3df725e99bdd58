"""Receivers of Django's task signals for the worker of tests/test_django_tasks_worker.py:
each signal a worker sends is appended, as a JSON line, to the file named by
``DURABLE_TEST_TASK_SIGNALS`` (the test reads it back)."""

from __future__ import annotations

import json
import os
from typing import Any

from django.tasks.signals import task_finished, task_started


def _record(signal_name: str) -> Any:
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        path = os.environ.get("DURABLE_TEST_TASK_SIGNALS")
        if not path:
            return
        line = {
            "signal": signal_name,
            "sender": f"{sender.__module__}.{sender.__qualname__}",
            "id": task_result.id,
            "status": str(task_result.status),
            "pid": os.getpid(),
        }
        with open(path, "a") as file:
            file.write(json.dumps(line) + "\n")

    return receiver


on_started = _record("started")
on_finished = _record("finished")
task_started.connect(on_started)
task_finished.connect(on_finished)
