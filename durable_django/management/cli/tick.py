"""``manage.py durable tick``: the engine's tick, once or every ``--interval`` seconds."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError, CommandParser

from .base import Subcommand


class TickSubcommand(Subcommand):
    name = "tick"
    help = (
        "Wake runs whose timer is due, hand on runs whose worker died or that are blocked, "
        "send again runs whose message seems lost, fire due schedules. Once, or every "
        "--interval seconds."
    )

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            metavar="SECONDS",
            help="Tick every this many seconds until stopped (default: tick once).",
        )
        parser.add_argument(
            "--iterations",
            type=int,
            default=None,
            metavar="N",
            help="With --interval, stop after this many ticks.",
        )

    def handle(self, **options: Any) -> None:
        interval, iterations = options["interval"], options["iterations"]
        if interval is not None and interval <= 0:
            raise CommandError("--interval must be a positive number of seconds")
        if iterations is not None and iterations <= 0:
            raise CommandError("--iterations must be a positive number")
        if iterations is not None and interval is None:
            raise CommandError("--iterations needs --interval")
        done = 0
        try:
            while True:
                counts = asdict(self.engine.tick())
                done += 1
                if self.as_json:
                    self.emit_json(counts)
                elif interval is None or any(counts.values()):
                    self.write(", ".join(f"{name} {count}" for name, count in counts.items()))
                if interval is None or (iterations is not None and done >= iterations):
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return


subcommand = TickSubcommand
