"""``manage.py durable show RUN_ID``: one run, its data and its recorded steps."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...errors import RunNotFound
from .base import Subcommand, pretty, run_data, short, step_data, when


class ShowSubcommand(Subcommand):
    name = "show"
    help = "Show one run: its status, input, output or error, and its recorded steps."

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument("run_id", metavar="RUN_ID")

    def handle(self, **options: Any) -> None:
        try:
            run = self.engine.get_run(options["run_id"])
        except RunNotFound as error:
            raise CommandError(str(error)) from error
        steps = self.engine.store.get_steps(run.run_id)
        if self.as_json:
            self.emit_json({**run_data(run), "steps": [step_data(step) for step in steps]})
            return

        fields = [
            ("run", run.run_id),
            ("workflow", f"{run.workflow} (version {run.version})"),
            ("status", f"{run.status} (attempt {run.attempt})"),
            ("namespace", run.namespace),
            ("queue", run.queue or "(default)"),
            ("parent", run.parent_id or "-"),
            ("tags", ", ".join(run.tags) or "-"),
            ("created", when(run.created_at)),
            ("started", when(run.started_at)),
            ("updated", when(run.updated_at)),
            ("finished", when(run.finished_at)),
        ]
        if run.wake_at:
            fields.append(("wakes at", when(run.wake_at)))
        if run.wait is not None:
            fields.append(("waits for", short(run.wait)))
        if run.blocked_reason:
            fields.append(("blocked", run.blocked_reason))
        if run.lease_owner:
            fields.append(("worker", f"{run.lease_owner} until {when(run.lease_expires_at)}"))
        width = max(len(label) for label, _ in fields)
        for label, value in fields:
            self.write(f"{label.ljust(width)}  {value}")

        self.section("input", pretty(run.input))
        if run.output is not None:
            self.section("output", pretty(run.output))
        if run.error is not None:
            self.section("error", error_text(run.error))
        self.write("")
        if not steps:
            self.write("No recorded steps.")
            return
        self.write("steps")
        self.table(
            ["#", "NAME", "OUTCOME"],
            ([step.position, step.name, outcome(step.result, step.error)] for step in steps),
            right=[0],
        )

    def section(self, title: str, text: str) -> None:
        self.write("")
        self.write(title)
        for line in text.splitlines():
            self.write(f"  {line}")


def error_text(error: Any) -> str:
    """A recorded error for people: ``type: message``, then its traceback."""
    if not isinstance(error, dict):
        return pretty(error)
    text = f"{error.get('type', '?')}: {error.get('message', '')}"
    for name, value in sorted(error.items()):
        if name not in ("type", "message", "traceback"):
            text += f"\n{name}: {short(value)}"
    if error.get("traceback"):
        text += "\n" + error["traceback"].rstrip()
    return text


def outcome(result: Any, error: Any) -> str:
    if error is not None:
        if isinstance(error, dict):
            return f"error: {error.get('type', '?')}: {error.get('message', '')}"
        return f"error: {short(error)}"
    return short(result)


subcommand = ShowSubcommand
