"""``durable_django.tasks_backend`` on every supported Django: it imports, and on a Django
without ``django.tasks`` (before 6.0) it refuses clearly and the checks warn."""

from __future__ import annotations

import importlib.util

import django
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from durable_django import tasks_backend
from durable_django._rules.task_meta import (
    TASK_WORKFLOW,
    message_priority,
    shown_name,
    task_priority,
)
from durable_django.checks import check_tasks_backend
from durable_django.tasks_backend import BACKEND_PATH, DurableTaskBackend

HAS_TASKS = importlib.util.find_spec("django.tasks") is not None
CONFIGURED = {"default": {"BACKEND": BACKEND_PATH}}


def test_the_module_knows_whether_this_django_has_the_tasks_framework() -> None:
    assert tasks_backend.TASKS_AVAILABLE is HAS_TASKS
    assert (django.VERSION[:2] >= (6, 0)) is HAS_TASKS


@pytest.mark.skipif(HAS_TASKS, reason="this Django has django.tasks")
def test_without_django_tasks_the_backend_refuses_to_be_built() -> None:
    with pytest.raises(ImproperlyConfigured) as refused:
        DurableTaskBackend("default", {"OPTIONS": {}})
    message = str(refused.value)
    assert "needs Django 6.0 or later (django.tasks)" in message
    assert f"this is Django {django.get_version()}" in message
    with pytest.raises(ImproperlyConfigured, match=r"needs Django 6\.0"):
        tasks_backend.DurableTask(func=print)


@pytest.mark.skipif(HAS_TASKS, reason="this Django has django.tasks")
def test_without_django_tasks_a_configured_backend_earns_a_warning() -> None:
    with override_settings(TASKS=CONFIGURED):
        assert tasks_backend.configured_aliases() == ["default"]
        assert tasks_backend.register_configured() is False
        [warning] = check_tasks_backend()
    assert warning.id == "durable_django.W007"
    assert "TASKS['default']" in warning.msg and "needs Django 6.0" in warning.msg
    assert check_tasks_backend() == []


@pytest.mark.skipif(not HAS_TASKS, reason="Django before 6.0 has no tasks framework")
def test_with_django_tasks_there_is_no_warning() -> None:
    with override_settings(TASKS=CONFIGURED):
        assert tasks_backend.configured_aliases() == ["default"]
        assert check_tasks_backend() == []


def test_settings_that_would_refuse_every_task_are_a_check_error() -> None:
    bad = {
        "BACKEND": BACKEND_PATH,
        "OPTIONS": {"concurrency": {"app.tasks.send": {"key": None, "limit": 2}}},
    }
    with override_settings(TASKS={"default": bad}):
        errors = [m for m in check_tasks_backend() if m.id == "durable_django.E006"]
    [error] = errors
    assert error.msg == (
        "TASKS['default']['OPTIONS']['concurrency']['app.tasks.send']: "
        "'key' must be a str or a callable, not NoneType"
    )
    with override_settings(TASKS={"default": {**bad, "QUEUES": "emails"}}):
        [error] = [m for m in check_tasks_backend() if m.id == "durable_django.E006"]
    assert error.msg.startswith("TASKS['default']['QUEUES'] must be a list of queue names")
    quota = {"key": "k", "limit": 0}
    refusing = {"BACKEND": BACKEND_PATH, "OPTIONS": {"concurrency": {"app.tasks.send": quota}}}
    with override_settings(TASKS={"default": refusing}):
        [warning] = [m for m in check_tasks_backend() if m.id == "durable_django.W004"]
    assert warning.msg == (
        "TASKS['default']['OPTIONS']['concurrency']['app.tasks.send'] has limit 0: every "
        "enqueue of the task is refused"
    )
    good = {"BACKEND": BACKEND_PATH, "QUEUES": ["default", "emails"]}
    with override_settings(TASKS={"default": good}):
        assert [m for m in check_tasks_backend() if m.id == "durable_django.E006"] == []


@pytest.mark.parametrize(
    ("priority", "first_largest", "first_smallest"),
    [(-100, 0, 9), (-80, 0, 9), (-79, 1, 8), (0, 4, 5), (1, 5, 4), (80, 8, 1), (100, 9, 0)],
)
def test_a_tasks_priority_as_a_messages(
    priority: int, first_largest: int, first_smallest: int
) -> None:
    assert message_priority(priority) == first_largest
    assert message_priority(priority, lowest_first=True) == first_smallest


def test_a_task_runs_priority_is_read_from_its_input() -> None:
    assert task_priority(TASK_WORKFLOW, {"task": "app.tasks.send", "priority": -30}) == -30
    assert task_priority("orders.ship", {"priority": 5}) is None  # a workflow's run
    assert task_priority(TASK_WORKFLOW, {"priority": True}) is None  # not an int
    assert task_priority(TASK_WORKFLOW, None) is None


def test_a_task_run_is_shown_by_its_tasks_path() -> None:
    assert shown_name(TASK_WORKFLOW, {"task": "app.tasks.send", "args": []}) == "app.tasks.send"
    assert shown_name("orders.ship", {"task": "app.tasks.send"}) == "orders.ship"
    assert shown_name(TASK_WORKFLOW, None) == TASK_WORKFLOW  # an input that names no task


@pytest.mark.django_db
def test_manage_py_check_reports_bad_settings_rather_than_crashing() -> None:
    quota = {"key": None, "limit": 2}
    bad = {"BACKEND": BACKEND_PATH, "OPTIONS": {"concurrency": {"app.tasks.send": quota}}}
    with override_settings(TASKS={"default": bad}), pytest.raises(SystemCheckError) as failed:
        call_command("check")
    assert "durable_django.E006" in str(failed.value)
    assert (
        "TASKS['default']['OPTIONS']['concurrency']['app.tasks.send']: 'key' must be a str or "
        "a callable, not NoneType" in str(failed.value)
    )
