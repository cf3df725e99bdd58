"""The admin's quota page and operators' overrides: each key's override shown (limit,
until, paused), set, paused and cleared through a POST form with CSRF by a user with the
change permission on runs, each change written to the admin's log; bad input shows the
form's error and stores nothing."""

from __future__ import annotations

import datetime

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from durable_django import engine as default_engine
from durable_django.models import QuotaOverride

QUOTAS = "admin:durable_django_run_quotas"
OVERRIDE = "admin:durable_django_run_quota_override"


def start_echo(key: str = "tenant:acme") -> str:
    return default_engine.start("tests.echo", {"key": key, "text": "hi"}).run_id


def post(client, **data):
    return client.post(reverse(OVERRIDE), {"kind": "concurrency", **data}, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def entries() -> list[tuple[int, str, str]]:
    """The admin log's entries of overrides, oldest first: flag, object, message."""
    found = LogEntry.objects.filter(content_type=ContentType.objects.get_for_model(QuotaOverride))
    return [(e.action_flag, e.object_repr, e.change_message) for e in found.order_by("pk")]


@pytest.fixture
def viewer(client, django_user_model):
    """A staff user who may view runs, not change them."""
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="durable_django", codename="view_run")
    )
    client.force_login(user)
    return client


def test_set_pause_and_clear_are_logged_and_shown(admin_client, admin_user):
    for _ in range(2):
        start_echo("tenant:acme")
    until = timezone.now().replace(microsecond=0) + datetime.timedelta(days=1)
    shown_until = timezone.localtime(until)
    response = post(
        admin_client,
        key="tenant:acme",
        action="set",
        limit="2",
        until=shown_until.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    assert response.redirect_chain == [(reverse(QUOTAS), 302)]
    text = f"Set limit of tenant:acme to 2 until {shown_until.isoformat()}."
    assert messages_of(response) == [text]
    (override,) = default_engine.overrides()
    assert (override.key, override.limit, override.until) == ("tenant:acme", 2, until)
    (row,) = response.context["rows"]
    assert (row["limit"], row["limit_in_force"], row["full"], row["percent"]) == (3, 2, True, 100)
    assert row["override"] == {
        "limit": 2,
        "until": until,
        "paused": False,
        "changed_at": override.changed_at,
    }
    html = response.content.decode()
    assert 'data-override-kind="concurrency" data-override-limit="2"' in html
    assert "2 / 2 full" in html and "limit 2" in html and "declared 3" in html

    entry = LogEntry.objects.get(action_flag=ADDITION)
    assert (entry.user, entry.change_message) == (admin_user, text)
    assert entry.object_id == str(QuotaOverride.objects.get().pk)

    response = post(admin_client, key="tenant:acme", action="pause", shown="tenant:acme")
    assert response.redirect_chain == [(reverse(QUOTAS) + "?key=tenant%3Aacme", 302)]
    assert messages_of(response) == ["Paused tenant:acme."]
    (row,) = response.context["rows"]
    assert (row["override"]["paused"], row["next_slot_text"]) == (True, "paused")
    assert 'class="durable-override paused"' in response.content.decode()

    response = post(admin_client, key="tenant:acme", action="clear")
    assert messages_of(response) == [
        "Cleared the override of tenant:acme: its declared limit applies."
    ]
    assert default_engine.overrides() == []
    assert QuotaOverride.objects.count() == 0
    (row,) = response.context["rows"]
    assert (row["override"], row["limit_in_force"], row["full"]) == (None, 3, False)
    repr_ = "concurrency:tenant:acme = 2"
    assert entries() == [
        (ADDITION, repr_, text),
        (CHANGE, "concurrency:tenant:acme = 0", "Paused tenant:acme."),
        (
            DELETION,
            "concurrency:tenant:acme = 0",
            "Cleared the override of tenant:acme: its declared limit applies.",
        ),
    ]
    # Clearing again: nothing to clear, nothing logged.
    response = post(admin_client, key="tenant:acme", action="clear")
    assert messages_of(response) == ["tenant:acme had no override: nothing cleared."]
    assert len(entries()) == 3


def test_a_paused_idle_key_and_a_rate_key_are_shown(admin_client):
    post(admin_client, key="tenant:quiet", action="pause")
    response = post(admin_client, kind="rate", key="calls:acme", action="set", limit="7")
    assert messages_of(response) == ["Set limit of rate key calls:acme to 7."]
    (row,) = response.context["rows"]
    assert (row["key"], row["active"], row["limit_in_force"], row["full"]) == (
        "tenant:quiet",
        0,
        0,
        True,
    )
    (rate,) = response.context["rate_rows"]
    assert (rate["key"], rate["used"], rate["limit_in_force"]) == ("calls:acme", 0, 7)
    assert rate["override"]["limit"] == 7
    html = response.content.decode()
    assert 'data-override-kind="rate" data-override-limit="7"' in html
    assert [(o.kind, o.key) for o in default_engine.overrides()] == [
        ("concurrency", "tenant:quiet"),
        ("rate", "calls:acme"),
    ]
    post(admin_client, kind="rate", key="calls:acme", action="clear")
    assert [o.key for o in default_engine.overrides()] == ["tenant:quiet"]
    assert [flag for flag, _, _ in entries()] == [ADDITION, ADDITION, DELETION]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"key": "tenant:acme", "action": "set"}, "Give the limit to set (0 pauses the key)."),
        ({"key": "tenant:acme", "action": "set", "limit": "-1"}, "greater than or equal to 0"),
        ({"key": "tenant:acme", "action": "set", "limit": "x"}, "Enter a whole number."),
        ({"key": "", "action": "pause"}, "This field is required."),
        ({"key": "k" * 300, "action": "pause"}, "concurrency key"),
        ({"key": "tenant:acme", "action": "sleep"}, "Select a valid choice."),
        ({"key": "tenant:acme", "action": "pause", "kind": "other"}, "Select a valid choice."),
        (
            {"key": "tenant:acme", "action": "pause", "until": "2000-01-01T00:00"},
            "is not in the future",
        ),
        ({"key": "tenant:acme", "action": "pause", "until": "someday"}, "Enter a valid date/time."),
        (
            {"key": "tenant:acme", "action": "clear", "until": "2999-01-01T00:00"},
            "Clearing an override takes no end time.",
        ),
    ],
)
def test_bad_input_shows_the_error_and_stores_nothing(admin_client, data, error):
    start_echo()
    response = admin_client.post(reverse(OVERRIDE), {"kind": "concurrency", **data})
    assert response.status_code == 200
    form = response.context["override_form"]
    assert any(error in message for messages in form.errors.values() for message in messages)
    assert error.replace("'", "&#x27;") in response.content.decode()
    assert response.context["rows"][0]["key"] == "tenant:acme"  # the page, with the error
    assert default_engine.overrides() == []
    assert entries() == []


