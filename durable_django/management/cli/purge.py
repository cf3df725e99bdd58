"""``manage.py durable purge --older-than AGE``: delete finished runs and taken signals."""

from __future__ import annotations

import datetime
import re
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...status import TERMINAL_STATUSES
from .base import Subcommand

#: An age: a number and a unit, e.g. ``30d``, ``12h``, ``90m``, ``3600s``.
AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhms])\s*$")
UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_age(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m`` or ``3600s`` as a positive ``timedelta``."""
    match = AGE.match(text)
    if match is None or float(match[1]) <= 0:
        raise CommandError(
            f"--older-than takes a positive age with a unit, like 30d, 12h, 90m or 3600s; "
            f"not {text!r}"
        )
    return datetime.timedelta(**{UNITS[match[2]]: float(match[1])})


class PurgeSubcommand(Subcommand):
    name = "purge"
    help = (
        "Delete the runs that finished more than --older-than ago, with their tags and "
        "recorded steps, and the signals taken before then; and fair quotas' expired "
        "tickets. Active runs are never deleted."
    )

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="AGE",
            help="How long ago a run must have finished: 30d, 12h, 90m or 3600s.",
        )
        parser.add_argument(
            "--status",
            action="append",
            choices=sorted(TERMINAL_STATUSES),
            help="Only runs that ended so (repeat it for several; default: all three).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=1000,
            metavar="N",
            help="Runs deleted per transaction (default 1000).",
        )

    def handle(self, **options: Any) -> None:
        age = parse_age(options["older_than"])
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be a positive number")
        result = self.engine.purge(
            age, statuses=options["status"], batch_size=options["batch_size"]
        )
        if self.as_json:
            self.emit_json(asdict(result))
        else:
            tickets = f", {result.tickets} expired ticket(s)" if result.tickets else ""
            self.write(
                f"deleted {result.runs} run(s){tickets} and {result.signals} taken signal(s)"
            )


subcommand = PurgeSubcommand
