"""Turning a quota refusal into an HTTP 429 with a ``Retry-After`` header."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from .errors import ConcurrencyLimitError

DEFAULT_MESSAGE = "Busy, retry shortly"
DEFAULT_RETRY_AFTER = 1


def too_many_requests(error: ConcurrencyLimitError) -> JsonResponse:
    """The 429 answer for a refused start.

    The body is ``{"message", "key", "limit", "active"}``; the message and the
    ``Retry-After`` seconds come from ``settings.DURABLE_HTTP_429`` (``MESSAGE``,
    ``RETRY_AFTER``) when set.
    """
    options = getattr(settings, "DURABLE_HTTP_429", {}) or {}
    response = JsonResponse(
        {
            "message": options.get("MESSAGE", DEFAULT_MESSAGE),
            "key": error.key,
            "limit": error.limit,
            "active": error.active,
        },
        status=429,
    )
    response["Retry-After"] = str(options.get("RETRY_AFTER", DEFAULT_RETRY_AFTER))
    return response


def concurrency_limit_response(view: Callable[..., Any]) -> Callable[..., Any]:
    """View decorator: a ``ConcurrencyLimitError`` raised by the view becomes a 429."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            try:
                return await view(request, *args, **kwargs)
            except ConcurrencyLimitError as error:
                return too_many_requests(error)

        return async_wrapper

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return view(request, *args, **kwargs)
        except ConcurrencyLimitError as error:
            return too_many_requests(error)

    return wrapper


class ConcurrencyLimitMiddleware:
    """Middleware: any view raising ``ConcurrencyLimitError`` answers 429 (sync and async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        return await self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """The 429 answer for a refused start; other exceptions go on as they were."""
        if isinstance(exception, ConcurrencyLimitError):
            return too_many_requests(exception)
        return None
