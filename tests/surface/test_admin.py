"""The admin: the run changelist and change page, the actions and the quota page."""

from __future__ import annotations

import datetime
import re
from html import unescape

import pytest
from django.contrib.admin import site as admin_site
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.contrib.messages.storage.fallback import FallbackStorage
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from durable_django import RunStatus
from durable_django import engine as default_engine
from durable_django.admin.display import duration_text
from durable_django.models import Run, Schedule
from durable_django.testing import run_until_idle

from ..helpers import force_status

CHANGELIST = "admin:durable_django_run_changelist"
QUOTAS = "admin:durable_django_run_quotas"


def change_url(run_id: str) -> str:
    return reverse("admin:durable_django_run_change", args=[quote(run_id)])


def button_url(run_id: str, operation: str) -> str:
    return reverse(f"admin:durable_django_run_{operation}", args=[quote(run_id)])


def start_echo(key: str = "tenant:acme", **input) -> str:
    return default_engine.start("tests.echo", {"key": key, "text": "hi", **input}).run_id


def failed_run(key: str = "tenant:acme") -> str:
    run_id = default_engine.start("tests.boom", {"key": key, "text": "hi"}).run_id
    run_until_idle()
    assert default_engine.get_run(run_id).status == RunStatus.FAILED
    return run_id


def post_action(client, action: str, run_ids: list[str], **extra):
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": run_ids, **extra},
        follow=True,
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# who may see it ------------------------------------------------------------------------


@pytest.fixture
def staff_client(client, django_user_model):
    """A staff user without any permission."""
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    client.user = user
    return client


def grant(user, *codenames: str) -> None:
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="durable_django", codename__in=codenames)
    )


@pytest.mark.parametrize("page", ["changelist", "change", "quotas"])
def test_anonymous_and_non_staff_users_are_sent_to_the_login(db, client, django_user_model, page):
    url = {
        "changelist": lambda: reverse(CHANGELIST),
        "change": lambda: change_url(start_echo()),
        "quotas": lambda: reverse(QUOTAS),
    }[page]()
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))

    user = django_user_model.objects.create_user("visitor", password="pw", is_staff=False)
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))

    # Nor can they run an action.
    run_id = start_echo()
    post_action(client, "cancel_runs", [run_id], post="yes")
    assert default_engine.get_run(run_id).status == RunStatus.PENDING


def test_a_staff_user_needs_the_view_permission(db, staff_client):
    run_id = start_echo()
    for url in (reverse(CHANGELIST), reverse(QUOTAS), change_url(run_id)):
        assert staff_client.get(url).status_code == 403

    grant(staff_client.user, "view_run")
    for url in (reverse(CHANGELIST), reverse(QUOTAS), change_url(run_id)):
        assert staff_client.get(url).status_code == 200


def test_operating_runs_takes_the_change_permission(db, staff_client):
    grant(staff_client.user, "view_run")
    response = staff_client.get(reverse(CHANGELIST))
    assert response.context["action_form"] is None  # no action is offered
    run_id = start_echo()
    response = post_action(staff_client, "cancel_runs", [run_id], post="yes")
    assert default_engine.get_run(run_id).status == RunStatus.PENDING

    grant(staff_client.user, "change_run")
    response = post_action(staff_client, "cancel_runs", [run_id], post="yes")
    assert messages_of(response) == ["Cancelled 1 run."]
    assert default_engine.get_run(run_id).status == RunStatus.CANCELLED


# the changelist and the change page ----------------------------------------------------


def test_the_changelist_lists_runs_with_status_badges_and_tags(admin_client):
    done = default_engine.start("tests.plain", {"n": 1}).run_id
    run_until_idle()
    pending = start_echo()
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    html = response.content.decode()
    assert pending in html and done in html
    assert "durable-status-pending" in html and "durable-status-completed" in html
    assert "concurrency:tenant:acme" in html
    # Read-only: no "add" button; the quota page is one click away.
    assert reverse("admin:durable_django_run_add") not in html
    assert f'href="{reverse(QUOTAS)}"' in html


def test_the_filters(admin_client):
    acme = start_echo("tenant:acme")
    globex = start_echo("tenant:globex")
    plain = default_engine.start("tests.plain", {}, namespace="blue").run_id
    url = reverse(CHANGELIST)

    def listed(**params) -> set[str]:
        response = admin_client.get(url, params)
        assert response.status_code == 200, params
        return {run.pk for run in response.context["cl"].result_list}

    assert listed() == {acme, globex, plain}
    assert listed(status__exact="pending") == {acme, globex, plain}
    assert listed(workflow="tests.plain") == {plain}
    assert listed(namespace="blue") == {plain}
    assert listed(tag="concurrency:tenant:globex") == {globex}
    assert listed(tag="concurrency:tenant:globex", status__in="pending,running") == {globex}
    assert listed(parent_id="nobody") == set()
    year = Run.objects.get(pk=acme).created_at.year
    assert listed(created_at__year=year) == {acme, globex, plain}


