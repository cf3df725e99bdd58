"""Mapping a refusal to HTTP 429, for sync and async views."""

from __future__ import annotations

import datetime
import json

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpResponse
from django.test import RequestFactory, override_settings
from django.utils import timezone

from durable_django import ConcurrencyLimitError, RunStatus
from durable_django import engine as default_engine
from durable_django.http import (
    ConcurrencyLimitMiddleware,
    concurrency_limit_response,
    too_many_requests,
)

from ..helpers import force_status
from ..http_urls import REFUSAL, async_refusing_view, refusing_view


def check_429(response):
    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content) == {
        "message": "Busy, retry shortly",
        "key": "tenant:acme",
        "limit": 8,
        "active": 8,
        "retry_after": 1,
    }


def test_the_decorator_on_a_sync_view():
    request = RequestFactory().post("/")
    check_429(concurrency_limit_response(refusing_view)(request))
    ok = concurrency_limit_response(lambda request: HttpResponse("ok"))
    assert ok(request).status_code == 200


def test_the_decorator_on_an_async_view():
    view = concurrency_limit_response(async_refusing_view)
    check_429(async_to_sync(view)(RequestFactory().post("/")))


def test_the_middleware_turns_the_error_into_a_429():
    middleware = ConcurrencyLimitMiddleware(lambda request: HttpResponse("ok"))
    request = RequestFactory().post("/")
    assert middleware(request).status_code == 200
    check_429(middleware.process_exception(request, REFUSAL))
    assert middleware.process_exception(request, ValueError()) is None


def test_the_middleware_through_the_handler_for_sync_and_async_views(client, async_client):
    with override_settings(
        ROOT_URLCONF="tests.http_urls",
        MIDDLEWARE=["durable_django.http.ConcurrencyLimitMiddleware"],
    ):
        check_429(client.get("/sync"))
        check_429(async_to_sync(async_client.get)("/async"))


@override_settings(DURABLE_HTTP_429={"MESSAGE": "Too many turns", "RETRY_AFTER": 5})
def test_the_message_and_retry_after_are_configurable():
    response = too_many_requests(REFUSAL)
    assert response["Retry-After"] == "5"
    assert json.loads(response.content)["message"] == "Too many turns"


def test_retry_after_is_the_estimate_rounded_up():
    estimated = ConcurrencyLimitError("chat.turn", "tenant:acme", 8, 8, retry_after=2.3)
    response = too_many_requests(estimated)
    assert response["Retry-After"] == "3"
    assert json.loads(response.content)["retry_after"] == 3


def full_key_with_history(key: str, duration: float, ages: tuple[float, ...]) -> None:
    """``tests.echo`` runs (limit 3) of ``key``: a few finished after ``duration`` seconds,
    and three holding it, created ``ages`` seconds ago."""
    now = timezone.now()
    for _ in range(3):
        run_id = default_engine.start("tests.echo", {"key": key}).run_id
        force_status(
            default_engine,
            run_id,
            RunStatus.COMPLETED,
            created_at=now - datetime.timedelta(seconds=duration + 60),
            finished_at=now - datetime.timedelta(seconds=60),
        )
    for age in ages:
        run_id = default_engine.start("tests.echo", {"key": key}).run_id
        force_status(
            default_engine,
            run_id,
            RunStatus.RUNNING,
            created_at=now - datetime.timedelta(seconds=age),
        )


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/start/tenant:acme", "/astart/tenant:acme"])
def test_a_refused_start_answers_its_estimate(client, async_client, path):
    full_key_with_history("tenant:acme", 30, (5, 10, 25.5))
    with override_settings(
        ROOT_URLCONF="tests.http_urls",
        MIDDLEWARE=["durable_django.http.ConcurrencyLimitMiddleware"],
        DURABLE_HTTP_429={"RETRY_AFTER": 9},  # the estimate wins over it
    ):
        if path.startswith("/astart"):
            response = async_to_sync(async_client.get)(path)
        else:
            response = client.get(path)
    assert response.status_code == 429
    assert response["Retry-After"] == "5"  # 30 s - 25.5 s, rounded up
    assert json.loads(response.content) == {
        "message": "Busy, retry shortly",
        "key": "tenant:acme",
        "limit": 3,
        "active": 3,
        "retry_after": 5,
    }
    assert default_engine.count_runs(tag="concurrency:tenant:acme") == 6  # nothing created


@pytest.mark.django_db
def test_without_history_the_configured_retry_after_is_used(client):
    for _ in range(3):
        default_engine.start("tests.echo", {"key": "tenant:new"})
    with override_settings(
        ROOT_URLCONF="tests.http_urls",
        MIDDLEWARE=["durable_django.http.ConcurrencyLimitMiddleware"],
    ):
        response = client.get("/start/tenant:new")
        assert (response.status_code, response["Retry-After"]) == (429, "1")
        with override_settings(DURABLE_HTTP_429={"RETRY_AFTER": 7}):
            response = client.get("/start/tenant:new")
    assert (response.status_code, response["Retry-After"]) == (429, "7")
    assert json.loads(response.content)["retry_after"] == 7
