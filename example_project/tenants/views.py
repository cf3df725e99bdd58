"""The chat API: start a turn (202, or 429 when the tenant's quota is full), follow a run,
read a tenant's usage. Every call carries the tenant's API key (see ``auth.py``)."""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from durable_django import DEFAULT_CONCURRENCY_STATUSES, engine
from durable_django.http import concurrency_limit_response, run_status_view

from .auth import tenant_for_request, unauthorized
from .models import Tenant
from .workflows import ChatTurnWorkflow

#: The longest chat message accepted.
MAX_MESSAGE_LENGTH = 4000

#: What an ``Idempotency-Key`` header may hold: 1 to 64 letters, digits and ``-_.:``.
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class BadRequest(ValueError):
    """A request the API answers 400, with this message."""


def bad_request(message: str) -> JsonResponse:
    return JsonResponse({"message": message}, status=400)


def authorised_tenant(request: HttpRequest, slug: str) -> Tenant | JsonResponse:
    """The tenant ``slug`` if the request carries its API key; else the answer to give."""
    tenant = tenant_for_request(request)
    if tenant is None:
        return unauthorized()
    if tenant.slug != slug:
        return JsonResponse({"message": f"this API key is not for tenant {slug!r}"}, status=403)
    return tenant


# Token-authenticated, no cookie read: CSRF protection does not apply (see auth.py).
@csrf_exempt
@require_POST
@concurrency_limit_response
def start_turn(request: HttpRequest, slug: str) -> JsonResponse:
    """``POST /tenants/<slug>/turns`` with ``{"message": "..."}``.

    202 ``{"run_id", "status", "created"}`` when the turn is started, 429 (JSON,
    ``Retry-After``) when the tenant already has as many turns in progress as its plan
    allows, 400 for a body that is not a chat message. With an ``Idempotency-Key``
    header, a retried request answers the run the first one started (``created``:
    false) instead of starting another.
    """
    tenant = authorised_tenant(request, slug)
    if isinstance(tenant, JsonResponse):
        return tenant
    try:
        message = chat_message(request.body)
        run_id = idempotent_run_id(tenant, request.headers.get("Idempotency-Key"))
    except BadRequest as error:
        return bad_request(str(error))
    turn = {"tenant": tenant.slug, "message": message}
    try:
        # A full quota raises ConcurrencyLimitError here; the decorator answers 429.
        handle = ChatTurnWorkflow.dispatch(turn, run_id=run_id)
    except (TypeError, ValueError) as error:  # a value the library refuses to store
        return bad_request(f"the message cannot be stored: {error}")
    if handle.created:
        status = "pending"  # what a start creates: no need to read the run back
    else:
        run = engine.get_run(handle.run_id)
        if run.input != turn:
            return JsonResponse(
                {"message": "this Idempotency-Key was used for a different request"},
                status=422,
            )
        status = run.status
    return JsonResponse(
        {"run_id": handle.run_id, "status": status, "created": handle.created},
        status=202,
        headers={"Location": f"/runs/{handle.run_id}"},
    )


def chat_message(body: bytes) -> str:
    """The message of a ``{"message": "..."}`` body, or :class:`BadRequest`.

    Refused: a body that is not UTF-8 JSON, JSON nested too deep to parse, and a message
    that is empty, too long, or holds what the database cannot store (NUL characters,
    lone surrogates such as ``"\\ud800"``).
    """
    try:
        data: Any = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest("the body must be JSON") from None
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, str) or not message.strip():
        raise BadRequest('expected {"message": "<non-empty text>"}')
    if len(message) > MAX_MESSAGE_LENGTH:
        raise BadRequest(f"the message is longer than {MAX_MESSAGE_LENGTH} characters")
    if "\x00" in message:
        raise BadRequest("the message holds a NUL character")
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("the message holds a lone surrogate (not valid Unicode)") from None
    return message


def idempotent_run_id(tenant: Tenant, key: str | None) -> str | None:
    """The run id an ``Idempotency-Key`` stands for, scoped to the tenant so two tenants'
    keys never meet; ``None`` (a random id) without the header."""
    if key is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise BadRequest("Idempotency-Key must be 1 to 64 letters, digits or -_.:")
    return f"turn:{tenant.slug}:{key}"


def is_own_chat_turn(request: HttpRequest, run: Any) -> bool:
    """Access rule of ``GET /runs/<run_id>``: a chat turn of the API key's tenant."""
    tenant = tenant_for_request(request)
    return (
        tenant is not None
        and run.workflow == ChatTurnWorkflow.durable.name
        and isinstance(run.input, dict)
        and run.input.get("tenant") == tenant.slug
    )


#: ``GET /runs/<run_id>``: status, output once completed, ``Retry-After`` while running.
run_detail = run_status_view(is_own_chat_turn)


@require_GET
def tenant_detail(request: HttpRequest, slug: str) -> JsonResponse:
    """``GET /tenants/<slug>``: the tenant's plan and how many of its turns are active."""
    tenant = authorised_tenant(request, slug)
    if isinstance(tenant, JsonResponse):
        return tenant
    return JsonResponse(
        {
            "slug": tenant.slug,
            "name": tenant.name,
            "plan": tenant.plan.name,
            "max_active_turns": tenant.plan.max_active_turns,
            "active_turns": active_turns(tenant),
        }
    )


def active_turns(tenant: Tenant) -> int:
    """How many runs hold a slot of the tenant's quota: the count the quota makes."""
    return engine.count_runs(
        tag=f"concurrency:{tenant.quota_key}", statuses=DEFAULT_CONCURRENCY_STATUSES
    )
