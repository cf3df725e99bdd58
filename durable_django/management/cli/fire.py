"""``manage.py durable fire KEY``: start a run of a schedule now, under its quota."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ..._runtime.schedules import fire_now
from ...models import Schedule
from .base import Subcommand


class FireSubcommand(Subcommand):
    name = "fire"
    help = "Start a run of a schedule now, outside its windows, under its quota."

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument("key", metavar="KEY", help="The schedule's key.")

    def handle(self, **options: Any) -> None:
        schedule = Schedule.objects.filter(key=options["key"]).first()
        if schedule is None:
            raise CommandError(f"no schedule with key {options['key']!r}")
        firing = fire_now(self.engine, schedule)
        if firing.run_id is None:
            message = f"schedule {schedule.key!r} not fired: {firing.error}"
            if firing.refusal is not None:
                self.refuse(firing.refusal, message, schedule=schedule.key)
            raise CommandError(message)
        if self.as_json:
            self.emit_json({"key": schedule.key, "run_id": firing.run_id})
        else:
            self.write(f"fired  {schedule.key}: run {firing.run_id}")


subcommand = FireSubcommand
