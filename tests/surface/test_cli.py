"""``manage.py durable``: its subcommands, their output for people and for scripts, and
their errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from durable_django import RunStatus
from durable_django import engine as default_engine
from durable_django.management.cli import SUBCOMMANDS, load_subcommands
from durable_django.testing import run_until_idle

from ..helpers import durable, durable_json, force_status

ROOT = Path(__file__).resolve().parents[2]


def start_echo(key: str = "tenant:acme", **extra) -> str:
    return default_engine.start("tests.echo", {"key": key, "text": "hi"}, **extra).run_id


def test_every_subcommand_is_listed():
    assert list(load_subcommands()) == [
        "runs",
        "show",
        "cancel",
        "retry",
        "signal",
        "quota",
        "tick",
        "schedules",
        "fire",
        "purge",
    ]
    assert len(SUBCOMMANDS) == 10


def test_a_subcommand_is_required(db):
    with pytest.raises(CommandError, match="SUBCOMMAND"):
        durable()


# runs ----------------------------------------------------------------------------------


def test_runs_lists_newest_first_in_aligned_columns(db):
    first = start_echo()
    run_until_idle()
    second = start_echo("tenant:globex", tags=["vip"])
    lines = durable("runs").splitlines()
    header, *rows = lines
    assert header.split() == [
        "RUN",
        "ID",
        "WORKFLOW",
        "VERSION",
        "STATUS",
        "NAMESPACE",
        "ATTEMPT",
        "CREATED",
        "FINISHED",
        "TAGS",
    ]
    assert [row.split()[0] for row in rows] == [second, first]
    # Columns line up: each starts at the same offset on every line.
    status_at = header.index("STATUS")
    assert rows[0][status_at:].startswith("pending")
    assert rows[1][status_at:].startswith("completed")
    assert rows[0].endswith("concurrency:tenant:globex, vip")


def test_runs_filters(db):
    acme = start_echo("tenant:acme")
    globex = start_echo("tenant:globex", tags=["vip"])
    plain = default_engine.start("tests.plain", {}, namespace="blue").run_id
    run_until_idle()
    pending = start_echo("tenant:acme")

    def ids(*args: str) -> list[str]:
        return [run["run_id"] for run in durable_json("runs", *args)]

    assert ids() == [pending, plain, globex, acme]
    assert ids("--status", "pending") == [pending]
    assert ids("--status", "pending", "--status", "completed") == [pending, plain, globex, acme]
    assert ids("--workflow", "tests.plain") == [plain]
    assert ids("--namespace", "blue") == [plain]
    assert ids("--tag", "vip") == [globex]
    assert ids("--quota", "tenant:acme") == [pending, acme]
    assert ids("--limit", "2") == [pending, plain]
    assert "(the newest 2; --limit N for more)" in durable("runs", "--limit", "2")


def test_runs_json_has_every_field(db):
    run_id = start_echo()
    (run,) = durable_json("runs")
    assert run["run_id"] == run_id
    assert run["status"] == "pending"
    assert run["tags"] == ["concurrency:tenant:acme"]
    assert run["input"] == {"key": "tenant:acme", "text": "hi"}
    assert run["created_at"].endswith("+00:00")


def test_runs_with_nothing_to_list(db):
    assert durable("runs") == "No runs.\n"
    assert durable_json("runs") == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--limit", "0"], "--limit must be a positive number"),
        (["--tag", "a", "--quota", "b"], "give --tag or --quota, not both"),
        (["--status", "sleeping"], "invalid choice: 'sleeping'"),
    ],
)
def test_runs_bad_arguments(db, args, message):
    with pytest.raises(CommandError, match=message):
        durable("runs", *args)


# show ----------------------------------------------------------------------------------


def test_show_a_completed_run_and_its_steps(db):
    run_id = start_echo()
    run_until_idle()
    text = durable("show", run_id)
    assert f"run        {run_id}\n" in text
    assert "workflow   tests.echo (version 1)\n" in text
    assert "status     completed (attempt 1)\n" in text
    assert "tags       concurrency:tenant:acme\n" in text
    assert '\noutput\n  {\n    "echo": "HI"\n  }\n' in text
    assert text.endswith('steps\n#  NAME   OUTCOME\n0  shout  "HI"\n')

    data = durable_json("show", run_id)
    assert data["output"] == {"echo": "HI"}
    assert data["steps"] == [{"position": 0, "name": "shout", "result": "HI", "error": None}]


def test_show_a_failed_run(db, failing_workflow):
    run_id = default_engine.start("tests.boom", {"key": "k", "text": "x"}).run_id
    run_until_idle()
    text = durable("show", run_id)
    assert "\nerror\n  builtins.RuntimeError: the reply service is down\n" in text
    assert "Traceback (most recent call last)" in text


def test_show_an_unknown_run(db):
    with pytest.raises(CommandError, match="no run with id 'nope'") as raised:
        durable("show", "nope")
    assert raised.value.returncode == 1


# cancel --------------------------------------------------------------------------------


def test_cancel(db):
    done = start_echo()
    run_until_idle()
    first, second = start_echo(), start_echo()
    assert durable("cancel", first, done) == (
        f"cancelled  {first}\nunchanged  {done} (already completed)\n"
    )
    assert durable_json("cancel", second) == [
        {"run_id": second, "cancelled": True, "status": "cancelled"}
    ]
    assert default_engine.get_run(first).status == RunStatus.CANCELLED


def test_cancel_an_unknown_run_fails_after_handling_the_others(db):
    run_id = start_echo()
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"no run with id 'nope' \(the others were handled\)"):
        call_command("durable", "cancel", "nope", run_id, stdout=out)
    assert out.getvalue() == f"cancelled  {run_id}\n"


# retry ---------------------------------------------------------------------------------


def test_retry_a_failed_run(db, failing_workflow):
    run_id = default_engine.start("tests.boom", {"key": "k", "text": "x"}).run_id
    run_until_idle()
    assert durable("retry", run_id) == f"retried  {run_id}: pending, attempt 2\n"
    run_until_idle()
    assert durable_json("retry", run_id) == {"run_id": run_id, "status": "pending", "attempt": 3}


def test_retry_refused_by_the_quota_exits_75(db, failing_workflow):
    run_id = default_engine.start("tests.boom", {"key": "tenant:busy"}).run_id
    run_until_idle()
    for _ in range(3):
        start_echo("tenant:busy")
    with pytest.raises(CommandError) as raised:
        durable("retry", run_id)
    assert str(raised.value) == (
        f"retry of run {run_id!r} refused by the quota: key 'tenant:busy' has 3 active "
        "run(s), limit 3; try again once one ends"
    )
    assert raised.value.returncode == 75
    assert default_engine.get_run(run_id).status == RunStatus.FAILED


def test_retry_refused_by_the_quota_reports_the_refusal_as_json(db, failing_workflow):
    run_id = default_engine.start("tests.boom", {"key": "tenant:busy"}).run_id
    run_until_idle()
    for _ in range(3):
        start_echo("tenant:busy")
    out = io.StringIO()
    with pytest.raises(CommandError, match="refused by the quota") as raised:
        call_command("durable", "retry", run_id, "--json", stdout=out)
    assert raised.value.returncode == 75
    assert json.loads(out.getvalue()) == {
        "refused": "quota",
        "workflow": "tests.boom",
        "key": "tenant:busy",
        "limit": 3,
        "active": 3,
        "run_id": run_id,
    }


def test_retry_refuses_a_run_that_has_not_failed(db):
    run_id = start_echo()
    with pytest.raises(CommandError, match="only a failed run can be retried"):
        durable("retry", run_id)
    with pytest.raises(CommandError, match="no run with id 'nope'"):
        durable("retry", "nope")


# signal --------------------------------------------------------------------------------


def test_signal_wakes_the_waiting_run(db):
    def approve(ctx, input):
        return ctx.wait_for_signal(f"approve:{ctx.run_id}")

    default_engine.register("tests.cli.approve", "1", approve)
    try:
        run_id = default_engine.start("tests.cli.approve", {}).run_id
        run_until_idle()
        assert default_engine.get_run(run_id).status == RunStatus.SUSPENDED
        text = durable("signal", f"approve:{run_id}", "--payload", '{"ok": true}')
        assert text == f"signal 'approve:{run_id}' sent; woke {run_id}\n"
        run_until_idle()
        assert default_engine.get_run(run_id).output == {"ok": True}
    finally:
        default_engine.registry.remove("tests.cli.approve")


def test_a_signal_nobody_waits_for_is_kept(db):
    assert durable("signal", "later") == (
        "signal 'later' kept: no run waits on it yet; the first that does takes it\n"
    )
    assert durable_json("signal", "later", "--payload", "[1, 2]") == {
        "token": "later",
        "payload": [1, 2],
        "woken": [],
    }
    assert default_engine.store.has_signal("later")


def test_signal_with_a_bad_payload(db):
    with pytest.raises(CommandError, match="--payload is not valid JSON"):
        durable("signal", "t", "--payload", "{nope")
    assert not default_engine.store.has_signal("t")


# quota ---------------------------------------------------------------------------------


def test_quota_usage_for_people_and_scripts(db):
    for _ in range(3):
        start_echo("tenant:acme")
    start_echo("tenant:globex")
    default_engine.start("tests.plain", {}, concurrency={"key": "adhoc", "limit": 9})
    assert durable("quota") == (
        "KEY            ACTIVE  LIMIT  USE                WORKFLOWS\n"
        "tenant:acme         3      3  [##########] full  tests.echo\n"
        "adhoc               1      -  -                  tests.plain\n"
        "tenant:globex       1      3  [###-------]  33%  tests.echo\n"
    )
    assert durable_json("quota", "tenant:acme") == [
        {
            "kind": "concurrency",
            "key": "tenant:acme",
            "tag": "concurrency:tenant:acme",
            "active": 3,
            "limit": 3,
            "override": None,
            "limit_in_force": 3,
            "full": True,
            "workflows": ["tests.echo"],
            "limit_computed": False,
            "limit_error": None,
        }
    ]


def test_quota_with_nothing_active(db):
    assert durable("quota") == "No quota key holds active runs.\n"
    assert durable_json("quota", "tenant:idle") == [
        {
            "kind": "concurrency",
            "key": "tenant:idle",
            "tag": "concurrency:tenant:idle",
            "active": 0,
            "limit": None,
            "override": None,
            "limit_in_force": None,
            "full": False,
            "workflows": [],
            "limit_computed": False,
            "limit_error": None,
        }
    ]


# the real command line: exit status and stderr -----------------------------------------


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    """``django-admin`` in a subprocess, on the test database of this run."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DURABLE_TEST_DB=os.environ.get("DURABLE_TEST_DB", "sqlite"),
        DURABLE_TEST_DB_NAME=str(connection.settings_dict["NAME"]),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return subprocess.run(
        [sys.executable, "-m", "django", args[0], "--skip-checks", *args[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_exit_status_on_the_command_line(transactional_db):
    failed = start_echo("tenant:busy")
    force_status(default_engine, failed, RunStatus.FAILED, error={"type": "x", "message": "y"})
    for _ in range(3):
        start_echo("tenant:busy")

    ok = manage("durable", "quota", "tenant:busy")
    assert ok.returncode == 0, ok.stderr
    assert "tenant:busy       3      3  [##########] full" in ok.stdout

    refused = manage("durable", "retry", failed)
    assert refused.returncode == 75
    assert "refused by the quota: key 'tenant:busy' has 3 active run(s), limit 3" in (
        refused.stderr
    )

    missing = manage("durable", "show", "nope")
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "CommandError: no run with id 'nope'",
    )

    usage = manage("durable", "runs", "--limit", "many")
    assert usage.returncode == 2
    assert "invalid int value: 'many'" in usage.stderr
