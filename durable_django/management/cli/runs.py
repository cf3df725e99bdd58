"""``manage.py durable runs``: list runs, newest first, with filters."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ..._rules.concurrency import quota_tag
from ..._rules.task_meta import shown_name
from ...status import RunStatus
from .base import Subcommand, run_data

DEFAULT_LIMIT = 50
COLUMNS = [
    "RUN ID",
    "WORKFLOW",
    "VERSION",
    "STATUS",
    "NAMESPACE",
    "ATTEMPT",
    "CREATED",
    "FINISHED",
    "TAGS",
]


class RunsSubcommand(Subcommand):
    name = "runs"
    help = "List runs, newest first."

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument(
            "--status",
            action="append",
            choices=RunStatus.values,
            metavar="STATUS",
            help=f"Only runs in this status; repeat for several ({', '.join(RunStatus.values)}).",
        )
        parser.add_argument("--workflow", help="Only runs of this workflow (its name).")
        parser.add_argument("--namespace", help="Only runs of this namespace.")
        parser.add_argument("--tag", help="Only runs carrying this tag.")
        parser.add_argument(
            "--quota",
            metavar="KEY",
            help="Only runs started under this quota key (the tag concurrency:KEY).",
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=DEFAULT_LIMIT,
            help=f"At most this many runs (default {DEFAULT_LIMIT}).",
        )

    def handle(self, **options: Any) -> None:
        limit = options["limit"]
        if limit <= 0:
            raise CommandError("--limit must be a positive number")
        if options["tag"] and options["quota"]:
            raise CommandError("give --tag or --quota, not both")
        tag = quota_tag(options["quota"]) if options["quota"] else options["tag"]
        try:
            runs = self.engine.list_runs(
                tag=tag,
                statuses=options["status"],
                workflow=options["workflow"],
                namespace=options["namespace"],
                limit=limit,
            )
        except ValueError as error:  # a namespace this engine may not read
            raise CommandError(str(error)) from error
        if self.as_json:
            self.emit_json([run_data(run) for run in runs])
            return
        if not runs:
            self.write("No runs.")
            return
        self.table(
            COLUMNS,
            (
                [
                    run.run_id,
                    shown_name(run.workflow, run.input),
                    run.version,
                    run.status,
                    run.namespace,
                    run.attempt,
                    run.created_at,
                    run.finished_at,
                    run.tags,
                ]
                for run in runs
            ),
            right=[5],
        )
        if len(runs) == limit:
            self.write(f"(the newest {limit}; --limit N for more)")


subcommand = RunsSubcommand
