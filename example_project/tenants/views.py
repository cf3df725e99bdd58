"""The chat API: start a turn (202, or 429 when the tenant's quota is full), read a run."""

import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from durable_django import DEFAULT_CONCURRENCY_STATUSES, RunNotFound, engine
from durable_django.http import concurrency_limit_response

from .models import Tenant
from .workflows import ChatTurnWorkflow


def _tenant_not_found(slug: str) -> JsonResponse:
    return JsonResponse({"message": f"no tenant {slug!r}"}, status=404)


@csrf_exempt
@require_POST
@concurrency_limit_response
def start_turn(request: HttpRequest, slug: str) -> JsonResponse:
    """``POST /tenants/<slug>/turns`` with ``{"message": "..."}``.

    202 ``{"run_id", "status"}`` when the turn is started; 429 (JSON, ``Retry-After``) when
    the tenant already has as many turns in progress as its plan allows.
    """
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        return _tenant_not_found(slug)
    try:
        body = json.loads(request.body)
    except (UnicodeDecodeError, ValueError):
        return JsonResponse({"message": "the body must be JSON"}, status=400)
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message.strip():
        return JsonResponse({"message": 'expected {"message": "<non-empty text>"}'}, status=400)
    # A full quota raises ConcurrencyLimitError here; the decorator answers 429.
    handle = ChatTurnWorkflow.dispatch({"tenant": tenant.slug, "message": message})
    return JsonResponse(
        {"run_id": handle.run_id, "status": handle.status},
        status=202,
        headers={"Location": f"/runs/{handle.run_id}"},
    )


@require_GET
def run_detail(request: HttpRequest, run_id: str) -> JsonResponse:
    """``GET /runs/<run_id>``: the run's status, and its output once completed."""
    try:
        run = engine.get_run(run_id)
    except RunNotFound:
        return JsonResponse({"message": f"no run {run_id!r}"}, status=404)
    error = run.error
    if isinstance(error, dict):  # keep the traceback out of the API
        error = {"type": error.get("type"), "message": error.get("message")}
    return JsonResponse(
        {
            "run_id": run.run_id,
            "workflow": run.workflow,
            "status": run.status,
            "output": run.output,
            "error": error,
        }
    )


@require_GET
def tenant_detail(request: HttpRequest, slug: str) -> JsonResponse:
    """``GET /tenants/<slug>``: the tenant's plan and how many of its turns are active."""
    tenant = Tenant.objects.select_related("plan").filter(slug=slug).first()
    if tenant is None:
        return _tenant_not_found(slug)
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
