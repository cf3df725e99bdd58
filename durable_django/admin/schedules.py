"""The schedule admin: timing, quota, next due time and what happened last."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from .._runtime.schedules import fire_now
from ..engines import default_engine
from ..models import Schedule
from .display import report, run_url, timestamp, timestamp_field

if TYPE_CHECKING:
    # django-stubs makes ModelAdmin generic in its model; Django's own class takes no
    # subscript at runtime.
    _ModelAdmin = admin.ModelAdmin[Schedule]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(Schedule)
class ScheduleAdmin(_ModelAdmin):
    """Schedules can be edited here; a schedule declared in code and then saved here stops
    following its declaration (its ``source`` becomes *admin*), and says so."""

    # Narrow enough for a 1,280 px window beside the admin's navigation and the filters:
    # the workflow (and "disabled") under the key, the quota under the timing, times to
    # the second, the last firing linking to its run, the error wrapping. Enabled and
    # source are among the filters.
    list_display = [
        "key_column",
        "timing_column",
        "next_due_display",
        "last_fired_link",
        "last_error_display",
    ]
    list_display_links = ["key_column"]
    change_list_template = "durable_django/admin/schedule_change_list.html"
    change_form_template = "durable_django/admin/schedule_change_form.html"
    list_filter = ["enabled", "source", "workflow"]
    search_fields = ["key", "workflow"]
    readonly_fields = [
        "source",
        "next_due_display",
        "last_fired_display",
        "last_run_link",
        "last_error_display",
        "created_at",
    ]
    fieldsets = [
        (None, {"fields": ["key", "workflow", "input", "enabled", "source"]}),
        ("When", {"fields": ["cron", "timezone", "interval_seconds"]}),
        (
            "Quota of its own",
            {
                "fields": ["concurrency_key", "concurrency_limit", "concurrency_statuses"],
                "description": "Leave the key empty to apply the workflow's own quota.",
            },
        ),
        (
            "What happened",
            {
                "fields": [
                    "next_due_display",
                    "last_fired_display",
                    "last_run_link",
                    "last_error_display",
                ]
            },
        ),
    ]
    actions = ["enable", "disable", "fire"]

    @admin.display(description="key", ordering="key")
    def key_column(self, schedule: Schedule) -> str:
        off = format_html(' · <span class="durable-disabled">{}</span>', "disabled")
        return format_html(
            '{}<div class="durable-meta"><span>{}</span>{}</div>',
            schedule.key,
            schedule.workflow,
            "" if schedule.enabled else off,
        )

    @admin.display(description="timing")
    def timing_column(self, schedule: Schedule) -> str:
        return format_html(
            '{}<div class="durable-meta" title="quota">{}</div>',
            self.timing(schedule),
            self.quota(schedule),
        )

    def timing(self, schedule: Schedule) -> str:
        if schedule.interval_seconds is not None:
            return f"every {schedule.interval_seconds}s"
        return f"{schedule.cron} ({schedule.timezone})"

    def quota(self, schedule: Schedule) -> str:
        if not schedule.concurrency_key:
            return "the workflow's"
        return f"{schedule.concurrency_key} ≤ {schedule.concurrency_limit}"

    next_due_display = timestamp_field("next_due_at", "next due")
    last_fired_display = timestamp_field("last_fired_at", "last fired")

    @admin.display(description="last fired", ordering="last_fired_at")
    def last_fired_link(self, schedule: Schedule) -> str:
        """When it last fired, to the second, linking to the run it started."""
        fired = timestamp(schedule.last_fired_at)
        if not schedule.last_run_id:
            return fired
        url = run_url(schedule.last_run_id, self.admin_site.name)
        return format_html('<a href="{}" title="{}">{}</a>', url, schedule.last_run_id, fired)

    @admin.display(description="last run")
    def last_run_link(self, schedule: Schedule) -> str:
        if not schedule.last_run_id:
            return "-"
        url = run_url(schedule.last_run_id, self.admin_site.name)
        return format_html('<a href="{}">{}</a>', url, schedule.last_run_id)

    @admin.display(description="last error")
    def last_error_display(self, schedule: Schedule) -> str:
        if not schedule.last_error:
            return "-"
        return format_html('<span class="durable-schedule-error">{}</span>', schedule.last_error)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        if change and obj.source == Schedule.Source.CODE:
            messages.warning(
                request,
                f"Schedule {obj.key!r} was declared in code; saved here, it no longer "
                f"follows its declaration.",
            )
        obj.source = Schedule.Source.ADMIN
        obj.next_due_at = obj.compute_next_due(timezone.now()) if obj.enabled else None
        super().save_model(request, obj, form, change)

    @admin.action(description="Enable the selected schedules", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        now = timezone.now()
        done = 0
        for schedule in queryset.filter(enabled=False):
            schedule.enabled = True
            schedule.source = Schedule.Source.ADMIN  # a declaration must not undo it
            schedule.next_due_at = schedule.compute_next_due(now)
            schedule.save(update_fields=["enabled", "source", "next_due_at"])
            done += 1
        report(self, request, done, "%(count)d schedule enabled.", "%(count)d schedules enabled.")

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        # Marked as the admin's: a declaration in code must not enable it again.
        done = queryset.filter(enabled=True).update(
            enabled=False, next_due_at=None, source=Schedule.Source.ADMIN
        )
        report(self, request, done, "%(count)d schedule disabled.", "%(count)d schedules disabled.")

    @admin.action(description="Fire the selected schedules now", permissions=["change"])
    def fire(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        done, refusals = 0, []
        for schedule in queryset:
            firing = fire_now(default_engine, schedule)
            if firing.run_id is None:
                refusals.append((schedule.key, firing.error))
            else:
                done += 1
        report(
            self,
            request,
            done,
            "%(count)d schedule fired.",
            "%(count)d schedules fired.",
            refusals,
        )
