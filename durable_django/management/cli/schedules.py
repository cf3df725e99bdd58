"""``manage.py durable schedules``: the persisted schedules, their next and last firing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ...models import Schedule
from .base import Subcommand


def timing(schedule: Schedule) -> str:
    """``every 60s`` or ``0 3 * * * (Europe/Paris)``."""
    if schedule.interval_seconds is not None:
        return f"every {schedule.interval_seconds}s"
    return f"{schedule.cron} ({schedule.timezone})"


def quota(schedule: Schedule) -> str:
    """The schedule's own quota, or ``workflow's`` when the workflow's applies."""
    if not schedule.concurrency_key:
        return "workflow's"
    return f"{schedule.concurrency_key} <= {schedule.concurrency_limit}"


class SchedulesSubcommand(Subcommand):
    name = "schedules"
    help = "List the schedules: timing, quota, next due time, last firing and last error."

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument("--enabled", action="store_true", help="Only enabled schedules.")

    def handle(self, **options: Any) -> None:
        schedules = Schedule.objects.all()
        if options["enabled"]:
            schedules = schedules.enabled()
        if self.as_json:
            self.emit_json(
                [
                    {
                        "key": s.key,
                        "workflow": s.workflow,
                        "cron": s.cron,
                        "timezone": s.timezone,
                        "interval_seconds": s.interval_seconds,
                        "enabled": s.enabled,
                        "concurrency_key": s.concurrency_key,
                        "concurrency_limit": s.concurrency_limit,
                        "source": s.source,
                        "next_due_at": s.next_due_at,
                        "last_fired_at": s.last_fired_at,
                        "last_run_id": s.last_run_id,
                        "last_error": s.last_error,
                    }
                    for s in schedules
                ]
            )
            return
        rows = [
            [
                s.key,
                s.workflow,
                timing(s),
                quota(s),
                "yes" if s.enabled else "no",
                s.next_due_at,
                s.last_fired_at,
                # Whole, on one line; the last column, so it lengthens only its own row.
                " ".join(s.last_error.splitlines()),
            ]
            for s in schedules
        ]
        if not rows:
            self.write("No schedules.")
            return
        self.table(
            [
                "KEY",
                "WORKFLOW",
                "TIMING",
                "QUOTA",
                "ENABLED",
                "NEXT DUE",
                "LAST FIRED",
                "LAST ERROR",
            ],
            rows,
        )


subcommand = SchedulesSubcommand
