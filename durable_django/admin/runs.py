"""The run admin: read-only runs with *cancel* and *retry* actions (and buttons on a run's
page), and the quota page."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_http_methods, require_POST

from .._core.limits import CHILD_STEP_PREFIX, TAG_PREFIX
from .._rules.concurrency import quota_tag
from .._rules.task_meta import TASK_WORKFLOW, shown_name
from ..engines import default_engine
from ..errors import ConcurrencyLimitError, DurableError
from ..models import Run, RunTag, Step
from ..status import ACTIVE_STATUSES, RunStatus
from ..stores.orm import OrmStore
from .deletion import below_active_messages, runs_below_active
from .display import (
    ReadOnlyInline,
    duration_text,
    error_block,
    json_block,
    named,
    report,
    run_url,
    short_id,
    status_badge,
    timestamp_field,
)
from .quotas import override_change, quota_page

if TYPE_CHECKING:
    # django-stubs makes ModelAdmin generic in its model; Django's own class takes no
    # subscript at runtime.
    _ModelAdmin = admin.ModelAdmin[Run]
else:
    _ModelAdmin = admin.ModelAdmin

#: The class of a run page's sections shown after its steps.
AFTER_STEPS = "durable-after-steps"

#: What cancelling or retrying one run answers: ``None`` when done, else why not.
Operation = Callable[[HttpRequest, Run], "str | None"]


class RunTagInline(ReadOnlyInline):
    model = RunTag
    fields = ["tag", "quota_key"]
    readonly_fields = ["tag", "quota_key"]
    verbose_name_plural = _("tags")
    classes = ["durable-inline"]

    @admin.display(description=_("quota key"))
    def quota_key(self, row: RunTag) -> str:
        return row.tag[len(TAG_PREFIX) :] if row.tag.startswith(TAG_PREFIX) else "-"


class StepInline(ReadOnlyInline):
    model = Step
    fields = readonly_fields = ("position", "name_display", "outcome_display", "recorded_display")
    ordering = ["position"]
    verbose_name_plural = _("recorded steps")
    classes = ["durable-inline", "durable-steps"]

    recorded_display = timestamp_field("created_at", _("recorded"))

    @admin.display(description=_("name"))
    def name_display(self, step: Step) -> str:
        return breakable(step.name)

    @admin.display(description=_("outcome"))
    def outcome_display(self, step: Step) -> str:
        """The result as JSON, or the error: its type and message, the rest folded (the
        run's own error, above, shows the traceback of the step that failed it). A child
        start's step links to the child run."""
        if step.error is not None:
            return error_block(step.error, folded=True)
        result = json_block(step.result)
        if step.name.startswith(CHILD_STEP_PREFIX) and isinstance(step.result, dict):
            child = step.result.get("child_id")
            if isinstance(child, str):
                url = run_url(child, self.admin_site.name)
                return format_html('<a href="{}">{}</a>{}', url, _("child run"), result)
        return result


class WorkflowFilter(admin.SimpleListFilter):
    """Runs of one workflow, or of one task of Django's tasks framework (by its dotted
    path, which a task's run shows in place of its workflow); the choices are the
    registered workflows and the value selected (no query)."""

    title = _("workflow")
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = {definition.name for definition in default_engine.registry.all()}
        if selected := self.value():
            names.add(selected)
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        name = self.value()
        if not name:
            return queryset
        return queryset.filter(Q(workflow=name) | Q(workflow=TASK_WORKFLOW, input__task=name))


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
class RunAdmin(_ModelAdmin):
    """Runs, read-only. *Cancel* and *retry* go through the engine; finished runs may be
    deleted (housekeeping), active ones never (cancel them first), nor runs below an
    active run (it may still read their outcomes). The quota page hangs
    off the changelist."""

    # Narrow enough for a 1,280 px window beside the admin's navigation and the filters:
    # short ids, version and namespace under the workflow, the attempt under the status.
    list_display = [
        "run_column",
        "workflow_column",
        "status_column",
        "created_display",
        "duration_display",
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
    inlines = [StepInline, RunTagInline]
    change_list_template = "durable_django/admin/run_change_list.html"
    change_form_template = "durable_django/admin/run_change_form.html"
    quota_template = "durable_django/admin/quotas.html"
    cancel_confirmation_template = "durable_django/admin/cancel_confirmation.html"
    # A run's page: its status and error first, then what it is, its data, its steps (the
    # inlines), and last the sections after the steps (AFTER_STEPS), those with nothing to
    # show left out (get_fieldsets).
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "status_display",
                    "error_display",
                    "id",
                    "workflow_display",
                    "version",
                    "namespace",
                    "attempt",
                    "queue",
                    "parent_link",
                    "children_link",
                ]
            },
        ),
        (_("Data"), {"fields": ["input_display", "output_display"]}),
        (
            _("Waiting"),
            {
                "fields": ["wait_display", "wake_display", "blocked_reason"],
                "description": _(
                    "What a suspended run waits for; when a suspended or blocked run is due again."
                ),
                "classes": [AFTER_STEPS],
            },
        ),
        (
            _("Times"),
            {
                "fields": [
                    "created_display",
                    "started_display",
                    "updated_display",
                    "finished_display",
                    "duration_display",
                ],
                "description": _("Started is when the latest turn of the run began."),
                "classes": [AFTER_STEPS],
            },
        ),
        (
            _("Worker"),
            {
                "fields": ["lease_owner", "lease_display"],
                "description": _("A running run whose lease lapsed is handed on."),
                "classes": [AFTER_STEPS],
            },
        ),
    ]
    # Everything shown is read-only: a run changes only through the engine.
    readonly_fields = flatten_fieldsets(fieldsets)

    def get_fieldsets(self, request: HttpRequest, obj: Run | None = None) -> Any:
        """The run's sections, without the error of a run that has none, nor the waiting
        and worker sections of a run that waits for nothing and has no lease."""
        if obj is None:
            return self.fieldsets
        sections = []
        for name, options in self.fieldsets:
            fields = options["fields"]
            if "wait_display" in fields and not (obj.wait or obj.wake_at or obj.blocked_reason):
                continue  # it waits for nothing
            if "lease_owner" in fields and not obj.lease_owner:
                continue  # no worker holds it
            if obj.error is None:
                fields = [field for field in fields if field != "error_display"]
            sections.append((name, {**options, "fields": fields}))
        return sections

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

    created_display = timestamp_field("created_at", _("created"))
    started_display = timestamp_field("started_at", _("started"))
    updated_display = timestamp_field("updated_at", _("updated"))
    finished_display = timestamp_field("finished_at", _("finished"))
    wake_display = timestamp_field("wake_at", _("wake at"))
    lease_display = timestamp_field("lease_expires_at", _("lease expires at"))

    @admin.display(description=_("run id"), ordering="id")
    def run_column(self, run: Run) -> str:
        return short_id(run.pk)

    @admin.display(description=_("workflow"), ordering="workflow")
    def workflow_column(self, run: Run) -> str:
        name = shown_name(run.workflow, run.input)
        return format_html(
            '<a href="?{}">{}</a><div class="durable-meta" title="{}"><span>v{}</span> · '
            "<span>{}</span></div>",
            urlencode({WorkflowFilter.parameter_name: name}),
            name,
            _("version %(version)s, namespace %(namespace)s")
            % {"version": run.version, "namespace": run.namespace},
            run.version,
            run.namespace,
        )

    @admin.display(description=_("workflow"))
    def workflow_display(self, run: Run) -> str:
        """The workflow; for a task's run, its task's dotted path, then the workflow."""
        name = shown_name(run.workflow, run.input)
        return name if name == run.workflow else f"{name} ({run.workflow})"

    @admin.display(description=_("status"), ordering="status")
    def status_column(self, run: Run) -> str:
        if run.attempt == 1:
            return status_badge(run.status)
        return format_html(
            '{}<div class="durable-meta">{}</div>',
            status_badge(run.status),
            _("attempt %(attempt)d") % {"attempt": run.attempt},
        )

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, run: Run) -> str:
        return status_badge(run.status)

    @admin.display(description=_("duration"))
    def duration_display(self, run: Run) -> str:
        """From its creation to its end (queue time and waits included), or for how long
        an active run has been going. Not from ``started_at``: that is when its latest
        turn began."""
        end = run.finished_at or timezone.now()
        lasted = duration_text(max(0.0, (end - run.created_at).total_seconds()))
        if run.finished_at is not None:
            return format_html('<span class="durable-duration">{}</span>', lasted)
        waiting = run.status == RunStatus.PENDING and run.started_at is None
        return format_html(
            '<span class="durable-duration">{}</span> <span class="durable-duration">{}</span>',
            _("waiting for") if waiting else _("running for"),
            lasted,
        )

    @admin.display(description=_("tags"))
    def tags_display(self, run: Run) -> str:
        tags = sorted(row.tag for row in run.tag_rows.all())
        if not tags:
            return "-"
        return format_html_join(
            " ", '<span class="durable-tag">{}</span>', ((breakable(t),) for t in tags)
        )

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

    # cancel and retry: the actions, and the buttons on a run's page ----------------------

    def cancel_run(self, request: HttpRequest, run: Run) -> str | None:
        """Cancel one run through the engine; ``None`` when done, else why not."""
        if run.status not in ACTIVE_STATUSES:
            return _("already %(status)s") % {"status": run.status}
        try:
            if not default_engine.cancel(run.pk):
                return gettext("ended before it could be cancelled")
        except DurableError as error:
            return str(error)
        self.log_change(request, run, "Cancelled.")
        return None

    def retry_run(self, request: HttpRequest, run: Run) -> str | None:
        """Start one failed run again through the engine, under its quota; ``None`` when
        done, else why not."""
        if run.status != RunStatus.FAILED:
            return _("only failed runs can be retried; it is %(status)s") % {"status": run.status}
        try:
            default_engine.retry(run.pk)
        except ConcurrencyLimitError as error:
            return refusal_text(error)
        except (DurableError, LookupError, TypeError, ValueError) as error:
            # Not retried, and said why: the run changed meanwhile, its workflow is no
            # longer registered, or its quota's key or limit function failed.
            return str(error)
        self.log_change(request, run, f"Retried as attempt {run.attempt + 1}.")
        return None

    def operate(
        self,
        request: HttpRequest,
        runs: Iterable[Run],
        operation: Operation,
        singular: str,
        plural: str,
    ) -> None:
        """Apply ``operation`` to each run and tell the user what was done and refused."""
        done, refusals = 0, []
        for run in runs:
            why = operation(request, run)
            if why is None:
                done += 1
            else:
                refusals.append((run.pk, why))
        report(self, request, done, singular, plural, refusals)

    @admin.action(description=_("Cancel selected runs"), permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        """Cancel each selected run through the engine, once confirmed on a page listing
        them (as delete asks); report the ones already ended."""
        runs = list(queryset.only("pk", "workflow", "status").order_by("-created_at", "-pk"))
        if request.POST.get("post") == "yes":
            self.operate(request, runs, self.cancel_run, *CANCELLED)
            return None
        return self.cancel_confirmation(request, runs, action=True)

    def cancel_confirmation(
        self, request: HttpRequest, runs: list[Run], *, action: bool
    ) -> HttpResponse:
        """The page asking to confirm the cancel of ``runs``: its form posts back to the
        same URL (the changelist's action, or a run's *Cancel* button)."""
        context = {
            **self.admin_site.each_context(request),
            "title": ngettext("Cancel this run?", "Cancel the selected runs?", len(runs)),
            "opts": self.model._meta,
            # Each run, and whether it is active (one that ended is left as it is).
            "runs": [(run, run.status in ACTIVE_STATUSES) for run in runs],
            "active": sum(run.status in ACTIVE_STATUSES for run in runs),
            "action_checkbox_name": ACTION_CHECKBOX_NAME if action else None,
        }
        return TemplateResponse(request, self.cancel_confirmation_template, context)

    @admin.action(description=_("Retry selected failed runs"), permissions=["operate"])
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        """Start each selected failed run again through the engine, under its quota."""
        runs = queryset.only("pk", "workflow", "status", "attempt")
        self.operate(request, runs, self.retry_run, *RETRIED)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """*Cancel* on a run's page: a page asking to confirm (GET), as delete does; the
        cancel (POST)."""
        if request.method == "POST":
            return self.operate_view(request, object_id, self.cancel_run, CANCELLED)
        return self.cancel_confirmation(request, [self.operable(request, object_id)], action=False)

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """*Retry* on a run's page (POST)."""
        return self.operate_view(request, object_id, self.retry_run, RETRIED)

    def operate_view(
        self, request: HttpRequest, object_id: str, operation: Operation, texts: tuple[str, str]
    ) -> HttpResponse:
        """Apply ``operation`` to one run, with the actions' permission, then show its page
        again with the outcome."""
        run = self.operable(request, object_id)
        self.operate(request, [run], operation, *texts)
        return HttpResponseRedirect(run_url(run.pk, self.admin_site.name))

    def operable(self, request: HttpRequest, object_id: str) -> Run:
        """The run ``object_id``, for a user with the actions' permission."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        run = self.get_object(request, unquote(object_id))
        if run is None:
            raise Http404(_("No run with the id %(id)s.") % {"id": unquote(object_id)})
        return run

    def operations(self, request: HttpRequest, run: Run) -> list[dict[str, str]]:
        """The buttons a run's page shows: *Cancel* for an active run (a link to the page
        asking to confirm, as *Delete* is), *Retry* for a failed one (a form), to users
        allowed to operate runs."""
        if not self.has_operate_permission(request):
            return []
        shown = []
        if run.status in ACTIVE_STATUSES:
            shown.append({"name": "cancel", "label": gettext("Cancel run"), "confirm": "yes"})
        if run.status == RunStatus.FAILED:
            shown.append({"name": "retry", "label": gettext("Retry run")})
        return [
            {**button, "url": run_url(run.pk, self.admin_site.name, button["name"])}
            for button in shown
        ]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Run | None = None,
    ) -> HttpResponse:
        context["run_operations"] = self.operations(request, obj) if obj is not None else []
        return super().render_change_form(request, context, add, change, form_url, obj)

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
        name = f"{opts.app_label}_{opts.model_name}"
        view = self.admin_site.admin_view
        return [
            path("quotas/", view(self.quotas_view), name=f"{name}_quotas"),
            path(
                "quotas/override/",
                view(require_POST(self.quota_override_view)),
                name=f"{name}_quota_override",
            ),
            # Before Django's own "<path:object_id>/" patterns, which would take them.
            path(
                "<path:object_id>/cancel/",
                view(require_http_methods(["GET", "POST"])(self.cancel_view)),
                name=f"{name}_cancel",
            ),
            path(
                "<path:object_id>/retry/", view(require_POST(self.retry_view)), name=f"{name}_retry"
            ),
            *super().get_urls(),
        ]

    def quotas_view(self, request: HttpRequest) -> HttpResponse:
        """The quota page (:func:`~durable_django.admin.quotas.quota_page`)."""
        return quota_page(self, request)

    def quota_override_view(self, request: HttpRequest) -> HttpResponse:
        """The quota page's override form (:func:`~durable_django.admin.quotas.override_change`):
        taken by a user with the change permission on runs."""
        return override_change(self, request)


#: What :meth:`RunAdmin.operate` tells after cancelling or retrying (singular, plural).
CANCELLED = ("Cancelled %(count)d run.", "Cancelled %(count)d runs.")
RETRIED = (
    "Retried %(count)d run: it is pending again as a new attempt.",
    "Retried %(count)d runs: they are pending again as new attempts.",
)


def breakable(name: str) -> str:
    """A tag or a step's name that may wrap after its colons, dots, slashes, underscores
    and hyphens (``concurrency:<wbr>tenant:<wbr>acme``), not inside a word."""
    return mark_safe("<wbr>".join(conditional_escape(part) for part in _BREAKS.split(name)))


#: Where a name may wrap: after each of these characters.
_BREAKS = re.compile(r"(?<=[:./_-])")


def refusal_text(error: ConcurrencyLimitError) -> str:
    """A quota refusal, for people."""
    return _("refused by the quota: key %(key)s has %(active)d active run(s), limit %(limit)d") % {
        "key": error.key,
        "active": error.active,
        "limit": error.limit,
    }
