"""HTTP helpers: a quota refusal as a 429 with a ``Retry-After`` header (and, under a fair
quota, a ``Durable-Ticket`` the client presents on its retry), and a JSON view that tells
a client how its run is doing."""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_safe

from ._rules.tickets import HEADER as TICKET_HEADER
from ._rules.tickets import presenting
from ._runtime.estimates import HISTORY
from .engines import default_engine
from .errors import ConcurrencyLimitError, RateLimitError, RunNotFound
from .status import TERMINAL_STATUSES
from .stores.base import RunRecord

DEFAULT_MESSAGE = "Busy, retry shortly"
#: The ``Retry-After`` seconds when nothing better is known (the error's own default).
DEFAULT_RETRY_AFTER = 1


def too_many_requests(error: ConcurrencyLimitError) -> JsonResponse:
    """The 429 answer for a refused start.

    The body is ``{"message", "key", "limit", "active", "retry_after"}`` and the
    ``Retry-After`` header the same seconds, rounded up to a whole number: the error's
    ``retry_after``, estimated from the key's history (a rate limit's is exact, and
    ``RETRY_AFTER`` never replaces it). When the error has no estimate
    from history (the key has none yet, or it could not be read), ``RETRY_AFTER`` of
    ``settings.DURABLE_HTTP_429`` is used when set. The message is its ``MESSAGE``.

    Under a fair quota the body also has ``"ticket"`` and ``"held"`` (units held for
    older tickets), and the ``Durable-Ticket`` header the ticket: a client retrying
    with that header, through :class:`ConcurrencyLimitMiddleware` or
    :func:`concurrency_limit_response`, keeps its place in the key's line.
    """
    options = getattr(settings, "DURABLE_HTTP_429", {}) or {}
    seconds = retry_after_seconds(error, options)
    body: dict[str, Any] = {
        "message": options.get("MESSAGE", DEFAULT_MESSAGE),
        "key": error.key,
        "limit": error.limit,
        "active": error.active,
        "retry_after": seconds,
    }
    ticket = getattr(error, "ticket", None)
    if ticket is not None:
        body["ticket"] = ticket
        body["held"] = error.held
    response = JsonResponse(body, status=429)
    response["Retry-After"] = str(seconds)
    if ticket is not None:
        response[TICKET_HEADER] = ticket
    return response


def retry_after_seconds(error: ConcurrencyLimitError, options: dict[str, Any]) -> int:
    """Whole seconds to wait (at least 1): the error's estimate rounded up, or the
    configured ``RETRY_AFTER`` when the estimate has no history behind it; a rate limit's
    exact ``retry_after`` rounded up."""
    estimate = getattr(error, "estimate", None)
    if isinstance(error, RateLimitError):
        return max(1, math.ceil(error.retry_after))
    if "RETRY_AFTER" in options and getattr(estimate, "basis", None) != HISTORY:
        return max(1, math.ceil(float(options["RETRY_AFTER"])))
    return max(1, math.ceil(error.retry_after))


def request_ticket(request: HttpRequest) -> str | None:
    """The ticket a request presents: its ``Durable-Ticket`` header, or ``None``."""
    return request.headers.get(TICKET_HEADER) or None


_Request = TypeVar("_Request", bound=HttpRequest)
_P = ParamSpec("_P")
_R = TypeVar("_R")


@overload
def concurrency_limit_response(
    view: Callable[Concatenate[_Request, _P], Awaitable[_R]],
) -> Callable[Concatenate[_Request, _P], Coroutine[Any, Any, _R | JsonResponse]]: ...


@overload
def concurrency_limit_response(
    view: Callable[Concatenate[_Request, _P], _R],
) -> Callable[Concatenate[_Request, _P], _R | JsonResponse]: ...