def test_search_by_run_id_tag_or_quota_key_without_duplicates(admin_client):
    acme = start_echo("tenant:acme")
    other = start_echo("tenant:globex")
    tagged = default_engine.start("tests.echo", {"key": "tenant:acme"}, tags=["vip", "eu"]).run_id
    url = reverse(CHANGELIST)

    def found(term: str) -> list[str]:
        return [run.pk for run in admin_client.get(url, {"q": term}).context["cl"].result_list]

    assert found(acme) == [acme]
    assert found("vip") == [tagged]
    assert sorted(found("tenant:acme")) == sorted([acme, tagged])
    assert sorted(found("concurrency:tenant:acme")) == sorted([acme, tagged])
    assert found("tenant:nobody") == []
    assert other not in found("tenant:acme")


def test_the_changelist_makes_as_many_queries_for_twenty_runs_as_for_one(admin_client):
    url = reverse(CHANGELIST)
    start_echo("tenant:one", text="first")
    admin_client.get(url)  # warm up the session and the content types

    with CaptureQueriesContext(connection) as one:
        assert admin_client.get(url).status_code == 200
    for n in range(19):
        default_engine.start(
            "tests.echo", {"key": f"tenant:{n}", "text": "x"}, tags=[f"batch-{n}", "load"]
        )
    with CaptureQueriesContext(connection) as twenty:
        response = admin_client.get(url)
    assert len(response.context["cl"].result_list) == 20
    assert len(twenty) == len(one), "\n".join(q["sql"] for q in twenty.captured_queries)


def test_the_change_page_shows_input_output_tags_and_steps(admin_client):
    run_id = default_engine.start(
        "tests.echo", {"key": "tenant:acme", "text": "hello <b>"}, tags=["vip"]
    ).run_id
    run_until_idle()
    response = admin_client.get(change_url(run_id))
    assert response.status_code == 200
    html = response.content.decode()
    assert (
        '<pre class="durable-json">{\n  &quot;echo&quot;: &quot;HELLO &lt;B&gt;&quot;\n}</pre>'
        in html
    )
    assert "&quot;text&quot;: &quot;hello &lt;b&gt;&quot;" in html
    assert "Recorded steps" in html and "shout" in html
    assert "vip" in html and "concurrency:tenant:acme" in html
    # Read-only: nothing to save.
    assert 'name="_save"' not in html
    assert "durable-status-completed" in html


def test_the_change_page_of_a_failed_run_shows_the_error_readably(admin_client, failing_workflow):
    run_id = failed_run()
    html = admin_client.get(change_url(run_id)).content.decode()
    assert "<strong>builtins.RuntimeError</strong>: the reply service is down" in html
    # The whole traceback, in a block that scrolls, durable_django's frames folded: the
    # user's frame (the workflow body, in tests/helpers.py) is shown, not folded.
    error = html[html.index('<div class="durable-traceback">') :]
    error = error[: error.index("</div>")]
    assert error.startswith('<div class="durable-traceback"><pre>Traceback (most recent call')
    folded = re.findall(r'<details class="durable-library-frames"><summary>(.*?)</summary>', error)
    assert folded and all(re.fullmatch(r"\d+ frames? of durable_django hidden", s) for s in folded)
    shown = re.sub(r"<details.*?</details>", "", error, flags=re.S)
    assert "helpers.py&quot;, line" in shown and "in boom" in shown
    assert "durable_django/_runtime/execution/" not in shown
    assert "RuntimeError: the reply service is down" in shown
    # Times to the second, without microseconds.
    run = Run.objects.get(pk=run_id)
    assert (
        f"<span>{run.finished_at:%Y-%m-%d}</span> <span>{run.finished_at:%H:%M:%S}</span>" in html
    )


def run_once(name: str, body) -> str:
    """The id of a run of ``body``, registered as ``name`` for the run's turns only."""
    definition = default_engine.register(name, "1", body)
    try:
        run_id = default_engine.start(name, {}).run_id
        run_until_idle()
    finally:
        default_engine.registry.remove(definition.name)
    return run_id


def positions(html: str, *texts: str) -> list[int]:
    return [html.index(text) for text in texts]


def heading(html: str, text: str) -> int:
    """Where the section headed ``text`` starts in ``html``; -1 for none."""
    found = re.search(rf"<h2[^>]*>\s*{text}\s*</h2>", html)
    return found.start() if found else -1


def test_a_run_page_shows_status_and_error_first_and_the_steps_before_the_later_sections(
    admin_client, failing_workflow
):
    html = admin_client.get(change_url(failed_run())).content.decode()
    first = positions(html, "field-status_display", "field-error_display", "field-id")
    steps = heading(html, "Recorded steps")
    later = [heading(html, "Times"), heading(html, "Tags")]
    assert sorted(first) == first and max(first) < steps < min(later)
    # A failed run waits for nothing and no worker holds it: no such sections.
    assert heading(html, "Waiting") == heading(html, "Worker") == -1

    pending = admin_client.get(change_url(start_echo())).content.decode()
    assert "field-error_display" not in pending and heading(pending, "Waiting") == -1

    sleeping = run_once("tests.admin.sleepy", lambda ctx, input: ctx.sleep(3600))
    html = admin_client.get(change_url(sleeping)).content.decode()
    assert 0 < heading(html, "Recorded steps") < heading(html, "Waiting")


