"""Views that raise a quota refusal, for the 429 tests (``tests/surface/test_http.py``)."""

from django.http import HttpResponse
from django.urls import path

from durable_django import Concurrency, ConcurrencyLimitError
from durable_django import engine as default_engine

REFUSAL = ConcurrencyLimitError("chat.turn", "tenant:acme", 8, 8)


def refusing_view(request):
    raise REFUSAL


async def async_refusing_view(request):
    raise REFUSAL


def starting_view(request, key):
    """Starts a run of ``tests.echo`` (limit 3) under ``key``."""
    default_engine.start("tests.echo", {"key": key})
    return HttpResponse("started", status=202)


async def async_starting_view(request, key):
    await default_engine.astart("tests.echo", {"key": key})
    return HttpResponse("started", status=202)


def fair_view(request, key):
    """Starts a run of ``tests.echo`` under a fair quota of limit 1 on ``key``."""
    run = default_engine.start(
        "tests.echo", {"key": key}, concurrency=Concurrency(key=key, limit=1, fair=True)
    )
    return HttpResponse(run.run_id, status=202)


async def async_fair_view(request, key):
    run = await default_engine.astart(
        "tests.echo", {"key": key}, concurrency=Concurrency(key=key, limit=1, fair=True)
    )
    return HttpResponse(run.run_id, status=202)


urlpatterns = [
    path("fair/<str:key>", fair_view),
    path("afair/<str:key>", async_fair_view),
    path("sync", refusing_view),
    path("async", async_refusing_view),
    path("start/<str:key>", starting_view),
    path("astart/<str:key>", async_starting_view),
]
