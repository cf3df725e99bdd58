"""Views that raise a quota refusal, for the 429 tests (``tests/test_http.py``)."""

from django.urls import path

from durable_django import ConcurrencyLimitError

REFUSAL = ConcurrencyLimitError("chat.turn", "tenant:acme", 8, 8)


def refusing_view(request):
    raise REFUSAL


async def async_refusing_view(request):
    raise REFUSAL


urlpatterns = [path("sync", refusing_view), path("async", async_refusing_view)]