def test_a_child_step_links_to_its_child_and_step_names_wrap_at_their_punctuation(admin_client):
    run_id = run_once("tests.admin.parent", lambda ctx, input: ctx.child("tests.plain", {}))
    html = admin_client.get(change_url(run_id)).content.decode()
    assert f'<a href="{change_url(f"{run_id}/0")}">child run</a>' in html
    assert "durable.<wbr>child:<wbr>tests.<wbr>plain" in html


def test_the_run_list_shows_short_ids_times_to_the_second_and_durations(admin_client):
    done = default_engine.start("tests.plain", {"n": 1}).run_id
    run_until_idle()
    pending = start_echo()
    retried = default_engine.start("tests.plain", {}, run_id="a-short-id").run_id
    html = admin_client.get(reverse(CHANGELIST)).content.decode()

    # Long ids cut to 8 characters, whole on hover and in the link; short ones whole.
    assert f'<span class="durable-run-id" title="{pending}">{pending[:8]}…</span>' in html
    assert f'href="{change_url(pending)}"' in html
    assert f'<span class="durable-run-id" title="{retried}">{retried}</span>' in html
    # Created to the second; no microseconds anywhere in the list.
    created = Run.objects.get(pk=pending).created_at
    assert f"<span>{created:%Y-%m-%d}</span> <span>{created:%H:%M:%S}</span>" in html
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", re.sub(r'(title|datetime)="[^"]*"', "", html))
    # Duration: how long a finished run took; for how long an active one has been going.
    run = Run.objects.get(pk=done)
    took = duration_text((run.finished_at - run.created_at).total_seconds())
    assert re.fullmatch(r"\d+ ms|\d\.\d s", took)
    assert f'<span class="durable-duration">{took}</span>' in html
    assert html.count('<span class="durable-duration">waiting for</span>') == 2
    # Version and namespace under the workflow.
    assert (
        '<div class="durable-meta" title="version 1, namespace default"><span>v1</span> · '
        "<span>default</span></div>" in html
    )


def test_the_page_of_a_run_with_an_unusual_id(admin_client):
    run_id = default_engine.start("tests.plain", {}, run_id="order/42_x").run_id
    response = admin_client.get(change_url(run_id))
    assert response.status_code == 200
    assert f'href="{button_url(run_id, "cancel")}"' in response.content.decode()
    response = admin_client.post(button_url(run_id, "cancel"), follow=True)
    assert messages_of(response) == ["Cancelled 1 run."]
    assert default_engine.get_run(run_id).status == RunStatus.CANCELLED


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (0, "0 ms"),
        (0.0384, "38 ms"),
        (1.44, "1.4 s"),
        (12.9, "12 s"),
        (192, "3 min 12 s"),
        (7500, "2 h 5 min"),
        (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"),
    ],
)
def test_durations_for_people(seconds, shown):
    assert duration_text(seconds) == shown


# the Cancel and Retry buttons of a run's page ------------------------------------------


def buttons_of(response) -> list[str]:
    """The operations a run's page offers: Cancel (a link to its confirmation), Retry (a form)."""
    return re.findall(r'class="durable-(cancel|retry)">', response.content.decode())


def test_a_run_page_offers_cancel_while_active_and_retry_once_failed(
    admin_client, failing_workflow
):
    active = start_echo()
    failed = failed_run("tenant:other")
    done = default_engine.start("tests.plain", {}).run_id
    run_until_idle()
    active = start_echo()
    assert buttons_of(admin_client.get(change_url(active))) == ["cancel"]
    assert buttons_of(admin_client.get(change_url(failed))) == ["retry"]
    assert buttons_of(admin_client.get(change_url(done))) == []
    html = admin_client.get(change_url(active)).content.decode()
    assert f'<a href="{button_url(active, "cancel")}" class="durable-cancel">' in html
    html = admin_client.get(change_url(failed)).content.decode()
    form = html[html.index(f'<form method="post" action="{button_url(failed, "retry")}">') :]
    assert 'name="csrfmiddlewaretoken"' in form[: form.index("</form>")]


