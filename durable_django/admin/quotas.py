"""The quota page of the admin: every quota key holding active runs or overridden, its
active runs against its limit (the operator's override in force, else the declared one),
the oldest holder's age and when the next slot likely frees; then every rate limit key
with runs in its window or overridden, its units against the limit per window, and when
the next unit frees. A user who may operate runs sets, pauses and clears overrides from
it, each change written to the admin's log."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .._core.limits import MAX_LIMIT
from .._rules.concurrency import DEFAULT_CONCURRENCY_STATUSES
from .._rules.overrides import Kind, Override, checked, override_tag, scope_of
from .._runtime import estimates
from .._runtime.usage import estimate_for, has_window
from ..engines import default_engine
from ..models import QuotaOverride
from ..stores.orm import OrmStore
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

    def has_operate_permission(self, request: HttpRequest) -> bool: ...

    def _urlname(self, view: str) -> str: ...


class OverrideForm(forms.Form):
    """Set (``limit``), pause or clear the override of one concurrency or rate key, until
    ``until`` (for good when empty)."""

    kind = forms.ChoiceField(
        label=_("Kind"),
        choices=[("concurrency", _("concurrency key")), ("rate", _("rate limit key"))],
    )
    key = forms.CharField(label=_("Key"), strip=True)
    action = forms.ChoiceField(
        label=_("Action"),
        choices=[("set", _("set limit")), ("pause", _("pause")), ("clear", _("clear"))],
    )
    limit = forms.IntegerField(label=_("Limit"), min_value=0, max_value=MAX_LIMIT, required=False)
    until = forms.DateTimeField(
        label=_("Until"),
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text=_("Empty: until it is cleared."),
    )
    #: The key the page showed (``?key=``), to go back to it.
    shown = forms.CharField(required=False, widget=forms.HiddenInput)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        action, limit, until = data["action"], data.get("limit"), data.get("until")
        if action == "set" and limit is None:
            self.add_error("limit", gettext("Give the limit to set (0 pauses the key)."))
            return data
        if action == "clear" and until is not None:
            self.add_error("until", gettext("Clearing an override takes no end time."))
            return data
        if action != "clear":
            limit = 0 if action == "pause" else limit
            try:
                checked(data["key"], data["kind"], limit, until, timezone.now())
            except (TypeError, ValueError) as error:
                self.add_error(None, str(error))
            data["limit"] = limit
        return data


def quota_page(
    model_admin: QuotaPageAdmin, request: HttpRequest, form: OverrideForm | None = None
) -> HttpResponse:
    """Every quota key holding active runs or overridden (or the one asked for with
    ``?key=``), its active runs against its limit in force, and a link to those runs;
    with the override form (``form``: one whose errors are shown) for a user who may
    operate runs."""
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    key = request.GET.get("key", "").strip() or None
    site = model_admin.admin_site
    changelist = reverse(model_admin._urlname("changelist"), current_app=site.name)
    shown = [shown_usage(default_engine, usage) for usage in default_engine.quota_usage(key)]
    rows = [quota_row(usage, changelist, estimate_for(default_engine, usage)) for usage in shown]
    rates = [u for u in default_engine.rate_usage(key) if has_window(u)]
    can_override = model_admin.has_operate_permission(request)
    if form is None and can_override:
        form = OverrideForm(initial={"key": key or "", "shown": key or "", "action": "set"})
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
        "can_override": can_override,
        "override_form": form,
        "override_url": reverse(model_admin._urlname("quota_override"), current_app=site.name),
    }
    request.current_app = site.name
    return TemplateResponse(request, model_admin.quota_template, context)


def override_change(model_admin: QuotaPageAdmin, request: HttpRequest) -> HttpResponse:
    """The override form's POST: set, pause or clear one key's override through the
    engine, log it and go back to the quota page with a message; the page with the
    form's errors (nothing stored) when it does not check."""
    if not model_admin.has_operate_permission(request):
        raise PermissionDenied
    form = OverrideForm(request.POST)
    if not form.is_valid():
        return quota_page(model_admin, request, form)
    data = form.cleaned_data
    kind: Kind = data["kind"]
    try:
        message = apply_override(request, kind, data["key"], data["action"], data)
    except (TypeError, ValueError) as error:  # refused by the engine: nothing stored
        form.add_error(None, str(error))
        return quota_page(model_admin, request, form)
    messages.success(request, message)
    page = reverse(model_admin._urlname("quotas"), current_app=model_admin.admin_site.name)
    shown = data.get("shown")
    return HttpResponseRedirect(f"{page}?{urlencode({'key': shown})}" if shown else page)


