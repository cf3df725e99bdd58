"""``manage.py durable schedules`` and ``durable fire``."""

from __future__ import annotations

import datetime
import io
import json

import pytest
from django.core.management import CommandError, call_command

from durable_django import engine as default_engine
from durable_django.models import Schedule

from ..helpers import durable, durable_json


@pytest.fixture
def reports(db) -> Schedule:
    return Schedule.objects.put(
        "reports",
        workflow="tests.plain",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        input={"kind": "daily"},
        concurrency_key="reports",
        concurrency_limit=1,
    )


def test_schedules_lists_timing_quota_and_next_due(reports):
    Schedule.objects.put("every-minute", workflow="tests.plain", interval_seconds=60)
    out = durable("schedules")
    assert "0 3 * * * (Europe/Paris)" in out and "every 60s" in out
    assert "reports <= 1" in out and "workflow's" in out
    [row] = [s for s in durable_json("schedules") if s["key"] == "reports"]
    assert row["next_due_at"] is not None and row["last_error"] == ""


def test_schedules_shows_the_whole_last_error_on_its_row(reports):
    error = (
        "window 2026-11-30T02:49:00+00:00 skipped: concurrency key 'reports' has 1 active "
        "run(s), limit is 1; and the rest of a long message\non a second line, to its end"
    )
    Schedule.objects.filter(key="reports").update(last_error=error)
    Schedule.objects.put("every-minute", workflow="tests.plain", interval_seconds=60)
    lines = durable("schedules").splitlines()
    [row] = [line for line in lines if line.startswith("reports ")]
    assert row.endswith(error.replace("\n", " "))
    [other] = [line for line in lines if line.startswith("every-minute ")]
    assert other.endswith("  -")


def test_no_schedules(db):
    assert durable("schedules") == "No schedules.\n"


def test_fire_starts_a_run_now_under_the_schedules_quota(reports):
    due_before = Schedule.objects.get(key="reports").next_due_at
    first = durable_json("fire", "reports")
    assert first["run_id"].startswith("sched:reports:now:")
    assert default_engine.get_run(first["run_id"]).input == {"kind": "daily"}
    reports.refresh_from_db()
    assert reports.last_run_id == first["run_id"] and reports.next_due_at == due_before
    # The first run still holds the schedule's one slot.
    with pytest.raises(CommandError, match="concurrency key 'reports' has 1 active") as refused:
        durable("fire", "reports")
    assert refused.value.returncode == 75
    reports.refresh_from_db()
    assert "skipped" in reports.last_error
    # With --json, the refusal on stdout as well.
    out = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("durable", "fire", "reports", "--json", stdout=out)
    assert refused.value.returncode == 75
    assert json.loads(out.getvalue()) == {
        "refused": "quota",
        "workflow": "tests.plain",
        "key": "reports",
        "limit": 1,
        "active": 1,
        "schedule": "reports",
    }


def test_fire_an_unknown_schedule(db):
    with pytest.raises(CommandError, match="no schedule with key 'nope'"):
        durable("fire", "nope")


def test_a_schedule_never_due_in_the_past(reports):
    assert reports.next_due_at > datetime.datetime.now(datetime.UTC)