def test_the_cancel_button_asks_to_confirm_as_delete_does(admin_client):
    run_id = start_echo()
    response = admin_client.get(button_url(run_id, "cancel"))
    html = response.content.decode()
    assert response.status_code == 200 and "Are you sure you want to cancel 1 active run?" in html
    assert "<title>Cancel this run?" in html
    assert '<form method="post">' in html and 'name="post" value="yes"' in html
    assert 'name="action"' not in html  # posts back to the button's own URL
    assert default_engine.get_run(run_id).status == RunStatus.PENDING

    response = admin_client.post(button_url(run_id, "cancel"), {"post": "yes"}, follow=True)
    assert response.redirect_chain == [(change_url(run_id), 302)]
    assert messages_of(response) == ["Cancelled 1 run."]
    assert default_engine.get_run(run_id).status == RunStatus.CANCELLED
    assert admin_client.get(button_url("no-such-run", "cancel")).status_code == 404


def test_the_cancel_button_cancels_through_the_engine(admin_client):
    run_id = start_echo()
    response = admin_client.post(button_url(run_id, "cancel"), follow=True)
    assert response.redirect_chain == [(change_url(run_id), 302)]
    assert messages_of(response) == ["Cancelled 1 run."]
    assert default_engine.get_run(run_id).status == RunStatus.CANCELLED
    assert LogEntry.objects.get(object_id=run_id).change_message == "Cancelled."
    assert buttons_of(response) == []
    # Again: refused, and said why.
    response = admin_client.post(button_url(run_id, "cancel"), follow=True)
    assert messages_of(response) == [f"{run_id}: already cancelled"]


def test_the_retry_button_retries_under_the_quota(admin_client, failing_workflow):
    run_id = failed_run("tenant:busy")
    for _ in range(3):
        start_echo("tenant:busy")
    response = admin_client.post(button_url(run_id, "retry"), follow=True)
    assert messages_of(response) == [
        f"{run_id}: refused by the quota: key tenant:busy has 3 active run(s), limit 3"
    ]
    assert default_engine.get_run(run_id).status == RunStatus.FAILED

    response = admin_client.post(button_url(failed_run("tenant:free"), "retry"), follow=True)
    assert messages_of(response) == ["Retried 1 run: it is pending again as a new attempt."]
    assert buttons_of(response) == ["cancel"]


def test_a_retry_whose_limit_function_fails_says_so(admin_client, failing_workflow):
    from durable_django import Concurrency

    run_id = failed_run("tenant:gone")
    definition = default_engine.register(
        "tests.boom",
        "2",
        lambda ctx, input: None,
        concurrency=Concurrency(key=lambda input: input["key"], limit={}.__getitem__),
    )
    try:
        Run.objects.filter(pk=run_id).update(version="0")  # a version no longer registered
        response = admin_client.post(button_url(run_id, "retry"), follow=True)
        also = post_action(admin_client, "retry_runs", [run_id])
    finally:
        default_engine.registry.remove(definition.name)
    why = (
        f"{run_id}: workflow 'tests.boom': the concurrency limit function raised KeyError "
        "for key 'tenant:gone': 'tenant:gone'"
    )
    assert messages_of(response) == messages_of(also) == [why]
    assert default_engine.get_run(run_id).status == RunStatus.FAILED


def test_the_buttons_take_a_post_with_csrf_and_the_change_permission(db, staff_client):
    run_id = start_echo()
    grant(staff_client.user, "view_run")
    assert buttons_of(staff_client.get(change_url(run_id))) == []
    assert staff_client.post(button_url(run_id, "cancel")).status_code == 403
    assert staff_client.get(button_url(run_id, "cancel")).status_code == 403
    assert default_engine.get_run(run_id).status == RunStatus.PENDING

    grant(staff_client.user, "change_run")
    assert buttons_of(staff_client.get(change_url(run_id))) == ["cancel"]
    assert staff_client.get(button_url(run_id, "retry")).status_code == 405
    csrf_checked = Client(enforce_csrf_checks=True)
    csrf_checked.force_login(staff_client.user)
    assert csrf_checked.post(button_url(run_id, "cancel")).status_code == 403
    assert default_engine.get_run(run_id).status == RunStatus.PENDING
    assert staff_client.post(button_url("no-such-run", "cancel")).status_code == 404

    assert staff_client.post(button_url(run_id, "cancel")).status_code == 302
    assert default_engine.get_run(run_id).status == RunStatus.CANCELLED


# links to runs --------------------------------------------------------------------------

#: Ids the admin's URLs must quote: a slash (as in a child's default id) and its own escape.
AWKWARD_IDS = ("export/acme_2F1", "export_2Facme/1")


