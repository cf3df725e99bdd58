"""The quota page of the admin: every quota key holding active runs, its active runs against
its limit, the oldest holder's age and when the next slot likely frees."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .._rules.concurrency import DEFAULT_CONCURRENCY_STATUSES
from .._runtime import estimates
from .._runtime.usage import estimate_for
from ..engines import default_engine
from ..tasks_backend import shown_usage
from .display import duration_text

if TYPE_CHECKING:
    from .._runtime.estimates import Estimate
    from .._runtime.usage import QuotaUsage


class QuotaPageAdmin(Protocol):
    """What the quota page needs of the run admin that serves it."""

    admin_site: Any
    model: Any
    quota_template: str

    def has_view_or_change_permission(self, request: HttpRequest) -> bool: ...

    def _urlname(self, view: str) -> str: ...


def quota_page(model_admin: QuotaPageAdmin, request: HttpRequest) -> HttpResponse:
    """Every quota key holding active runs (or the one asked for with ``?key=``), its
    active runs against the limit its workflows declare, and a link to those runs."""
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    key = request.GET.get("key", "").strip() or None
    site = model_admin.admin_site
    changelist = reverse(model_admin._urlname("changelist"), current_app=site.name)
    shown = [shown_usage(default_engine, usage) for usage in default_engine.quota_usage(key)]
    rows = [quota_row(usage, changelist, estimate_for(default_engine, usage)) for usage in shown]
    context = {
        **site.each_context(request),
        "opts": model_admin.model._meta,
        "title": _("Quotas"),
        "subtitle": None,
        "rows": rows,
        "key": key or "",
        "statuses": ", ".join(DEFAULT_CONCURRENCY_STATUSES),
        "changelist_url": changelist,
    }
    request.current_app = site.name
    return TemplateResponse(request, model_admin.quota_template, context)


def quota_row(
    usage: QuotaUsage, changelist_url: str, estimate: Estimate | None = None
) -> dict[str, Any]:
    """What the quota page shows for one :class:`~durable_django._runtime.usage.QuotaUsage`, with
    its :func:`~durable_django._runtime.usage.estimate_for` estimate when given."""
    limit = usage.limit
    if limit is None:
        percent = None
    elif limit <= 0:
        percent = 100
    else:
        percent = min(100, round(usage.active * 100 / limit))
    query = urlencode({"tag": usage.tag, "status__in": ",".join(DEFAULT_CONCURRENCY_STATUSES)})
    return {
        "key": usage.key,
        "tag": usage.tag,
        "active": usage.active,
        "limit": limit,
        "limit_computed": usage.limit_computed,
        "limit_error": usage.limit_error,
        "full": usage.full,
        "percent": percent,
        "workflows": usage.workflows,
        "runs_url": f"{changelist_url}?{query}",
        **estimate_cells(usage, estimate),
    }


def estimate_cells(usage: QuotaUsage, estimate: Estimate | None) -> dict[str, Any]:
    """The oldest holder's age and the next slot's estimate, as the quota page shows them."""
    if estimate is None:
        return {
            "oldest_age": None,
            "oldest_age_text": "-",
            "next_slot": None,
            "next_slot_text": "-",
        }
    oldest = estimate.oldest_age
    cells: dict[str, Any] = {
        "oldest_age": oldest,
        "oldest_age_text": duration_text(oldest) if oldest is not None else "-",
    }
    if usage.limit is not None and not usage.full:
        return {**cells, "next_slot": None, "next_slot_text": gettext("free now")}
    if estimate.basis != estimates.HISTORY:
        text = gettext("unknown (%(basis)s)") % {"basis": estimate.basis}
        return {**cells, "next_slot": None, "next_slot_text": text}
    text = gettext("in about %(duration)s (from %(samples)d finished runs, typically %(typical)s)")
    return {
        **cells,
        "next_slot": estimate.seconds,
        "next_slot_text": text
        % {
            "duration": duration_text(estimate.seconds),
            "samples": estimate.samples,
            "typical": duration_text(estimate.typical or 0),
        },
    }


__all__ = ["estimate_cells", "quota_page", "quota_row"]
