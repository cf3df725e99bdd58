"""Receivers of Django's task signals for the worker of tests/processes/test_django_tasks_worker.py:
each signal a worker sends is appended, as a JSON line, to the file named by
``DURABLE_TEST_TASK_SIGNALS`` (the test reads it back), with the class of the exception
being handled as it was sent, if any (what Django's ``django.tasks`` log line carries)."""

from __future__ import annotations

import json
import os
import sys
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
            "handling": _class_path(sys.exc_info()[0]),
        }
        with open(path, "a") as file:
            file.write(json.dumps(line) + "\n")

    return receiver


def _class_path(kind: type[BaseException] | None) -> str | None:
    return None if kind is None else f"{kind.__module__}.{kind.__qualname__}"


on_started = _record("started")
on_finished = _record("finished")
task_started.connect(on_started)
task_finished.connect(on_finished)