def test_a_user_who_may_only_view_runs_sees_overrides_but_cannot_change_them(viewer):
    default_engine.set_limit("tenant:acme", 0)
    response = viewer.get(reverse(QUOTAS))
    assert response.status_code == 200
    assert response.context["can_override"] is False
    assert response.context["override_form"] is None
    (row,) = response.context["rows"]
    assert row["override"]["paused"] is True
    html = response.content.decode()
    assert "paused" in html
    assert reverse(OVERRIDE) not in html  # no form, no button
    response = viewer.post(
        reverse(OVERRIDE), {"kind": "concurrency", "key": "tenant:acme", "action": "clear"}
    )
    assert response.status_code == 403
    assert [o.limit for o in default_engine.overrides()] == [0]
    assert entries() == []


def test_a_user_with_the_change_permission_may_change_them(viewer, django_user_model):
    user = django_user_model.objects.get(username="viewer")
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="durable_django", codename="change_run")
    )
    page = viewer.get(reverse(QUOTAS))
    assert page.context["can_override"] is True
    assert reverse(OVERRIDE) in page.content.decode()
    response = post(viewer, key="tenant:acme", action="pause")
    assert messages_of(response) == ["Paused tenant:acme."]
    ((flag, _, message),) = entries()
    assert (flag, message) == (ADDITION, "Paused tenant:acme.")
    assert LogEntry.objects.get().user == user


def test_the_form_takes_a_post_with_its_csrf_token_only(db, admin_user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.get(reverse(OVERRIDE)).status_code == 405
    data = {"kind": "concurrency", "key": "tenant:acme", "action": "pause"}
    assert client.post(reverse(OVERRIDE), data).status_code == 403  # no token
    assert default_engine.overrides() == []
    page = client.get(reverse(QUOTAS))
    token = page.context["csrf_token"]
    assert 'name="csrfmiddlewaretoken"' in page.content.decode()
    response = client.post(reverse(OVERRIDE), {**data, "csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302
    assert [o.limit for o in default_engine.overrides()] == [0]
