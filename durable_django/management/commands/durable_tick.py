"""``manage.py durable_tick``: run the engine's tick once, or in a loop."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durable_django.engines import default_engine


class Command(BaseCommand):
    help = (
        "Wake runs whose timer is due, hand on runs whose worker died or that are blocked, "
        "and send again runs whose message seems lost. Once, or every --interval seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            help="Tick every this many seconds until stopped (default: tick once).",
        )
        parser.add_argument(
            "--iterations",
            type=int,
            default=None,
            help="With --interval, stop after this many ticks.",
        )
        parser.add_argument("--json", action="store_true", help="One JSON object per tick.")

    def handle(self, *args: Any, interval: float | None, iterations: int | None, **options: Any):
        if interval is not None and interval <= 0:
            raise CommandError("--interval must be a positive number of seconds")
        if iterations is not None and iterations <= 0:
            raise CommandError("--iterations must be a positive number")
        done = 0
        while True:
            result = default_engine.tick()
            done += 1
            if options["json"]:
                self.stdout.write(
                    json.dumps(
                        {
                            "woken": result.woken,
                            "recovered": result.recovered,
                            "unblocked": result.unblocked,
                            "resent": result.resent,
                        }
                    )
                )
            elif result.total or interval is None:
                self.stdout.write(
                    f"woken {result.woken}, recovered {result.recovered}, "
                    f"unblocked {result.unblocked}, resent {result.resent}"
                )
            if interval is None or (iterations is not None and done >= iterations):
                return
            time.sleep(interval)