def apply_override(
    request: HttpRequest, kind: Kind, key: str, action: str, data: dict[str, Any]
) -> str:
    """Do what the form asks of ``key``'s override, write it to the admin's log, and
    tell what was done."""
    if action == "clear":
        row = override_row(key, kind)
        cleared = (
            default_engine.clear_rate_limit(key)
            if kind == "rate"
            else default_engine.clear_limit(key)
        )
        if not cleared:
            return gettext("%(key)s had no override: nothing cleared.") % {"key": key}
        text = cleared_text(key, kind)
        if row is not None:
            log(request, row, DELETION, text)
        return text
    before = override_row(key, kind)
    setter = default_engine.set_rate_limit if kind == "rate" else default_engine.set_limit
    override = setter(key, data["limit"], data.get("until"))
    text = set_text(override)
    row = override_row(key, kind)
    if row is not None:
        log(request, row, CHANGE if before is not None else ADDITION, text)
    return text


def override_row(key: str, kind: Kind) -> QuotaOverride | None:
    """The row of ``key``'s override in the default engine's scope (``None`` when there
    is none, or the engine's store is not the ORM's)."""
    store = default_engine.store
    if not isinstance(store, OrmStore):
        return None
    scope = scope_of(default_engine.read_namespace)
    found = QuotaOverride.objects.using(store.using).filter(tag=override_tag(key, kind))
    return found.filter(scope=scope).first()


def log(request: HttpRequest, row: QuotaOverride, flag: int, message: str) -> None:
    """One entry of the admin's log: ``request``'s user did ``message`` to ``row``."""
    user_id = request.user.pk
    assert user_id is not None  # the admin's views take logged-in staff only
    LogEntry.objects.log_actions(
        user_id=user_id,
        queryset=[row],
        action_flag=flag,
        change_message=message,
        single_object=True,
    )


def what(key: str, kind: Kind) -> str:
    """``tenant:acme``, or ``rate key calls:acme``: the key an override is of."""
    return key if kind == "concurrency" else gettext("rate key %(key)s") % {"key": key}


def until_text(until: datetime.datetime | None) -> str:
    """`` until 2026-12-07T08:00:00+00:00``, in the current time zone; nothing for good."""
    if until is None:
        return ""
    return " " + gettext("until %(until)s") % {
        "until": timezone.localtime(until).isoformat(timespec="seconds")
    }


def set_text(override: Override) -> str:
    """What setting ``override`` did: ``Set limit of tenant:acme to 20 until ...``."""
    name = what(override.key, override.kind)
    if override.paused:
        return gettext("Paused %(key)s%(until)s.") % {
            "key": name,
            "until": until_text(override.until),
        }
    return gettext("Set limit of %(key)s to %(limit)d%(until)s.") % {
        "key": name,
        "limit": override.limit,
        "until": until_text(override.until),
    }


def cleared_text(key: str, kind: Kind) -> str:
    """What clearing ``key``'s override did."""
    return gettext("Cleared the override of %(key)s: its declared limit applies.") % {
        "key": what(key, kind)
    }


def override_cells(override: Override | None) -> dict[str, Any]:
    """A key's override as the quota page shows it (``None``: there is none)."""
    if override is None:
        return {"override": None}
    return {
        "override": {
            "limit": override.limit,
            "until": override.until,
            "paused": override.paused,
            "changed_at": override.changed_at,
        }
    }


def quota_row(
    usage: QuotaUsage, changelist_url: str, estimate: Estimate | None = None
) -> dict[str, Any]:
    """What the quota page shows for one :class:`~durable_django._runtime.usage.QuotaUsage`, with
    its :func:`~durable_django._runtime.usage.estimate_for` estimate when given."""
    limit = usage.limit_in_force
    percent = percent_of(usage.active, limit)
    query = urlencode({"tag": usage.tag, "status__in": ",".join(DEFAULT_CONCURRENCY_STATUSES)})
    return {
        "key": usage.key,
        "tag": usage.tag,
        "active": usage.active,
        "limit": usage.limit,
        "limit_in_force": limit,
        **override_cells(usage.override),
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
    if usage.override is not None and usage.override.paused:
        next_unit_text = gettext("paused")
    elif usage.retry_after is None:
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
        "limit_in_force": usage.limit_in_force,
        **override_cells(usage.override),
        "per": usage.per,
        "per_text": duration_text(usage.per) if usage.per is not None else "-",
        "limit_computed": usage.limit_computed,
        "limit_error": usage.limit_error,
        "full": usage.full,
        "percent": percent_of(usage.used, usage.limit_in_force),
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
    if usage.override is not None and usage.override.paused:
        return {**cells, "next_slot": None, "next_slot_text": gettext("paused")}
    if usage.limit_in_force is not None and not usage.full:
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


__all__ = [
    "OverrideForm",
    "estimate_cells",
    "override_change",
    "quota_page",
    "quota_row",
    "rate_row",
]
