"""The schedule admin: listing, validated editing, enable/disable/fire actions."""

from __future__ import annotations

import datetime
import re

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from durable_django.models import Schedule

CHANGELIST = "admin:durable_django_schedule_changelist"


@pytest.fixture
def nightly(db) -> Schedule:
    return Schedule.objects.put(
        "nightly",
        workflow="tests.plain",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        concurrency_key="reports",
        concurrency_limit=1,
    )


def form_data(**overrides):
    data = {
        "key": "nightly",
        "workflow": "tests.plain",
        "input": "null",
        "enabled": "on",
        "cron": "0 4 * * *",
        "timezone": "Europe/Paris",
        "interval_seconds": "",
        "concurrency_key": "",
        "concurrency_limit": "",
        "concurrency_statuses": "[]",
    }
    data.update(overrides)
    return data


def test_the_changelist_shows_timing_quota_and_errors(admin_client, nightly):
    Schedule.objects.filter(pk=nightly.pk).update(last_error="window skipped: over the limit")
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "0 3 * * * (Europe/Paris)" in page and "reports ≤ 1" in page
    assert "window skipped: over the limit" in page


def test_the_changelist_shows_times_to_the_second_and_links_the_last_run(admin_client, nightly):
    fired = datetime.datetime(2026, 11, 30, 2, 46, 32, 811790, tzinfo=datetime.UTC)
    run_id = "sched:nightly:2026-11-30T02:46:32.811790+00:00"
    Schedule.objects.filter(pk=nightly.pk).update(
        last_fired_at=fired, last_run_id=run_id, last_error="window skipped: " + "x" * 300
    )
    nightly.refresh_from_db()
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    # Times in the current time zone (UTC in the tests), to the second, never cut.
    assert "<span>2026-11-30</span> <span>02:46:32</span>" in page
    due = nightly.next_due_at
    assert f"<span>{due:%Y-%m-%d}</span> <span>{due:%H:%M:%S}</span>" in page
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", re.sub(r'(title|datetime)="[^"]*"', "", page))
    # The last firing links to its run, the id on hover; the whole error, wrapping.
    run_link = reverse("admin:durable_django_run_change", args=[quote(run_id)])
    assert f'<a href="{run_link}" title="{run_id}"><time' in page
    assert f'<span class="durable-schedule-error">window skipped: {"x" * 300}</span>' in page
    assert ".durable-schedule-error {" in page and ".durable-time span" in page
    # The workflow under the key, and "disabled" for a disabled schedule.
    assert '<div class="durable-meta"><span>tests.plain</span></div>' in page
    Schedule.objects.filter(pk=nightly.pk).update(enabled=False)
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert '<span>tests.plain</span> · <span class="durable-disabled">disabled</span>' in page


def test_anonymous_users_are_sent_to_the_login(client, nightly):
    assert client.get(reverse(CHANGELIST)).status_code == 302


def test_an_edit_is_validated_and_marks_the_schedule_as_the_admins(admin_client, nightly):
    Schedule.objects.filter(pk=nightly.pk).update(source="code")
    url = reverse("admin:durable_django_schedule_change", args=[nightly.pk])
    refused = admin_client.post(url, form_data(cron="0 4 * *"))
    assert refused.status_code == 200 and "invalid cron expression" in refused.content.decode()
    saved = admin_client.post(url, form_data(), follow=True)
    assert "no longer follows its declaration" in saved.content.decode()
    nightly.refresh_from_db()
    assert (nightly.cron, nightly.source) == ("0 4 * * *", "admin")


def test_both_or_neither_timing_is_refused_by_the_form(admin_client, db):
    url = reverse("admin:durable_django_schedule_add")
    page = admin_client.post(url, form_data(interval_seconds="60")).content.decode()
    assert "exactly one of a cron expression and an interval" in page
    assert not Schedule.objects.exists()


def test_actions_disable_enable_and_fire(admin_client, nightly):
    def act(action):
        return admin_client.post(
            reverse(CHANGELIST), {"action": action, "_selected_action": [nightly.pk]}, follow=True
        ).content.decode()

    assert "1 schedule disabled." in act("disable")
    nightly.refresh_from_db()
    assert not nightly.enabled and nightly.next_due_at is None
    assert "1 schedule enabled." in act("enable")
    nightly.refresh_from_db()
    assert nightly.enabled and nightly.next_due_at is not None
    assert "1 schedule fired." in act("fire")
    # The fired run holds the schedule's only slot: the next fire is refused, and says why.
    assert "concurrency key &#x27;reports&#x27; has 1 active run(s)" in act("fire")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "0 0 30 2 *"}, "never fires: no time matches it within 10 years"),
        ({"cron": "", "interval_seconds": "2.5"}, "Enter a whole number."),
        ({"cron": "", "interval_seconds": "2147483648"}, "2147483647"),
        ({"concurrency_key": "k" * 201, "concurrency_limit": "1"}, "at most 200 characters"),
        (
            {"input": '{"text": "a\\u0000b"}'},
            "cannot be stored at $.text: it contains a NUL character",
        ),
    ],
)
def test_the_form_refuses_what_could_never_fire_or_be_stored(admin_client, db, fields, message):
    url = reverse("admin:durable_django_schedule_add")
    page = admin_client.post(url, form_data(**fields)).content.decode()
    assert message in page
    assert not Schedule.objects.exists()
