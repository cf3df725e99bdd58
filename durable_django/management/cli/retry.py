"""``manage.py durable retry RUN_ID``: start a failed run again, through its quota."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...errors import ConcurrencyLimitError, DurableError
from .base import Subcommand


class RetrySubcommand(Subcommand):
    name = "retry"
    help = "Start a failed run again as a new attempt, through its quota like any start."

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument("run_id", metavar="RUN_ID")

    def handle(self, **options: Any) -> None:
        run_id = options["run_id"]
        try:
            self.engine.retry(run_id)
        except ConcurrencyLimitError as error:
            self.refuse(
                error,
                f"retry of run {run_id!r} refused by the quota: key {error.key!r} has "
                f"{error.active} active run(s), limit {error.limit}; try again once one ends",
                run_id=run_id,
            )
        except DurableError as error:  # not found, not failed, workflow not registered
            raise CommandError(str(error)) from error
        run = self.engine.get_run(run_id)
        if self.as_json:
            self.emit_json({"run_id": run.run_id, "status": run.status, "attempt": run.attempt})
        else:
            self.write(f"retried  {run.run_id}: {run.status}, attempt {run.attempt}")


subcommand = RetrySubcommand