def concurrency_limit_response(
    view: Callable[Concatenate[_Request, _P], Any],
) -> Callable[Concatenate[_Request, _P], Any]:
    """View decorator: a ``ConcurrencyLimitError`` raised by the view becomes a 429, and
    the starts the view makes present the request's ticket (:func:`request_ticket`).

    The view keeps its type: its parameters, and its response (or, for an ``async def``
    view, what it awaits to), or the 429's :class:`~django.http.JsonResponse`."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(request: _Request, /, *args: _P.args, **kwargs: _P.kwargs) -> Any:
            try:
                with presenting(request_ticket(request)):
                    return await view(request, *args, **kwargs)
            except ConcurrencyLimitError as error:
                return too_many_requests(error)

        return async_wrapper

    @functools.wraps(view)
    def wrapper(request: _Request, /, *args: _P.args, **kwargs: _P.kwargs) -> Any:
        try:
            with presenting(request_ticket(request)):
                return view(request, *args, **kwargs)
        except ConcurrencyLimitError as error:
            return too_many_requests(error)

    return wrapper


class ConcurrencyLimitMiddleware:
    """Middleware: any view raising ``ConcurrencyLimitError`` answers 429 (sync and
    async), and the starts a view makes present the request's ticket
    (:func:`request_ticket`)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        with presenting(request_ticket(request)):
            return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        with presenting(request_ticket(request)):
            return await self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """The 429 answer for a refused start; other exceptions go on as they were."""
        if isinstance(exception, ConcurrencyLimitError):
            return too_many_requests(exception)
        return None


# Following a run ---------------------------------------------------------------------------

#: Seconds a client is asked to wait before polling a run that has not ended again.
DEFAULT_POLL_SECONDS = 1


def run_status(run: RunRecord) -> dict[str, Any]:
    """What a client may see of a run: ``run_id``, ``workflow``, ``status``, ``output``
    (once completed, else ``None``) and ``error`` (for a failed or cancelled run its
    ``{"type", "message"}``, never the traceback; else ``None``)."""
    error = None
    if run.status in ("failed", "cancelled") and isinstance(run.error, dict):
        error = {"type": run.error.get("type"), "message": run.error.get("message")}
    return {
        "run_id": run.run_id,
        "workflow": run.workflow,
        "status": run.status,
        "output": run.output if run.status == "completed" else None,
        "error": error,
    }


def run_status_response(
    run: RunRecord, *, poll_seconds: int = DEFAULT_POLL_SECONDS
) -> JsonResponse:
    """200 with :func:`run_status`; while the run has not ended, a ``Retry-After`` header
    telling the client when to ask again."""
    response = JsonResponse(run_status(run))
    if run.status not in TERMINAL_STATUSES:
        response["Retry-After"] = str(poll_seconds)
    return response


def run_not_found(run_id: str) -> JsonResponse:
    """The 404 for a run the client may not see, whether it exists or not."""
    return JsonResponse({"message": f"no run {run_id!r}"}, status=404)


def run_status_view(
    authorize: Callable[[HttpRequest, RunRecord], bool],
    *,
    engine: Any = None,
    poll_seconds: int = DEFAULT_POLL_SECONDS,
) -> Callable[..., HttpResponse]:
    """A ``GET`` view ``(request, run_id)`` answering :func:`run_status_response`.

    A run id is not a secret, so the view has no default access rule: ``authorize(request,
    run)`` is the project's own check (the run's tenant is the request's, say) and must
    return ``True`` for the run to be shown. A run it refuses, an unknown run and a run
    outside the engine's namespace (``SCOPE_READS``) all answer the same 404, so a client
    learns nothing about runs it may not see. ``engine`` defaults to the default engine.
    """
    if not callable(authorize):
        raise TypeError(
            f"authorize must be a callable (request, run) -> bool, not {type(authorize).__name__}"
        )

    @require_safe
    def view(request: HttpRequest, run_id: str) -> HttpResponse:
        if "\x00" in run_id:  # no run has one, and PostgreSQL refuses it in a query
            return run_not_found(run_id)
        try:
            run = (engine or default_engine).get_run(run_id)
        except (RunNotFound, ValueError, TypeError):
            return run_not_found(run_id)
        if authorize(request, run) is not True:
            return run_not_found(run_id)
        return run_status_response(run, poll_seconds=poll_seconds)

    return view
