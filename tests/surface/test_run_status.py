"""``durable_django.http.run_status_view``: a client follows its run, and sees only what
the project's access check lets it see."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from django.urls import path

from durable_django import Engine
from durable_django import engine as default_engine
from durable_django.http import run_status, run_status_view
from durable_django.stores import OrmStore
from durable_django.testing import run_until_idle

from ..helpers import force_status


def same_tenant(request, run) -> bool:
    """The suite's access rule: the ``X-Tenant`` header names the run's ``key``."""
    return request.headers.get("X-Tenant") == run.input.get("key")


scoped_engine = Engine(store=OrmStore(), namespace="tenant-a", scope_reads=True, enqueue=False)

urlpatterns = [
    path("runs/<path:run_id>", run_status_view(same_tenant, poll_seconds=3)),
    path("scoped/<path:run_id>", run_status_view(lambda request, run: True, engine=scoped_engine)),
    path("truthy/<path:run_id>", run_status_view(lambda request, run: "yes")),
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


@pytest.fixture
def acme() -> Client:
    return Client(headers={"X-Tenant": "acme"})


def start(key: str = "acme", workflow: str = "tests.echo") -> str:
    return default_engine.start(workflow, {"key": key, "text": "hi"}).run_id


def test_a_pending_run_asks_the_client_to_poll_again(acme):
    run_id = start()
    response = acme.get(f"/runs/{run_id}")
    assert response.status_code == 200
    assert response["Retry-After"] == "3"
    assert response.json() == {
        "run_id": run_id,
        "workflow": "tests.echo",
        "status": "pending",
        "output": None,
        "error": None,
    }


def test_a_completed_run_answers_its_output_and_no_retry_after(acme):
    run_id = start()
    run_until_idle()
    response = acme.get(f"/runs/{run_id}")
    body = response.json()
    assert (body["status"], body["error"]) == ("completed", None)
    assert body["output"] == default_engine.get_run(run_id).output is not None
    assert "Retry-After" not in response


def test_a_failed_run_answers_a_summary_and_never_the_traceback(acme, failing_workflow):
    run_id = start(workflow="tests.boom")
    run_until_idle()
    assert "traceback" in default_engine.get_run(run_id).error  # recorded, not shown
    response = acme.get(f"/runs/{run_id}")
    assert response.json()["error"] == {
        "type": "builtins.RuntimeError",
        "message": "the reply service is down",
    }
    assert b"Traceback" not in response.content and b"File " not in response.content
    assert "Retry-After" not in response


def test_a_cancelled_run(acme):
    run_id = start()
    default_engine.cancel(run_id)
    body = acme.get(f"/runs/{run_id}").json()
    assert (body["status"], body["error"]["type"]) == ("cancelled", "cancelled")


def test_a_running_run_shows_no_output_yet(acme):
    run_id = start()
    force_status(default_engine, run_id, "running", output={"partial": True})
    response = acme.get(f"/runs/{run_id}")
    assert (response.json()["status"], response.json()["output"]) == ("running", None)
    assert response["Retry-After"] == "3"


def test_another_tenants_run_is_the_same_404_as_an_unknown_one(acme):
    globex_run = start("globex")
    refused = acme.get(f"/runs/{globex_run}")
    unknown = acme.get("/runs/nope")
    assert (refused.status_code, unknown.status_code) == (404, 404)
    assert refused.json() == {"message": f"no run {globex_run!r}"}
    assert b"globex" not in refused.content  # nothing of the run itself
    assert Client().get(f"/runs/{globex_run}").status_code == 404  # no tenant at all


def test_an_id_no_run_can_have_is_not_found(acme):
    response = acme.get("/runs/a%00b")  # a NUL, which PostgreSQL refuses in a query
    assert (response.status_code, response.json()) == (404, {"message": "no run 'a\\x00b'"})


def test_only_true_authorises():
    assert Client().get(f"/truthy/{start()}").status_code == 404


def test_a_run_outside_the_engines_namespace_is_not_found():
    outside = start()  # the default engine's namespace
    inside = scoped_engine.start("tests.echo", {"key": "acme"}).run_id
    assert Client().get(f"/scoped/{outside}").status_code == 404
    assert Client().get(f"/scoped/{inside}").json()["status"] == "pending"


def test_child_run_ids_with_a_slash_are_routed(acme):
    run_id = default_engine.start("tests.echo", {"key": "acme"}, "order:1/2").run_id
    assert acme.get(f"/runs/{run_id}").json()["run_id"] == "order:1/2"


def test_only_get_and_head(acme):
    run_id = start()
    assert acme.post(f"/runs/{run_id}").status_code == 405
    assert acme.head(f"/runs/{run_id}").status_code == 200


def test_the_access_check_is_required():
    with pytest.raises(TypeError, match="authorize must be a callable"):
        run_status_view(None)


@override_settings(DURABLE={"ENQUEUE": False})
def test_run_status_is_json_for_every_status():
    run_id = start()
    for status in ("pending", "running", "suspended", "blocked", "completed", "failed"):
        force_status(default_engine, run_id, status, error={"type": "X", "message": "m"})
        data = run_status(default_engine.get_run(run_id))
        assert data["status"] == status
        assert (data["error"] is not None) == (status == "failed")
