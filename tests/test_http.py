"""Mapping a refusal to HTTP 429, for sync and async views."""

from __future__ import annotations

import json

from asgiref.sync import async_to_sync
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from durable_django.http import (
    ConcurrencyLimitMiddleware,
    concurrency_limit_response,
    too_many_requests,
)

from .http_urls import REFUSAL, async_refusing_view, refusing_view


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
