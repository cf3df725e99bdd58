"""``manage.py durable cancel RUN_ID...``: cancel runs that have not ended."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...errors import RunNotFound
from .base import Subcommand


class CancelSubcommand(Subcommand):
    name = "cancel"
    help = "Cancel runs that have not ended; their quota slots free at once."

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument("run_ids", nargs="+", metavar="RUN_ID")

    def handle(self, **options: Any) -> None:
        outcomes = []
        missing = []
        for run_id in dict.fromkeys(options["run_ids"]):
            try:
                cancelled = self.engine.cancel(run_id)
                status = self.engine.get_run(run_id).status
            except RunNotFound:
                missing.append(run_id)
                continue
            outcomes.append({"run_id": run_id, "cancelled": cancelled, "status": status})
        if self.as_json:
            self.emit_json(outcomes)
        else:
            for outcome in outcomes:
                if outcome["cancelled"]:
                    self.write(f"cancelled  {outcome['run_id']}")
                else:
                    self.write(f"unchanged  {outcome['run_id']} (already {outcome['status']})")
        if missing:
            raise CommandError(
                f"no run with id {', '.join(repr(run_id) for run_id in missing)}"
                + (" (the others were handled)" if outcomes else "")
            )


subcommand = CancelSubcommand
