"""The example project's ``manage.py demo``, run as a user runs it: a subprocess with the
project's own settings, a real Celery worker and the filesystem broker.

The database and the broker folders are temporary (``DATABASE_URL``, ``BROKER_FOLDER``),
so the test leaves ``example_project/var/`` alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest

EXAMPLE_PROJECT = Path(__file__).resolve().parents[2] / "example_project"

DB = os.environ.get("DURABLE_TEST_DB", "sqlite")

pytestmark = pytest.mark.slow

only_once = pytest.mark.skipif(
    DB != "sqlite", reason="the example project's demo runs on its own SQLite file; once is enough"
)


def project_env(**extra: str) -> dict[str, str]:
    """The environment of a process of the example project: none of the suite's Django
    settings, none of the project's own but those given."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DEBUG", "SECRET_KEY")
        and not key.startswith("CELERY_")
    }
    return {**env, **extra}


def manage(*args: str, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=EXAMPLE_PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line == text)


@only_once
def test_demo_accepts_eight_turns_and_refuses_four(tmp_path: Path) -> None:
    var_existed = (EXAMPLE_PROJECT / "var").exists()
    env = project_env(SECRET_KEY="demo-test-only")
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'chatsite.sqlite3'}",
        CELERY_BROKER_URL="filesystem://localhost/",
        BROKER_FOLDER=str(tmp_path / "broker"),
        # Slow replies: no turn may finish before the burst of starts is over.
        CHAT_REPLY_SECONDS="2",
        PYTHONUNBUFFERED="1",
    )

    completed = manage("demo", env=env)

    report = f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    assert completed.returncode == 0, report
    assert "acme: 8 accepted, 4 refused" in completed.stdout, report
    assert "globex: 2 accepted, 1 refused" in completed.stdout, report
    assert "All as expected" in completed.stdout, report
    # It ends by pointing at the code behind what it showed, the admin and the docs.
    tenants = EXAMPLE_PROJECT / "tenants"
    workflow_line = line_of(tenants / "workflows.py", "@workflow(")
    view_line = line_of(tenants / "views.py", "@csrf_exempt")
    assert f"the quota:  tenants/workflows.py:{workflow_line}" in completed.stdout, report
    assert f"the view:   tenants/views.py:{view_line}" in completed.stdout, report
    assert "http://127.0.0.1:8000/admin/durable_django/run/quotas/" in completed.stdout, report
    assert "docs/getting-started.md" in completed.stdout, report
    assert (tmp_path / "chatsite.sqlite3").exists()
    assert (tmp_path / "broker" / "queue").is_dir()
    if not var_existed:
        assert not (EXAMPLE_PROJECT / "var").exists()


def database_url(tmp_path: Path) -> str:
    """The suite's database server, as the example project's ``DATABASE_URL``; its test
    database is ``test_<name>_chatsite``."""
    if DB == "postgres":
        name = os.environ.get("DURABLE_PG_NAME", "durable")
        host = os.environ.get("DURABLE_PG_HOST", "127.0.0.1")
        port = os.environ.get("DURABLE_PG_PORT", "5432")
        user = os.environ.get("DURABLE_PG_USER", "postgres")
        return f"postgres://{user}@{host}:{port}/{name}_chatsite"
    if DB == "mariadb":
        name = os.environ.get("DURABLE_MYSQL_NAME", "durable")
        host = os.environ.get("DURABLE_MYSQL_HOST", "127.0.0.1")
        port = os.environ.get("DURABLE_MYSQL_PORT", "3306")
        user = os.environ.get("DURABLE_MYSQL_USER", "root")
        return f"mysql://{user}@{host}:{port}/{name}_chatsite"
    return f"sqlite:///{tmp_path / 'chatsite.sqlite3'}"


def test_the_example_projects_own_tests_pass(tmp_path: Path) -> None:
    """tenants/tests.py, Django TestCases through the test client (the API's 202, 429,
    400s, idempotency keys and access rules), with the project's test settings."""
    env = project_env(DATABASE_URL=database_url(tmp_path), BROKER_FOLDER=str(tmp_path / "broker"))
    completed = manage("test", "--settings", "chatsite.test_settings", "--noinput", env=env)
    assert completed.returncode == 0, completed.stderr
    assert "OK" in completed.stderr.splitlines()[-2:], completed.stderr


@only_once
def test_debug_is_off_unless_set_and_a_secret_key_is_required(tmp_path: Path) -> None:
    env = project_env(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", BROKER_FOLDER=str(tmp_path / "b")
    )
    refused = manage("check", env=env)
    assert refused.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in refused.stderr

    show = "from django.conf import settings; print(settings.DEBUG, settings.SECRET_KEY)"
    served = manage(
        "shell", "-v", "0", "-c", show, env={**env, "SECRET_KEY": "from-the-environment"}
    )
    assert served.stdout.split() == ["False", "from-the-environment"], served.stderr


def test_the_testcase_example_of_the_docs_is_the_one_the_project_runs() -> None:
    """docs/testing.md shows tenants/test_turns.py, which the test above runs."""
    docs = (EXAMPLE_PROJECT.parent / "docs" / "testing.md").read_text()
    fence = '```python title="tenants/test_turns.py"\n'
    shown = docs[docs.index(fence) + len(fence) :]
    shown = shown[: shown.index("\n```\n") + 1]
    module = (EXAMPLE_PROJECT / "tenants" / "test_turns.py").read_text()
    assert module.endswith("\n\n" + shown)


# the filesystem broker ------------------------------------------------------------------


class SlowToWrite:
    """A value whose JSON takes a while to write: a message being written stays so."""


def _slow_json(value: SlowToWrite) -> str:
    time.sleep(0.3)
    return "written"


@pytest.mark.parametrize("transport", ["filesystem", "example"])
def test_a_message_file_is_never_seen_before_it_is_written(transport: str, tmp_path: Path) -> None:
    """A worker polling the queue folder while a message is being written: kombu's own
    filesystem channel lets it take the empty file, whose decoding fails (the worker
    stops); the example project's (``chatsite/broker.py``) shows the file once whole."""
    from kombu import Connection
    from kombu.utils.json import register_type

    spec = importlib.util.spec_from_file_location(
        "example_broker", EXAMPLE_PROJECT / "chatsite" / "broker.py"
    )
    assert spec is not None and spec.loader is not None
    broker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(broker)
    register_type(SlowToWrite, "slow", _slow_json, lambda value: value)

    folder = str(tmp_path)
    options = {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False}
    kind = broker.Transport if transport == "example" else "filesystem"
    with (
        Connection("filesystem://localhost/", transport=kind, transport_options=options) as put,
        Connection("filesystem://localhost/", transport=kind, transport_options=options) as get,
    ):
        writer = threading.Thread(target=put.default_channel._put, args=("q", {"v": SlowToWrite()}))
        writer.start()
        seen: list[Any] = []
        while writer.is_alive() or not seen:
            try:
                seen.append(get.default_channel._get("q"))
            except Empty:
                time.sleep(0.001)
            except json.JSONDecodeError as error:
                seen.append(error)
        writer.join()
    if transport == "filesystem":
        assert isinstance(seen[0], json.JSONDecodeError)  # what the example's channel mends
    else:
        assert seen == [{"v": "written"}]
