"""What the app's model admins share: JSON, errors and statuses shown readably, action
reports, read-only inlines."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..status import RunStatus

#: How many refused objects a message names before it says "and N more".
NAMED_IN_MESSAGES = 10

#: Badge colours per run status (background); the text is white.
STATUS_COLOURS = {
    RunStatus.PENDING: "#6c757d",
    RunStatus.RUNNING: "#0d6efd",
    RunStatus.SUSPENDED: "#6f42c1",
    RunStatus.BLOCKED: "#fd7e14",
    RunStatus.COMPLETED: "#198754",
    RunStatus.FAILED: "#dc3545",
    RunStatus.CANCELLED: "#495057",
}


# shared helpers -----------------------------------------------------------------------


def json_block(value: Any) -> str:
    """A JSON value as indented text in a ``<pre>``; ``-`` for ``None``."""
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="durable-json">{}</pre>', text)


def error_block(error: Any) -> str:
    """A recorded error: its type and message on top, its traceback as text, the rest
    as JSON."""
    if not isinstance(error, dict):
        return json_block(error)
    rest = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    parts = [format_html("<strong>{}</strong>: {}", error.get("type", "?"), error.get("message"))]
    if error.get("traceback"):
        parts.append(format_html('<pre class="durable-json">{}</pre>', error["traceback"]))
    if rest:
        parts.append(json_block(rest))
    return format_html_join("", "<div>{}</div>", ((part,) for part in parts))


def run_url(run_id: str, current_app: str = "admin") -> str:
    """The admin page of the run ``run_id``, its id quoted as the admin's own links quote
    a primary key (an id holding ``/`` or ``_2F`` links to that very run)."""
    return reverse("admin:durable_django_run_change", args=[quote(run_id)], current_app=current_app)


def status_badge(status: str) -> str:
    """A run status as a coloured badge."""
    return format_html(
        '<span class="durable-status durable-status-{}" style="background:{};color:#fff;'
        'padding:1px 8px;border-radius:9px;white-space:nowrap">{}</span>',
        status,
        STATUS_COLOURS.get(status, "#6c757d"),
        RunStatus(status).label if status in RunStatus.values else status,
    )


def named(items: list[str]) -> str:
    """``a, b, c`` with at most :data:`NAMED_IN_MESSAGES` items and "and N more"."""
    shown = ", ".join(items[:NAMED_IN_MESSAGES])
    if len(items) > NAMED_IN_MESSAGES:
        shown += f" and {len(items) - NAMED_IN_MESSAGES} more"
    return shown


def report(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    done: int,
    singular: str,
    plural: str,
    refusals: Iterable[tuple[str, str]] = (),
) -> None:
    """Tell the user what an action did: ``done`` successes (``singular``/``plural`` take
    ``%(count)d``) and, as warnings, each ``(object, why)`` refusal grouped by reason."""
    if done:
        modeladmin.message_user(request, ngettext(singular, plural, done) % {"count": done})
    by_reason: dict[str, list[str]] = {}
    for name, why in refusals:
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        modeladmin.message_user(
            request,
            _("%(names)s: %(why)s") % {"names": named(names), "why": why},
            messages.WARNING,
        )


class ReadOnlyInline(admin.TabularInline):
    """An inline that shows rows and never adds, changes or deletes them; visible to whoever
    may view the parent object."""

    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        opts = self.parent_model._meta
        return request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}") or (
            request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")
        )


# runs ---------------------------------------------------------------------------------