@pytest.mark.parametrize("parent_id", AWKWARD_IDS)
def test_links_to_runs_with_awkward_ids_open_those_runs(admin_client, parent_id):
    parent = default_engine.start("tests.plain", {}, run_id=parent_id)
    # A decoy at the id a wrong unquoting would lead to.
    default_engine.start("tests.plain", {}, run_id=parent_id.replace("_2F", "/"))
    child_id = f"{parent_id}/2"
    default_engine.start_child(default_engine.get_run(parent.run_id), "tests.plain", {}, child_id)

    def opened(url: str) -> str:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        return response.context["original"].pk

    def link_in(html: str, text: str) -> str:
        # A link whose text is the id, or the run list's short id with the id on hover, or
        # a link with the id on hover (a schedule's last firing).
        quoted = re.escape(text)
        shown = rf'(?:>{quoted}|><span class="durable-run-id" title="{quoted}">| title="{quoted}">)'
        [href] = re.findall(rf'<a href="([^"]+)"{shown}', html)
        return unescape(href)

    child_page = admin_client.get(change_url(child_id))
    assert child_page.context["original"].pk == child_id
    assert opened(link_in(child_page.content.decode(), parent_id)) == parent_id

    Schedule.objects.create(
        key="s", workflow="tests.plain", interval_seconds=60, last_run_id=child_id
    )
    schedules = admin_client.get(reverse("admin:durable_django_schedule_changelist"))
    assert opened(link_in(schedules.content.decode(), child_id)) == child_id

    # The changelist's own links and its filter on a parent find the same runs.
    listed = admin_client.get(reverse(CHANGELIST), {"parent_id": parent_id})
    assert [run.pk for run in listed.context["cl"].result_list] == [child_id]
    assert opened(link_in(listed.content.decode(), child_id)) == child_id


# actions -------------------------------------------------------------------------------


def test_cancel_goes_through_the_engine_and_names_runs_already_ended(
    admin_client, django_capture_on_commit_callbacks
):
    received = []
    from durable_django.signals import run_finished

    def on_finished(sender, run_id, status, **kwargs):
        received.append((run_id, status))

    run_finished.connect(on_finished)
    try:
        first, second = start_echo(), start_echo()
        done = default_engine.start("tests.plain", {}).run_id
        run_until_idle()
        third = start_echo()
        # run_finished is sent once the cancel commits.
        with django_capture_on_commit_callbacks(execute=True):
            response = post_action(
                admin_client, "cancel_runs", [first, second, third, done], post="yes"
            )
    finally:
        run_finished.disconnect(on_finished)
    assert response.status_code == 200
    # The runs started before run_until_idle completed; the one started after it is pending.
    cancelled, refused = messages_of(response)
    assert cancelled == "Cancelled 1 run."
    names, why = refused.split(": ")
    assert (set(names.split(", ")), why) == ({first, second, done}, "already completed")
    assert default_engine.get_run(third).status == RunStatus.CANCELLED
    assert (third, "cancelled") in received


def test_cancelling_asks_to_confirm_first(admin_client):
    done = default_engine.start("tests.plain", {}).run_id
    run_until_idle()
    pending = start_echo()
    response = post_action(admin_client, "cancel_runs", [pending, done])
    html = response.content.decode()
    assert response.status_code == 200 and "Are you sure you want to cancel 1 active run?" in html
    assert f'href="{change_url(pending)}"' in html and "already ended: left as it is" in html
    assert default_engine.get_run(pending).status == RunStatus.PENDING  # nothing cancelled yet
    assert 'name="post" value="yes"' in html and 'value="cancel_runs"' in html
    assert sorted(re.findall(r'name="_selected_action" value="([^"]+)"', html)) == sorted(
        [pending, done]
    )

    response = post_action(admin_client, "cancel_runs", [pending, done], post="yes")
    assert messages_of(response)[0] == "Cancelled 1 run."
    assert default_engine.get_run(pending).status == RunStatus.CANCELLED


def test_cancel_frees_the_slot(admin_client):
    runs = [start_echo() for _ in range(3)]
    with pytest.raises(Exception, match="limit is 3"):
        start_echo()
    response = post_action(admin_client, "cancel_runs", runs, post="yes")
    assert messages_of(response) == ["Cancelled 3 runs."]
    assert default_engine.count_runs(tag="concurrency:tenant:acme", statuses=["pending"]) == 0
    start_echo()
    # Each cancel is in the run's admin history, with who did it.
    entries = LogEntry.objects.filter(object_id__in=runs)
    assert sorted(e.change_message for e in entries) == ["Cancelled."] * 3
    assert {e.user.username for e in entries} == {"admin"}


def test_retry_starts_a_failed_run_again(admin_client, failing_workflow):
    run_id = failed_run()
    done = default_engine.start("tests.plain", {}).run_id
    run_until_idle()
    response = post_action(admin_client, "retry_runs", [run_id, done])
    assert messages_of(response) == [
        "Retried 1 run: it is pending again as a new attempt.",
        f"{done}: only failed runs can be retried; it is completed",
    ]
    run = default_engine.get_run(run_id)
    assert (run.status, run.attempt) == (RunStatus.PENDING, 2)
    assert LogEntry.objects.get(object_id=run_id).change_message == "Retried as attempt 2."


def test_a_retry_refused_by_the_quota_says_so(admin_client, failing_workflow):
    run_id = failed_run("tenant:busy")
    for _ in range(3):
        start_echo("tenant:busy")
    response = post_action(admin_client, "retry_runs", [run_id])
    assert messages_of(response) == [
        f"{run_id}: refused by the quota: key tenant:busy has 3 active run(s), limit 3"
    ]
    assert default_engine.get_run(run_id).status == RunStatus.FAILED


