"""Django's tasks framework (Django >= 6.0) on the durable task backend, in this process:
tasks enqueued through Django's public API (``@task``, ``enqueue``, ``get_result``,
``TaskResult.refresh``), their runs executed with ``run_until_idle``. The worker tests,
with a real Celery worker, are in tests/processes/test_django_tasks_worker.py.

Skipped only on a Django without ``django.tasks`` (tests/surface/test_tasks_backend.py covers
that one); the newest-Python job of scripts/test runs them on Django 6.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("django.tasks", reason="Django before 6.0 has no tasks framework")

import django
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from durable_django import ConcurrencyLimitError, UnstorableValueError
from durable_django import engine as default_engine
from durable_django._core.records import StepRecord
from durable_django.checks import check_tasks_backend
from durable_django.task_runs import STARTED_STEP, WORKFLOW
from durable_django.tasks_backend import BACKEND_PATH, DurableTaskBackend
from durable_django.testing import run_until_idle

from .. import django_task_functions as tasks
from ..helpers import durable, durable_json

pytestmark = pytest.mark.django_db

#: The tests' own TASKS entry (tests/settings.py).
DEFAULT_TASKS = settings.TASKS["default"]


class Rollback(Exception):
    """Raised to roll an ``atomic`` block back."""


def task_runs() -> int:
    """How many task runs there are."""
    return len(default_engine.list_runs(workflow=WORKFLOW))


@pytest.fixture
def signals() -> Iterator[list[tuple[str, str, str]]]:
    """The task signals sent in this process: (signal, task result id, status)."""
    seen: list[tuple[str, str, str]] = []
    receivers = {}
    for name, signal in (
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            assert sender is DurableTaskBackend
            seen.append((_name, task_result.id, str(task_result.status)))

        receivers[name] = receiver
        signal.connect(receiver)
    yield seen
    task_enqueued.disconnect(receivers["enqueued"])
    task_started.disconnect(receivers["started"])
    task_finished.disconnect(receivers["finished"])


def test_the_backend_says_what_it_supports() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, DurableTaskBackend)
    assert (
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
        backend.supports_priority,
    ) == (True, True, True, True)


@pytest.mark.django_db(transaction=True)  # the signals are sent on commit
def test_an_enqueued_task_runs_and_its_result_is_read_back(signals: list[Any]) -> None:
    before = timezone.now()
    result = tasks.add.enqueue(2, b=3)

    assert result.status == TaskResultStatus.READY
    assert result.args == [2] and result.kwargs == {"b": 3} and result.backend == "default"
    assert result.enqueued_at is not None and result.enqueued_at >= before
    assert (result.started_at, result.finished_at, result.worker_ids) == (None, None, [])
    assert default_engine.get_run(result.id).workflow == WORKFLOW
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    run_until_idle()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert len(result.worker_ids) == 1 and result.attempts == 1
    again = tasks.add.get_result(result.id)
    assert (again.id, again.status, again.return_value) == (result.id, "SUCCESSFUL", 5)
    assert again.task.func is tasks.add.func
    assert signals == [
        ("enqueued", result.id, "READY"),
        ("started", result.id, "RUNNING"),
        ("finished", result.id, "SUCCESSFUL"),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_failing_task_ends_failed_with_its_error(signals: list[Any]) -> None:
    result = tasks.fail.enqueue("no data for March")
    run_until_idle()
    result.refresh()

    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "tests.django_task_functions.ReportFailed"
    assert error.exception_class is tasks.ReportFailed
    assert "ReportFailed: no data for March" in error.traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    assert signals[-1] == ("finished", result.id, "FAILED")


@pytest.mark.django_db(transaction=True)
def test_a_task_calling_sys_exit_ends_failed(signals: list[Any]) -> None:
    result = tasks.leave.enqueue(3)
    run_until_idle()  # returns: the task's exit is its failure, not this process's
    result.refresh()

    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.SystemExit"
    assert "SystemExit: 3" in error.traceback
    assert signals[-1] == ("finished", result.id, "FAILED")


def test_async_and_context_tasks_run() -> None:
    doubled = tasks.double.enqueue(21)
    who = tasks.whoami.enqueue("me")
    run_until_idle()
    doubled.refresh()
    who.refresh()

    assert (doubled.status, doubled.return_value) == ("SUCCESSFUL", 42)
    assert who.return_value == {"id": who.id, "label": "me", "attempt": 1}


def test_run_after_waits_on_a_durable_timer() -> None:
    later = timezone.now() + datetime.timedelta(seconds=1)
    result = tasks.add.using(run_after=later).enqueue(1, 1)
    assert result.task.run_after == later

    run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.READY  # suspended until run_after
    assert result.started_at is None
    run = default_engine.get_run(result.id)
    assert run.status == "suspended" and run.wake_at is not None and run.wake_at >= later

    time.sleep(max(0.0, (later - timezone.now()).total_seconds()) + 0.05)
    default_engine.tick()  # what beat does: wakes the due timer
    run_until_idle()
    result.refresh()
    assert (result.status, result.return_value) == ("SUCCESSFUL", 2)
    assert result.started_at >= later
    assert tasks.add.get_result(result.id).task.run_after == later


def test_a_quota_per_task_refuses_and_creates_nothing(tmp_path: Any) -> None:
    gate, key = str(tmp_path / "gate"), uuid.uuid4().hex
    admitted = [tasks.gated.enqueue(gate, key, n) for n in range(2)]
    runs = task_runs()

    with pytest.raises(ConcurrencyLimitError) as refused:
        tasks.gated.enqueue(gate, key, 99)

    # The task's path stands for the workflow every task runs as.
    assert (refused.value.workflow, refused.value.key, refused.value.limit) == (
        "tests.django_task_functions.gated",
        f"gated:{key}",
        2,
    )
    assert str(refused.value).startswith("workflow 'tests.django_task_functions.gated' refused")
    assert task_runs() == runs
    tasks.gated.enqueue(gate, uuid.uuid4().hex)  # another key has room
    tasks.gated.enqueue(gate, "free")  # a key function answering None: no quota
    (tmp_path / "gate").touch()
    run_until_idle()
    for result in admitted:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    tasks.gated.enqueue(gate, key, 3)  # the slots freed


def test_a_key_function_that_raises_refuses_the_enqueue() -> None:
    runs = task_runs()
    with pytest.raises(ValueError, match=r"keyed_badly.*LookupError: no tenant"):
        tasks.keyed_badly.enqueue(1)
    assert task_runs() == runs


def test_a_key_function_calling_sys_exit_refuses_the_enqueue() -> None:
    default = settings.TASKS["default"]
    quotas = {
        **default["OPTIONS"]["concurrency"],
        "tests.django_task_functions.keyed_badly": {
            "key_function": "tests.django_task_functions.exiting_key",
            "limit": 2,
        },
    }
    runs = task_runs()
    with (
        override_settings(TASKS={"default": {**default, "OPTIONS": {"concurrency": quotas}}}),
        pytest.raises(ValueError, match=r"keyed_badly.*SystemExit: 4"),
    ):
        tasks.keyed_badly.enqueue(1)
    assert task_runs() == runs


@pytest.mark.skipif(django.VERSION[:2] < (6, 1), reason="@task passes options from 6.1")
def test_a_task_declares_its_own_quota(tmp_path: Any) -> None:
    gate = str(tmp_path / "gate")
    first = tasks.own_quota.enqueue(gate)
    with pytest.raises(ConcurrencyLimitError) as refused:
        tasks.own_quota.enqueue(gate)
    assert (refused.value.key, refused.value.limit) == ("own-quota", 1)
    (tmp_path / "gate").touch()
    run_until_idle()
    first.refresh()
    assert first.return_value == "done"


def test_arguments_must_be_json() -> None:
    runs = task_runs()
    with pytest.raises(UnstorableValueError, match=r"arguments of task 'tests\.django_task_fu"):
        tasks.add.enqueue(object(), 1)
    with pytest.raises(UnstorableValueError, match="keyword arguments"):
        tasks.add.enqueue(1, b={1, 2})
    assert task_runs() == runs


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_a_rolled_back_transaction_leaves_nothing(signals: list[Any]) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert default_engine.get_run(result.id).workflow == WORKFLOW  # in the transaction
        raise Rollback

    assert signals == []
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)
    with transaction.atomic():
        kept = tasks.add.enqueue(1, 2)
        assert signals == []  # sent on commit
    assert signals == [("enqueued", kept.id, "READY")]


def test_get_result_of_an_unknown_id_or_another_run() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("no-such-run")
    default_engine.register("tests.not_a_task", "1", lambda ctx, input: None)
    try:
        other = default_engine.start("tests.not_a_task")
        with pytest.raises(TaskResultDoesNotExist, match="not a task"):
            default_task_backend.get_result(other.run_id)
    finally:
        default_engine.registry.remove("tests.not_a_task")


def test_the_priority_is_kept_on_the_run_and_read_back() -> None:
    result = tasks.add.using(priority=50).enqueue(1, 1)
    assert result.task.priority == 50
    assert default_engine.get_run(result.id).input["priority"] == 50
    assert tasks.add.get_result(result.id).task.priority == 50
    run_until_idle()
    read = tasks.add.get_result(result.id)
    assert (read.status, read.task.priority) == ("SUCCESSFUL", 50)
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100"):
        tasks.add.using(priority=101)


@override_settings(
    TASKS={"default": {"BACKEND": BACKEND_PATH, "QUEUES": ["default", "emails", "reports"]}}
)
def test_a_tasks_queue_is_the_celery_queue_of_its_run() -> None:
    emails = tasks.add.using(queue_name="emails").enqueue(1, 2)
    plain = tasks.add.enqueue(1, 2)

    assert default_engine.get_run(emails.id).queue == "emails"
    # Django's default queue is the workers' own (DURABLE["QUEUE"]).
    assert default_engine.get_run(plain.id).queue == default_engine.config.queue
    assert tasks.add.get_result(emails.id).task.queue_name == "emails"
    with pytest.raises(InvalidTask, match="Queue 'other' is not valid"):
        tasks.add.using(queue_name="other")
    run_until_idle()
    assert tasks.add.get_result(emails.id).return_value == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unknown": 1}, r"TASKS\['x'\]\['OPTIONS'\]: unknown option\(s\) \['unknown'\]"),
        ({"concurrency": []}, r"\['concurrency'\] must be a dict"),
        ({"concurrency": {"send": {}}}, r"keyed by the dotted path.*'send'"),
        (
            {"concurrency": {"app.tasks.send": {"limit": 2}}},
            r"\['concurrency'\]\['app.tasks.send'\]: give one of 'key'",
        ),
        (
            {"concurrency": {"app.tasks.send": {"key": None, "limit": 2}}},
            r"\['app.tasks.send'\]: 'key' must be a str or a callable, not NoneType",
        ),
        (
            {"concurrency": {"app.tasks.send": {"key": "a\x00b", "limit": 2}}},
            r"\['app.tasks.send'\]: concurrency key.*NUL",
        ),
        (
            {"concurrency": {"app.tasks.send": {"key": "k", "limit": "2"}}},
            r"\['app.tasks.send'\]: 'limit' must be an int",
        ),
        (
            {"concurrency": {"app.tasks.send": {"key": "k", "limit": True}}},
            r"'limit' must be an int, not bool",
        ),
        (
            {"concurrency": {"app.tasks.send": {"key_function": "nodots", "limit": 2}}},
            r"'key_function' must be a callable or its dotted path",
        ),
        (
            {"concurrency": {"app.tasks.send": {"key_function": None, "limit": 2}}},
            r"'key_function' must be a callable or its dotted path, not None",
        ),
        (
            {"concurrency": {"app.tasks.send": {"key": "k", "limit": 2, "wait": 5}}},
            r"unknown concurrency option\(s\) \['wait'\]",
        ),
        (
            {
                "concurrency": {
                    "app.tasks.send": {"key": "k", "limit": 2, "count_statuses": ["done"]}
                }
            },
            r"\['app.tasks.send'\]: unknown status",
        ),
    ],
)
def test_bad_options_are_reported_and_refuse_every_task(
    options: dict[str, Any], message: str
) -> None:
    params = {"BACKEND": BACKEND_PATH, "OPTIONS": options}
    backend = DurableTaskBackend("x", params)  # built, as Django's check builds it
    with override_settings(TASKS={"default": DEFAULT_TASKS, "x": params}):
        [error] = check_tasks_backend()
        assert error.id == "durable_django.E006"
        assert re.search(message, error.msg)
        runs = task_runs()
        with pytest.raises(ImproperlyConfigured, match=message):
            tasks.add.using(backend="x").enqueue(1, 2)
        assert task_runs() == runs
    with pytest.raises(ImproperlyConfigured, match=message):
        backend.validate_task(tasks.add)


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ("emails", r"\['QUEUES'\] must be a list of queue names, not str 'emails'"),
        (["default", ""], r"\['QUEUES'\]: each queue name must be a non-empty str, not ''"),
        (["default", 3], r"\['QUEUES'\]: each queue name must be a non-empty str, not 3"),
    ],
)
def test_bad_queues_are_reported(queues: Any, message: str) -> None:
    params = {"BACKEND": BACKEND_PATH, "QUEUES": queues}
    with override_settings(TASKS={"default": DEFAULT_TASKS, "x": params}):
        [error] = check_tasks_backend()
    assert error.id == "durable_django.E006" and re.search(message, error.msg)
    with pytest.raises(ImproperlyConfigured, match=message):
        DurableTaskBackend("x", params).validate_task(tasks.add)


def test_the_check_imports_the_configured_tasks_and_key_functions() -> None:
    backend = DurableTaskBackend(
        "x",
        {
            "OPTIONS": {
                "concurrency": {
                    "tests.django_task_functions.add": {"key": "k", "limit": 1},
                    "tests.django_task_functions.gate_key": {"key": "k", "limit": 1},
                    "tests.django_task_functions.gated": {
                        "key_function": "tests.django_task_functions.missing",
                        "limit": 1,
                    },
                }
            }
        },
    )
    messages = backend.check()
    assert [m.id for m in messages] == ["durable_django.E005", "durable_django.E005"]
    assert "'tests.django_task_functions.gate_key' is not a task" in messages[0].msg
    assert "'tests.django_task_functions.missing' cannot be imported" in messages[1].msg


def test_a_task_not_found_at_its_module_path_is_refused() -> None:
    stray = task(tasks.gate_key)  # tests.django_task_functions.gate_key is not this task
    runs = task_runs()
    with pytest.raises(InvalidTask, match=r"cannot be found at its module path"):
        stray.enqueue("gate", "key")
    assert task_runs() == runs


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_task_is_failed(signals: list[Any]) -> None:
    result = tasks.add.enqueue(1, 1)
    assert default_engine.cancel(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "durable_django.errors.RunFailed"
    assert signals[-1] == ("finished", result.id, "FAILED")


def test_the_async_api_enqueues_and_reads() -> None:
    from asgiref.sync import async_to_sync

    result = async_to_sync(tasks.add.aenqueue)(4, b=5)
    run_until_idle()
    read = async_to_sync(tasks.add.aget_result)(result.id)
    assert (read.status, read.return_value) == ("SUCCESSFUL", 9)


# Django's log line of a failed task ---------------------------------------------------


def task_log_records(caplog: pytest.LogCaptureFixture, result_id: str) -> list[logging.LogRecord]:
    """The records of Django's ``django.tasks`` logger about task ``result_id``."""
    return [
        record
        for record in caplog.records
        if record.name == "django.tasks" and f"id={result_id} " in record.getMessage()
    ]


