"""The example project's ``manage.py demo``, run as a user runs it: a subprocess with the
project's own settings, a real Celery worker and the filesystem broker.

The database and the broker folders are temporary (``DATABASE_URL``, ``BROKER_FOLDER``),
so the test leaves ``example_project/var/`` alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE_PROJECT = Path(__file__).resolve().parent.parent / "example_project"

pytestmark = pytest.mark.skipif(
    os.environ.get("DURABLE_TEST_DB", "sqlite") != "sqlite",
    reason="the example project's demo runs on its own SQLite file; once is enough",
)


def test_demo_accepts_eight_turns_and_refuses_four(tmp_path: Path) -> None:
    var_existed = (EXAMPLE_PROJECT / "var").exists()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")
    }
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'chatsite.sqlite3'}",
        CELERY_BROKER_URL="filesystem://localhost/",
        BROKER_FOLDER=str(tmp_path / "broker"),
        # Slow replies: no turn may finish before the burst of starts is over.
        CHAT_REPLY_SECONDS="2",
        PYTHONUNBUFFERED="1",
    )

    completed = subprocess.run(
        [sys.executable, "manage.py", "demo"],
        cwd=EXAMPLE_PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    report = f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    assert completed.returncode == 0, report
    assert "acme: 8 accepted, 4 refused" in completed.stdout, report
    assert "globex: 2 accepted, 1 refused" in completed.stdout, report
    assert "All as expected" in completed.stdout, report
    assert (tmp_path / "chatsite.sqlite3").exists()
    assert (tmp_path / "broker" / "queue").is_dir()
    if not var_existed:
        assert not (EXAMPLE_PROJECT / "var").exists()