def test_only_finished_runs_may_be_deleted(admin_client):
    done = default_engine.start("tests.plain", {}).run_id
    run_until_idle()
    active = start_echo()

    response = post_action(admin_client, "delete_selected", [active, done])
    assert messages_of(response) == [
        f"Nothing deleted: 1 selected run is still active ({active}); cancel it first."
    ]
    assert Run.objects.filter(pk__in=[active, done]).count() == 2
    assert (
        admin_client.get(reverse("admin:durable_django_run_delete", args=[active])).status_code
        == 403
    )

    response = post_action(admin_client, "delete_selected", [done], post="yes")
    assert messages_of(response) == ["Successfully deleted 1 run."]
    assert not Run.objects.filter(pk=done).exists()


def parent_and_child(parent_status: str) -> tuple[str, str]:
    """A run in ``parent_status`` and its finished child ``<parent>/1``."""
    parent = default_engine.start("tests.plain", {}).run_id
    child = default_engine.start_child(
        default_engine.get_run(parent), "tests.plain", {}, f"{parent}/1"
    ).run_id
    force_status(default_engine, child, RunStatus.COMPLETED)
    force_status(default_engine, parent, parent_status)
    return parent, child


def test_a_child_of_an_active_run_is_not_deleted_and_the_admin_says_why(admin_client):
    parent, child = parent_and_child(RunStatus.SUSPENDED)
    grandchild = default_engine.start_child(
        default_engine.get_run(child), "tests.plain", {}, f"{child}/1"
    ).run_id
    force_status(default_engine, grandchild, RunStatus.FAILED)
    done = default_engine.start("tests.plain", {}).run_id
    run_until_idle()

    response = post_action(admin_client, "delete_selected", [child, grandchild, done], post="yes")
    assert messages_of(response) == [
        f"Nothing deleted: 2 selected runs ({child}, {grandchild}) are below run {parent}, "
        "which is still suspended and may still read their outcomes; delete them once that "
        "run has finished."
    ]
    assert Run.objects.filter(pk__in=[child, grandchild, done]).count() == 3

    # Its own delete page refuses too, and sends back to the run's page with the reason.
    for method in (admin_client.get, admin_client.post):
        response = method(
            reverse("admin:durable_django_run_delete", args=[quote(child)]),
            {"post": "yes"},
            follow=True,
        )
        assert response.redirect_chain[-1][0] == change_url(child)
        assert messages_of(response) == [
            f"Nothing deleted: run {child} is below run {parent}, which is still suspended "
            "and may still read its outcome; delete it once that run has finished."
        ]
    assert Run.objects.filter(pk=child).exists()

    # Once the parent has finished, the whole family may go.
    force_status(default_engine, parent, RunStatus.COMPLETED)
    response = post_action(admin_client, "delete_selected", [child, grandchild], post="yes")
    assert messages_of(response) == ["Successfully deleted 2 runs."]
    admin_client.post(reverse("admin:durable_django_run_delete", args=[parent]), {"post": "yes"})
    assert not Run.objects.filter(pk__in=[parent, child, grandchild]).exists()


def test_the_admin_deletes_through_the_store_which_checks_again(admin_client):
    """A parent that becomes active between the confirmation page and the deletion (a retry
    meanwhile) keeps its child: the store checks again under locks."""
    parent, child = parent_and_child(RunStatus.FAILED)
    confirmed = Run.objects.filter(pk=child)  # what the confirmation page showed
    force_status(default_engine, parent, RunStatus.PENDING)  # a retry, meanwhile
    request = RequestFactory().post("/")
    request.session = {}
    request._messages = FallbackStorage(request)
    admin_site._registry[Run].delete_queryset(request, confirmed)
    assert Run.objects.filter(pk=child).exists()
    assert [str(m) for m in request._messages] == [
        f"1 run was not deleted: it, or a run above it, became active meanwhile ({child})."
    ]


# the quota page ------------------------------------------------------------------------


