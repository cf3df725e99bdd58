"""Celery's ``task_always_eager`` in a process that never imports ``durable_django.tasks``
(a web process, a script, a test run): the run executes once its start commits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.db import connection

from ..worker import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = """
import json, sys
import django
django.setup()
from django.db import transaction
from tests.celery_app import app
app.conf.task_always_eager = True
from tests.worker_workflows import total
with transaction.atomic():
    handle = total.dispatch({"a": 1, "b": 2})
    before_commit = handle.status
print(json.dumps({"before_commit": before_commit, "after": handle.status,
                  "output": handle.result(timeout=5)}))
"""


def test_eager_runs_execute_after_the_start_commits_in_a_fresh_process() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DURABLE_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "DURABLE_TEST_DURABLE": json.dumps({"ENQUEUE": True}),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"before_commit": "pending", "after": "completed", "output": {"total": 3}}
