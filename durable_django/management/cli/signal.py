"""``manage.py durable signal TOKEN [--payload JSON]``: deliver a signal."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from .base import Subcommand


class SignalSubcommand(Subcommand):
    name = "signal"
    help = (
        "Send a signal: wakes the run waiting on TOKEN, or is kept for the first run that "
        "waits on it."
    )

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument("token", metavar="TOKEN")
        parser.add_argument(
            "--payload",
            default="null",
            metavar="JSON",
            help="The payload, as JSON (default null), e.g. '{\"approved\": true}'.",
        )

    def handle(self, **options: Any) -> None:
        token = options["token"]
        try:
            payload = json.loads(options["payload"])
        except ValueError as error:
            raise CommandError(f"--payload is not valid JSON: {error}") from error
        waiting = [run.run_id for run in self.engine.store.runs_waiting_on_signal(token)]
        try:
            self.engine.signal(token, payload)
        except (TypeError, ValueError) as error:
            raise CommandError(str(error)) from error
        if self.as_json:
            self.emit_json({"token": token, "payload": payload, "woken": waiting})
        elif waiting:
            self.write(f"signal {token!r} sent; woke {', '.join(waiting)}")
        else:
            self.write(
                f"signal {token!r} kept: no run waits on it yet; the first that does takes it"
            )


subcommand = SignalSubcommand
