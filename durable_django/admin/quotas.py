"""The quota page of the admin: every quota key holding active runs, its active runs against
its limit, the oldest holder's age and when the next slot likely frees; then every rate
limit key with runs in its window, its units against the limit per window, and when the
next unit frees."""

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
from .._runtime.usage import estimate_for, has_window
from ..engines import default_engine
from ..tasks_backend import shown_usage
from .display import duration_text

if TYPE_CHECKING:
    from .._runtime.estimates import Estimate
    from .._runtime.usage import QuotaUsage, RateUsage


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
    rates = [u for u in default_engine.rate_usage(key) if has_window(u)]
    context = {
        **site.each_context(request),
        "opts": model_admin.model._meta,
        "title": _("Quotas"),
        "subtitle": None,
        "rows": rows,
        "rate_rows": [rate_row(usage, changelist) for usage in rates],
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
    percent = percent_of(usage.active, limit)
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


def rate_row(usage: RateUsage, changelist_url: str) -> dict[str, Any]:
    """What the quota page shows for one rate limit key's window
    (:class:`~durable_django._runtime.usage.RateUsage`)."""
    if usage.retry_after is None:
        next_unit_text = "-"
    elif usage.full:
        next_unit_text = gettext("in %(duration)s") % {"duration": duration_text(usage.retry_after)}
    else:
        next_unit_text = gettext("free now")
    return {
        "key": usage.key,
        "tag": usage.tag,
        "used": usage.used,
        "limit": usage.limit,
        "per": usage.per,
        "per_text": duration_text(usage.per) if usage.per is not None else "-",
        "limit_computed": usage.limit_computed,
        "limit_error": usage.limit_error,
        "full": usage.full,
        "percent": percent_of(usage.used, usage.limit),
        "workflows": usage.workflows,
        "next_unit": usage.retry_after,
        "next_unit_text": next_unit_text,
        "runs_url": f"{changelist_url}?{urlencode({'tag': usage.tag})}",
    }


def percent_of(units: int, limit: int | None) -> int | None:
    """How full a key's bar is, in percent: 100 for a limit of 0 or less, ``None`` when
    the limit is unknown."""
    if limit is None:
        return None
    if limit <= 0:
        return 100
    return min(100, round(units * 100 / limit))


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


__all__ = ["estimate_cells", "quota_page", "quota_row", "rate_row"]
