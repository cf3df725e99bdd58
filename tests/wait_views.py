"""Views starting a run with ``wait=``, for the tests of waiting inside a request's
transaction (``tests/runtime/test_wait.py``): ``ATOMIC_REQUESTS`` on, the view does not write
``atomic()`` itself."""

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path

from durable_django import ConcurrencyLimitError
from durable_django import engine as default_engine

#: How long the views wait for a slot, in seconds; a correct run never gets near it.
WAIT = 30.0


def waiting_view(request: HttpRequest, key: str) -> HttpResponse:
    """Starts a run of ``tests.echo`` under ``key`` (limit 1), waiting ``?wait=`` seconds
    for a slot (by default :data:`WAIT`); 429 when none freed."""
    wait = float(request.GET.get("wait", WAIT))
    try:
        run = default_engine.start(
            "tests.echo", {"key": key}, concurrency={"key": key, "limit": 1}, wait=wait
        )
    except ConcurrencyLimitError as error:
        return HttpResponse(error.key, status=429)
    return HttpResponse(run.run_id, status=201)


@transaction.non_atomic_requests
def waiting_view_outside(request: HttpRequest, key: str) -> HttpResponse:
    """:func:`waiting_view` outside the request's transaction."""
    return waiting_view(request, key)


urlpatterns = [
    path("wait/<str:key>/", waiting_view),
    path("wait-outside/<str:key>/", waiting_view_outside),
]
