"""What the app's model admins share: JSON, errors and statuses shown readably, action
reports, read-only inlines."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.db.models import Model
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..status import RunStatus
from .tracebacks import traceback_block

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    # django-stubs makes an inline generic in its model and its parent's; Django's own
    # class takes no subscript at runtime.
    _TabularInline = admin.TabularInline[Model, Model]
else:
    _TabularInline = admin.TabularInline

#: How many refused objects a message names before it says "and N more".
NAMED_IN_MESSAGES = 10

#: Run ids longer than this are shown cut to :data:`SHORT_ID_LENGTH` characters in lists.
SHORT_IDS_UP_TO = 12
SHORT_ID_LENGTH = 8

#: Badge colours per run status (background); the text is white.
STATUS_COLOURS: dict[str, str] = {
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


def error_block(error: Any, folded: bool = False) -> str:
    """A recorded error: its type and message on top, its whole traceback in a scrollable
    block (durable_django's own frames folded), the rest as JSON; ``folded`` puts all but
    the type and message in a closed ``<details>``."""
    if not isinstance(error, dict):
        return json_block(error)
    rest = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    summary = format_html("<strong>{}</strong>: {}", error.get("type", "?"), error.get("message"))
    details: list[str] = []
    if error.get("traceback"):
        details.append(traceback_block(error["traceback"]))
    if rest:
        details.append(json_block(rest))
    if folded and details:
        details = [
            format_html(
                '<details class="durable-error-details"><summary>{}</summary>{}</details>',
                _("traceback") if error.get("traceback") else _("details"),
                format_html_join("", "{}", ((part,) for part in details)),
            )
        ]
    return format_html_join("", "<div>{}</div>", ((part,) for part in [summary, *details]))


def run_url(run_id: str, current_app: str = "admin", view: str = "change") -> str:
    """The admin page ``view`` (``change``, ``cancel``, ``retry``) of the run ``run_id``, its
    id quoted as the admin's own links quote a primary key (an id holding ``/`` or ``_2F``
    links to that very run)."""
    return reverse(
        f"admin:durable_django_run_{view}", args=[quote(run_id)], current_app=current_app
    )


def status_badge(status: str) -> str:
    """A run status as a coloured badge."""
    return format_html(
        '<span class="durable-status durable-status-{}" style="background:{};color:#fff;'
        'padding:1px 8px;border-radius:9px;white-space:nowrap">{}</span>',
        status,
        STATUS_COLOURS.get(status, "#6c757d"),
        RunStatus(status).label if status in RunStatus.values else status,
    )


def timestamp(value: datetime.datetime | None) -> str:
    """A time to the second in the current time zone (``2026-11-30 15:38:39``), never cut
    inside the date or the time; the exact value on hover; ``-`` for ``None``."""
    if value is None:
        return "-"
    exact = value.isoformat()
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return format_html(
        '<time class="durable-time" datetime="{}" title="{}">'
        "<span>{}</span> <span>{}</span></time>",
        exact,
        exact,
        value.strftime("%Y-%m-%d"),
        value.strftime("%H:%M:%S"),
    )


def timestamp_field(name: str, description: StrOrPromise) -> Callable[[object, object], str]:
    """A read-only column or field of a model admin showing the object's ``name`` time
    with :func:`timestamp`, sortable by it."""

    @admin.display(description=description, ordering=name)
    def show(modeladmin: object, obj: object) -> str:
        return timestamp(getattr(obj, name))

    return show


def short_id(run_id: str) -> str:
    """A run id cut to :data:`SHORT_ID_LENGTH` characters and an ellipsis when longer than
    :data:`SHORT_IDS_UP_TO`, with the whole id on hover."""
    shown = run_id if len(run_id) <= SHORT_IDS_UP_TO else run_id[:SHORT_ID_LENGTH] + "…"
    return format_html('<span class="durable-run-id" title="{}">{}</span>', run_id, shown)


def duration_text(seconds: float) -> str:
    """``38 ms``, ``1.4 s``, ``12 s``, ``3 min 12 s``, ``2 h 5 min``, ``3 d 4 h``."""
    if seconds < 1:
        return f"{int(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def named(items: list[str]) -> str:
    """``a, b, c`` with at most :data:`NAMED_IN_MESSAGES` items and "and N more"."""
    shown = ", ".join(items[:NAMED_IN_MESSAGES])
    if len(items) > NAMED_IN_MESSAGES:
        shown += f" and {len(items) - NAMED_IN_MESSAGES} more"
    return shown


def report(
    modeladmin: admin.ModelAdmin[Any],
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


class ReadOnlyInline(_TabularInline):
    """An inline that shows rows and never adds, changes or deletes them; visible to whoever
    may view the parent object."""

    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        opts = self.parent_model._meta
        return request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}") or (
            request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")
        )


# runs ---------------------------------------------------------------------------------
