"""The run admin: read-only runs with *cancel* and *retry* actions, and the quota page."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..concurrency import DEFAULT_CONCURRENCY_STATUSES, TAG_PREFIX, quota_tag
from ..engines import default_engine
from ..errors import ConcurrencyLimitError, DurableError
from ..models import Run, RunTag, Step
from ..status import ACTIVE_STATUSES, RunStatus
from ..stores.orm import OrmStore
from .deletion import below_active_messages, runs_below_active
from .display import (
    ReadOnlyInline,
    error_block,
    json_block,
    named,
    report,
    run_url,
    status_badge,
)


class RunTagInline(ReadOnlyInline):
    model = RunTag
    fields = ["tag", "quota_key"]
    readonly_fields = ["tag", "quota_key"]
    verbose_name_plural = _("tags")

    @admin.display(description=_("quota key"))
    def quota_key(self, row: RunTag) -> str:
        return row.tag[len(TAG_PREFIX) :] if row.tag.startswith(TAG_PREFIX) else "-"


class StepInline(ReadOnlyInline):
    model = Step
    fields = ["position", "name", "result_display", "error_display", "created_at"]
    readonly_fields = fields
    ordering = ["position"]
    verbose_name_plural = _("recorded steps")

    @admin.display(description=_("result"))
    def result_display(self, step: Step) -> str:
        return json_block(step.result) if step.error is None else "-"

    @admin.display(description=_("error"))
    def error_display(self, step: Step) -> str:
        return error_block(step.error) if step.error is not None else "-"


class WorkflowFilter(admin.SimpleListFilter):
    """Runs of one workflow; the choices are the registered workflows (no query)."""

    title = _("workflow")
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = {definition.name for definition in default_engine.registry.all()}
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        return queryset.filter(workflow=self.value()) if self.value() else queryset


class TagFilter(admin.SimpleListFilter):
    """Runs carrying one tag (``?tag=concurrency:tenant:acme``, as the quota page links).

    It lists no choices of its own, which would cost a scan of every tag; it shows only
    while a tag is selected, with "All" to clear it.
    """

    title = _("tag")
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        if not self.value():
            return queryset
        return queryset.filter(Exists(RunTag.objects.filter(run=OuterRef("pk"), tag=self.value())))


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Runs, read-only. *Cancel* and *retry* go through the engine; finished runs may be
    deleted (housekeeping), active ones never (cancel them first), nor runs below an
    active run (it may still read their outcomes). The quota page hangs
    off the changelist."""

    list_display = [
        "id",
        "workflow",
        "version",
        "status_display",
        "namespace",
        "attempt",
        "created_at",
        "finished_at",
        "tags_display",
    ]
    list_filter = ["status", WorkflowFilter, "namespace", TagFilter]
    search_fields = ["=id", "=tag_rows__tag"]
    search_help_text = _(
        "An exact run id, tag or quota key (tenant:acme finds concurrency:tenant:acme)."
    )
    date_hierarchy = "created_at"
    ordering = ["-created_at", "-pk"]
    list_per_page = 50
    # A filtered changelist does not count the whole table again.
    show_full_result_count = False
    actions = ["cancel_runs", "retry_runs", "delete_selected"]
    inlines = [RunTagInline, StepInline]
    change_list_template = "durable_django/admin/run_change_list.html"
    quota_template = "durable_django/admin/quotas.html"
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "id",
                    "workflow",
                    "version",
                    "namespace",
                    "status_display",
                    "attempt",
                    "queue",
                    "parent_link",
                    "children_link",
                ]
            },
        ),
        (_("Data"), {"fields": ["input_display", "output_display", "error_display"]}),
        (
            _("Waiting"),
            {"fields": ["wait_display", "wake_at", "blocked_reason"]},
        ),
        (
            _("Times"),
            {"fields": ["created_at", "started_at", "updated_at", "finished_at"]},
        ),
        (_("Worker"), {"fields": ["lease_owner", "lease_expires_at"]}),
    ]
    # Everything shown is read-only: a run changes only through the engine.
    readonly_fields = [name for _, options in fieldsets for name in options["fields"]]

    # reading ----------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        # One query for the tags of a whole page, whatever its length.
        return super().get_queryset(request).prefetch_related("tag_rows")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Run], search_term: str
    ) -> tuple[QuerySet[Run], bool]:
        """The run with that exact id, or the runs carrying that exact tag (or the quota
        tag of that key): index lookups, and no duplicate rows (``EXISTS``, not a join)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        tags = RunTag.objects.filter(run=OuterRef("pk"), tag__in=[term, quota_tag(term)])
        return queryset.filter(Q(pk=term) | Q(Exists(tags))), False

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, run: Run) -> str:
        return status_badge(run.status)

    @admin.display(description=_("tags"))
    def tags_display(self, run: Run) -> str:
        return ", ".join(sorted(row.tag for row in run.tag_rows.all())) or "-"

    @admin.display(description=_("input"))
    def input_display(self, run: Run) -> str:
        return json_block(run.input)

    @admin.display(description=_("output"))
    def output_display(self, run: Run) -> str:
        return json_block(run.output)

    @admin.display(description=_("error"))
    def error_display(self, run: Run) -> str:
        return error_block(run.error) if run.error is not None else "-"

    @admin.display(description=_("waits for"))
    def wait_display(self, run: Run) -> str:
        return json_block(run.wait)

    @admin.display(description=_("parent run"))
    def parent_link(self, run: Run) -> str:
        if not run.parent_id:
            return "-"
        url = run_url(run.parent_id, self.admin_site.name)
        return format_html('<a href="{}">{}</a>', url, run.parent_id)

    @admin.display(description=_("child runs"))
    def children_link(self, run: Run) -> str:
        url = reverse(self._urlname("changelist"), current_app=self.admin_site.name)
        return format_html(
            '<a href="{}?{}">{}</a>',
            url,
            urlencode({"parent_id": run.pk}),
            _("children of this run"),
        )

    def _urlname(self, view: str) -> str:
        opts = self.model._meta
        return f"admin:{opts.app_label}_{opts.model_name}_{view}"

    # permissions: read-only -------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs are started by the engine, under their quota

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # editing a run's state would corrupt it; use the actions

    def has_delete_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        if obj is not None and obj.status in ACTIVE_STATUSES:
            return False  # an active run holds a slot and may be on a worker
        return super().has_delete_permission(request, obj)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Cancelling and retrying take the model's change permission (the form itself
        stays read-only)."""
        opts = self.model._meta
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    # actions ----------------------------------------------------------------------------

    @admin.action(description=_("Cancel selected runs"), permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        """Cancel each selected run through the engine; report the ones already ended."""
        cancelled = 0
        refusals = []
        for run in queryset.only("pk", "workflow", "status"):
            run_id, status = run.pk, run.status
            if status not in ACTIVE_STATUSES:
                refusals.append((run_id, _("already %(status)s") % {"status": status}))
                continue
            try:
                if default_engine.cancel(run_id):
                    cancelled += 1
                    self.log_change(request, run, "Cancelled.")
                else:
                    refusals.append((run_id, _("ended before it could be cancelled")))
            except DurableError as error:
                refusals.append((run_id, str(error)))
        report(
            self,
            request,
            cancelled,
            "Cancelled %(count)d run.",
            "Cancelled %(count)d runs.",
            refusals,
        )

    @admin.action(description=_("Retry selected failed runs"), permissions=["operate"])
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        """Start each selected failed run again through the engine, under its quota."""
        retried = 0
        refusals = []
        for run in queryset.only("pk", "workflow", "status", "attempt"):
            run_id, status = run.pk, run.status
            if status != RunStatus.FAILED:
                refusals.append(
                    (
                        run_id,
                        _("only failed runs can be retried; it is %(status)s") % {"status": status},
                    )
                )
                continue
            try:
                default_engine.retry(run_id)
                retried += 1
                self.log_change(request, run, f"Retried as attempt {run.attempt + 1}.")
            except ConcurrencyLimitError as error:
                refusals.append((run_id, refusal_text(error)))
            except DurableError as error:
                refusals.append((run_id, str(error)))
        report(
            self,
            request,
            retried,
            "Retried %(count)d run: it is pending again as a new attempt.",
            "Retried %(count)d runs: they are pending again as new attempts.",
            refusals,
        )

    @admin.action(
        description=_("Delete selected finished %(verbose_name_plural)s"), permissions=["delete"]
    )
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> Any:
        """Django's delete action, refused when a selected run is still active, or below
        an active run."""
        refused = False
        active = list(queryset.filter(status__in=ACTIVE_STATUSES).values_list("pk", flat=True))
        if active:
            refused = True
            self.message_user(
                request,
                ngettext(
                    "Nothing deleted: %(count)d selected run is still active (%(names)s); "
                    "cancel it first.",
                    "Nothing deleted: %(count)d selected runs are still active (%(names)s); "
                    "cancel them first.",
                    len(active),
                )
                % {"count": len(active), "names": named(active)},
                messages.ERROR,
            )
        run_ids = queryset.exclude(pk__in=active).values_list("pk", flat=True)
        for message in below_active_messages(runs_below_active(run_ids, queryset.db)):
            refused = True
            self.message_user(request, message, messages.ERROR)
        return None if refused else django_delete_selected(self, request, queryset)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Django's delete page, refused with the reason for a run below an active run."""
        run_id = unquote(object_id)
        if self.has_delete_permission(request):
            below = runs_below_active([run_id], self.get_queryset(request).db)
            if below:
                for message in below_active_messages(below):
                    self.message_user(request, message, messages.ERROR)
                return HttpResponseRedirect(run_url(run_id, self.admin_site.name))
        return super().delete_view(request, object_id, extra_context)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        """Delete through the store, which checks again, under locks, that each run and
        its ancestry have finished."""
        run_ids = list(queryset.values_list("pk", flat=True))
        kept = sorted(set(run_ids) - set(OrmStore(using=queryset.db).delete_runs(run_ids)))
        if kept:
            self.message_user(
                request,
                ngettext(
                    "%(count)d run was not deleted: it, or a run above it, became active "
                    "meanwhile (%(names)s).",
                    "%(count)d runs were not deleted: they, or runs above them, became "
                    "active meanwhile (%(names)s).",
                    len(kept),
                )
                % {"count": len(kept), "names": named(kept)},
                messages.WARNING,
            )

    def delete_model(self, request: HttpRequest, obj: Run) -> None:
        self.delete_queryset(request, Run.objects.using(obj._state.db).filter(pk=obj.pk))

    # the quota page ---------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        return [
            path(
                "quotas/",
                self.admin_site.admin_view(self.quotas_view),
                name=f"{opts.app_label}_{opts.model_name}_quotas",
            ),
            *super().get_urls(),
        ]

    def quotas_view(self, request: HttpRequest) -> HttpResponse:
        """Every quota key holding active runs (or the one asked for with ``?key=``), its
        active runs against the limit its workflows declare, and a link to those runs."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        key = request.GET.get("key", "").strip() or None
        changelist = reverse(self._urlname("changelist"), current_app=self.admin_site.name)
        rows = [quota_row(usage, changelist) for usage in default_engine.quota_usage(key)]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Quotas"),
            "subtitle": None,
            "rows": rows,
            "key": key or "",
            "statuses": ", ".join(DEFAULT_CONCURRENCY_STATUSES),
            "changelist_url": changelist,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.quota_template, context)


def refusal_text(error: ConcurrencyLimitError) -> str:
    """A quota refusal, for people."""
    return _("refused by the quota: key %(key)s has %(active)d active run(s), limit %(limit)d") % {
        "key": error.key,
        "active": error.active,
        "limit": error.limit,
    }


def quota_row(usage: Any, changelist_url: str) -> dict[str, Any]:
    """What the quota page shows for one :class:`~durable_django.usage.QuotaUsage`."""
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
        "full": usage.full,
        "percent": percent,
        "workflows": usage.workflows,
        "runs_url": f"{changelist_url}?{query}",
    }