def test_the_quota_page_shows_a_full_bar_for_a_key_at_its_limit(admin_client):
    for _ in range(3):
        start_echo("tenant:acme")
    start_echo("tenant:globex")
    default_engine.start("tests.plain", {}, concurrency={"key": "adhoc", "limit": 5})

    response = admin_client.get(reverse(QUOTAS))
    assert response.status_code == 200
    rows = {row["key"]: row for row in response.context["rows"]}
    oldest_age = rows["tenant:acme"].pop("oldest_age")
    assert 0 <= oldest_age < 60
    assert rows["tenant:acme"].pop("oldest_age_text").endswith(("ms", "s"))
    # No run of the key has finished yet: nothing to estimate the next slot from.
    assert rows["tenant:acme"].pop("next_slot") is None
    assert rows["tenant:acme"].pop("next_slot_text") == "unknown (no history)"
    assert rows["tenant:acme"] == {
        "key": "tenant:acme",
        "tag": "concurrency:tenant:acme",
        "active": 3,
        "limit": 3,
        "limit_in_force": 3,
        "override": None,
        "limit_computed": False,
        "limit_error": None,
        "full": True,
        "percent": 100,
        "workflows": ("tests.echo",),
        "runs_url": reverse(CHANGELIST)
        + "?tag=concurrency%3Atenant%3Aacme&status__in=pending%2Crunning%2Csuspended%2Cblocked",
    }
    assert (rows["tenant:globex"]["percent"], rows["tenant:globex"]["full"]) == (33, False)
    # A per-start quota's limit is not known here: just the count.
    assert (rows["adhoc"]["limit"], rows["adhoc"]["percent"]) == (None, None)

    html = response.content.decode()
    assert 'class="durable-bar full"' in html
    assert 'data-key="tenant:acme" data-percent="100"' in html
    assert "3 / 3 full" in html
    assert "1 active, limit unknown" in html

    # The link lists the runs holding the key's slots.
    listed = admin_client.get(rows["tenant:acme"]["runs_url"]).context["cl"].result_list
    assert len(listed) == 3


def test_the_quota_page_shows_the_oldest_holder_and_the_next_slot(admin_client):
    now = timezone.now()
    for _ in range(4):
        run_id = start_echo("tenant:acme")
        force_status(
            default_engine,
            run_id,
            RunStatus.COMPLETED,
            created_at=now - datetime.timedelta(seconds=100),
            finished_at=now - datetime.timedelta(seconds=40),
        )
    for age in (50, 20, 5):
        run_id = start_echo("tenant:acme")
        force_status(
            default_engine,
            run_id,
            RunStatus.RUNNING,
            created_at=now - datetime.timedelta(seconds=age),
        )
    start_echo("tenant:globex")  # not full: a slot is free

    response = admin_client.get(reverse(QUOTAS))
    rows = {row["key"]: row for row in response.context["rows"]}
    acme = rows["tenant:acme"]
    assert 50 <= acme["oldest_age"] < 55
    assert acme["oldest_age_text"].startswith("5")  # 50 s and a little
    assert 5 < acme["next_slot"] <= 10  # 60 s runs, the oldest 50 s old
    assert acme["next_slot_text"].startswith("in about ")
    assert "from 4 finished runs, typically 1 min 0 s" in acme["next_slot_text"]
    assert rows["tenant:globex"]["next_slot_text"] == "free now"

    html = response.content.decode()
    assert f'data-seconds="{acme["next_slot"]}"' in html
    assert "from 4 finished runs, typically 1 min 0 s" in html
    assert "free now" in html
    assert "Oldest holder" in html and "Next slot" in html


def test_the_quota_page_for_one_key(admin_client):
    start_echo("tenant:acme")
    start_echo("tenant:globex")
    response = admin_client.get(reverse(QUOTAS), {"key": "tenant:globex"})
    assert [row["key"] for row in response.context["rows"]] == ["tenant:globex"]


def test_the_quota_page_with_nothing_active(admin_client):
    response = admin_client.get(reverse(QUOTAS))
    assert response.status_code == 200
    assert "No quota key holds active runs." in response.content.decode()


def test_the_quota_page_for_an_idle_key_shows_its_declared_limit(admin_client):
    run_id = start_echo("tenant:quiet")
    default_engine.cancel(run_id)
    response = admin_client.get(reverse(QUOTAS), {"key": "tenant:quiet"})
    (row,) = response.context["rows"]
    assert (row["active"], row["limit"], row["workflows"]) == (0, 3, ("tests.echo",))
    assert "0 / 3" in response.content.decode()


def test_the_quota_page_shows_a_limit_computed_per_key_or_its_failure(admin_client):
    from durable_django import Concurrency

    plans = {"tenant:acme": 2, "tenant:globex": 5}
    definition = default_engine.register(
        "tests.planned",
        "1",
        lambda ctx, input: None,
        concurrency=Concurrency(key=lambda input: input["key"], limit=lambda key: plans[key]),
    )
    try:
        default_engine.start("tests.planned", {"key": "tenant:acme"})
        default_engine.start("tests.planned", {"key": "tenant:globex"})
        del plans["tenant:globex"]  # the tenant left: its limit function now raises
        response = admin_client.get(reverse(QUOTAS))
    finally:
        default_engine.registry.remove(definition.name)
    assert response.status_code == 200
    rows = {row["key"]: row for row in response.context["rows"]}
    assert (rows["tenant:acme"]["limit"], rows["tenant:acme"]["limit_computed"]) == (2, True)
    assert (rows["tenant:globex"]["limit"], rows["tenant:globex"]["limit_error"]) == (
        None,
        "KeyError: 'tenant:globex'",
    )
    html = response.content.decode()
    assert '1 / 2</span>\n              <span class="durable-limit-note">computed per key' in html
    assert "limit function failed: KeyError: &#x27;tenant:globex&#x27;" in html