@pytest.mark.django_db(transaction=True)
def test_djangos_log_line_of_a_failed_task_carries_the_exception(
    signals: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django.tasks")
    failing = tasks.fail.enqueue("no data for March")
    unstorable = tasks.unstorable.enqueue()
    run_until_idle()

    [*_, failed] = task_log_records(caplog, failing.id)
    assert failed.levelno == logging.ERROR and "state=FAILED" in failed.getMessage()
    assert failed.exc_info is not None and failed.exc_info[0] is tasks.ReportFailed
    text = logging.Formatter().format(failed)
    assert "Traceback (most recent call last)" in text
    assert "raise ReportFailed(message)" in text and "ReportFailed: no data for March" in text
    # A return value that is not JSON fails the task as it is handled too.
    [*_, failed] = task_log_records(caplog, unstorable.id)
    assert failed.levelno == logging.ERROR and failed.exc_info is not None
    assert failed.exc_info[0] is UnstorableValueError
    # Sent once each, and what the run recorded is what the signal carried.
    finished = [entry for entry in signals if entry[0] == "finished"]
    assert finished == [("finished", failing.id, "FAILED"), ("finished", unstorable.id, "FAILED")]
    unstorable.refresh()
    [error] = unstorable.errors
    assert error.exception_class_path == "durable_django.errors.UnstorableValueError"
    assert "return value of task 'tests.django_task_functions.unstorable'" in error.traceback


# a task handed on after its worker died ------------------------------------------------


def test_a_task_handed_on_counts_each_worker_that_processed_it() -> None:
    result = tasks.add.enqueue(2, 3)
    store = default_engine.store
    died_at = timezone.now() - datetime.timedelta(minutes=5)
    dead_turn = "deadhost:4242:1:0123abcd"
    # What a worker that died calling the task leaves: the run held under a lease that
    # lapsed since, and its record of starting the task.
    assert store.claim_run(
        result.id,
        lease_owner=dead_turn,
        lease_expires_at=died_at + datetime.timedelta(seconds=30),
        started_at=died_at,
        wake_at=None,
    )
    started = {"at": died_at.isoformat(), "worker": "deadhost:4242", "turn": dead_turn}
    store.record_step(result.id, StepRecord(0, STARTED_STEP, result=started))
    result.refresh()
    assert (result.status, result.worker_ids, result.attempts) == ("RUNNING", ["deadhost:4242"], 1)

    assert default_engine.tick().recovered == 1  # the lapsed lease: handed on
    run_until_idle()
    result.refresh()

    assert (result.status, result.return_value) == ("SUCCESSFUL", 5)
    this_worker = f"{socket.gethostname()}:{os.getpid()}"
    assert result.worker_ids == ["deadhost:4242", this_worker]
    assert result.attempts == 2
    assert result.started_at is not None and result.started_at > died_at
    assert result.last_attempted_at == result.started_at


def test_a_context_task_sees_its_attempt_as_it_runs() -> None:
    result = tasks.whoami.enqueue("me")
    run_until_idle()
    result.refresh()
    assert result.return_value == {"id": result.id, "label": "me", "attempt": 1}


# the task's path where the workflow is shown --------------------------------------------


def test_the_admin_shows_and_filters_task_runs_by_their_task(admin_client: Any) -> None:
    added = tasks.add.enqueue(1, 2)
    doubled = tasks.double.enqueue(2)
    changelist = reverse("admin:durable_django_run_changelist")

    html = admin_client.get(changelist).content.decode()
    assert ">tests.django_task_functions.add</a>" in html
    assert ">tests.django_task_functions.double</a>" in html
    assert "?workflow=tests.django_task_functions.add" in html

    response = admin_client.get(changelist, {"workflow": "tests.django_task_functions.add"})
    listed = re.sub(r"\s+", " ", response.content.decode())
    assert added.id[:8] in listed and doubled.id[:8] not in listed
    assert (
        '<li class="selected"> <a href="?workflow=tests.django_task_functions.add">'
        "tests.django_task_functions.add</a></li>" in listed
    )
    page = admin_client.get(reverse("admin:durable_django_run_change", args=[added.id]))
    assert "tests.django_task_functions.add (django.task)" in page.content.decode()


def test_the_quota_page_and_command_show_a_task_quotas_limit(
    admin_client: Any, tmp_path: Any
) -> None:
    gate, key = str(tmp_path / "gate"), uuid.uuid4().hex
    tasks.gated.enqueue(gate, key)

    html = admin_client.get(reverse("admin:durable_django_run_quotas"), {"key": f"gated:{key}"})
    text = html.content.decode()
    assert '<span class="durable-count">1 / 2</span>' in text
    assert "<td>tests.django_task_functions.gated</td>" in text
    [usage] = durable_json("quota", f"gated:{key}")
    assert (usage["limit"], usage["workflows"]) == (2, ["tests.django_task_functions.gated"])


def test_durable_runs_shows_the_task() -> None:
    result = tasks.add.enqueue(1, 2)
    [line] = [line for line in durable("runs").splitlines() if line.startswith(result.id)]
    assert line.split()[1] == "tests.django_task_functions.add"
