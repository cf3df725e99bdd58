"""The example site's URLs for ``benchmarks.http_load``, with ``POST
/tenants/<slug>/plain``: what a view would do without durable_django, the same
authentication and body, a row inserted and a Celery task's ``.delay()``."""

from __future__ import annotations

import uuid

from celery import shared_task
from chatsite.urls import urlpatterns as site_urls
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from tenants.models import Message
from tenants.views import BadRequest, authorised_tenant, bad_request, chat_message


@shared_task(name="bench.http_plain", ignore_result=True)
def plain_task(message_id: int) -> None:  # never executed here
    return None


@csrf_exempt
@require_POST
def plain_turn(request: HttpRequest, slug: str) -> JsonResponse:
    tenant = authorised_tenant(request, slug)
    if isinstance(tenant, JsonResponse):
        return tenant
    try:
        message = chat_message(request.body)
    except BadRequest as error:
        return bad_request(str(error))
    row = Message.objects.create(tenant=tenant, run_id=uuid.uuid4().hex, prompt=message, reply="")
    plain_task.delay(row.id)
    return JsonResponse({"id": row.id}, status=202)


urlpatterns = [*site_urls, path("tenants/<slug:slug>/plain", plain_turn)]
