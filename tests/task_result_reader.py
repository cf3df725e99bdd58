"""Reads a task's result in a process of its own, through Django's tasks API:
``python -m tests.task_result_reader <result id>`` prints it as JSON."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def main(result_id: str) -> None:
    import django

    django.setup()
    from django.tasks import TaskResultStatus, default_task_backend

    result = default_task_backend.get_result(result_id)
    successful = result.status == TaskResultStatus.SUCCESSFUL
    print(
        json.dumps(
            {
                "id": result.id,
                "status": str(result.status),
                "task": result.task.module_path,
                "args": result.args,
                "kwargs": result.kwargs,
                "return_value": result.return_value if successful else None,
                "finished": result.finished_at is not None,
                "pid": os.getpid(),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