def test_the_quota_page_shows_the_rate_limit_windows(admin_client):
    from durable_django import RateLimit

    definition = default_engine.register(
        "tests.rated",
        "1",
        lambda ctx, input: None,
        rate_limit=RateLimit(key=lambda input: input["key"], limit=2, per=3600),
    )
    try:
        for _ in range(2):
            done = default_engine.start("tests.rated", {"key": "tenant:acme"}).run_id
            force_status(default_engine, done, RunStatus.COMPLETED)  # still in the window
        default_engine.start("tests.rated", {"key": "tenant:globex"})
        default_engine.start("tests.plain", {}, rate_limit={"key": "adhoc", "limit": 9, "per": 60})
        response = admin_client.get(reverse(QUOTAS))
        one = admin_client.get(reverse(QUOTAS), {"key": "tenant:globex"})
        idle = admin_client.get(reverse(QUOTAS), {"key": "tenant:nobody"})
    finally:
        default_engine.registry.remove(definition.name)
    assert response.status_code == 200
    rows = {row["key"]: row for row in response.context["rate_rows"]}
    acme = rows["tenant:acme"]
    assert 3590 < acme.pop("next_unit") <= 3600  # the oldest of the two leaves in an hour
    assert acme.pop("next_unit_text").startswith("in ")
    assert acme == {
        "key": "tenant:acme",
        "tag": "rate:tenant:acme",
        "used": 2,
        "limit": 2,
        "limit_in_force": 2,
        "override": None,
        "per": 3600.0,
        "per_text": "1 h 0 min",
        "limit_computed": False,
        "limit_error": None,
        "full": True,
        "percent": 100,
        "workflows": ("tests.rated",),
        "runs_url": reverse(CHANGELIST) + "?tag=rate%3Atenant%3Aacme",
    }
    globex = rows["tenant:globex"]
    assert (globex["percent"], globex["next_unit"], globex["next_unit_text"]) == (
        50,
        0.0,
        "free now",
    )
    assert (rows["adhoc"]["limit"], rows["adhoc"]["percent"], rows["adhoc"]["next_unit_text"]) == (
        None,
        None,
        "-",
    )
    assert list(rows) == ["tenant:acme", "adhoc", "tenant:globex"]  # busiest first

    html = response.content.decode()
    assert "Rate limits" in html
    assert 'data-rate-key="tenant:acme" data-percent="100"' in html
    assert "2 / 2 full" in html and "1 used, limit unknown" in html
    # The link lists the key's runs, finished ones too.
    listed = admin_client.get(acme["runs_url"]).context["cl"].result_list
    assert len(listed) == 2
    assert [row["key"] for row in one.context["rate_rows"]] == ["tenant:globex"]
    assert idle.context["rate_rows"] == [] and "Rate limits" not in idle.content.decode()


# tracebacks ----------------------------------------------------------------------------

RECORDED_ELSEWHERE = """\
Traceback (most recent call last):
  File "/venv/lib/site-packages/durable_django/_runtime/execution/context.py", line 226, in step
    value = _outside_body(fn, *args, **kwargs)
            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/site-packages/durable_django/_runtime/execution/context.py", line 401, in call
    return fn(*args, **kwargs)
  File "/home/runner/work/durable_django/durable_django/tests/billing.py", line 12, in charge
    raise KeyError(card)
KeyError: 'card'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "C:\\app\\Lib\\durable_django\\engines.py", line 5, in execute
    run()
  File "/srv/app/billing/workflows.py", line 30, in run
    ctx.step("charge", charge)
RuntimeError: payment failed
"""


def test_library_frames_are_folded_wherever_the_traceback_was_recorded():
    from durable_django.admin.tracebacks import sections, traceback_block

    found = [(s.library, s.frames, s.lines[0]) for s in sections(RECORDED_ELSEWHERE)]
    assert found == [
        (False, 0, "Traceback (most recent call last):"),
        (
            True,
            2,
            '  File "/venv/lib/site-packages/durable_django/_runtime/execution/context.py"'
            ", line 226, in step",
        ),
        # A project checked out in a durable_django directory is the user's code.
        (
            False,
            1,
            '  File "/home/runner/work/durable_django/durable_django/tests/billing.py"'
            ", line 12, in charge",
        ),
        (True, 1, '  File "C:\\app\\Lib\\durable_django\\engines.py", line 5, in execute'),
        (False, 1, '  File "/srv/app/billing/workflows.py", line 30, in run'),
    ]
    assert "\n".join(line for s in sections(RECORDED_ELSEWHERE) for line in s.lines) == (
        RECORDED_ELSEWHERE.rstrip("\n")
    )
    html = traceback_block(RECORDED_ELSEWHERE)
    assert html.count("<summary>2 frames of durable_django hidden</summary>") == 1
    assert html.count("<summary>1 frame of durable_django hidden</summary>") == 1
    assert "KeyError: &#x27;card&#x27;\n\nThe above exception was the direct cause" in html
