"""``manage.py durable SUBCOMMAND``: inspect and operate runs and quotas.

The subcommands are listed in :data:`durable_django.management.cli.SUBCOMMANDS`; each
takes ``--json`` for output meant for scripts.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ..cli import load_subcommands


class Command(BaseCommand):
    help = (
        "Inspect and operate durable runs: list, show, cancel, retry, signal, quota usage, "
        "tick, schedules, fire, purge. `manage.py durable SUBCOMMAND --help` for each."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        self.subcommands = load_subcommands()
        subparsers = parser.add_subparsers(
            dest="subcommand", metavar="SUBCOMMAND", title="subcommands", required=True
        )
        for name, subcommand in self.subcommands.items():
            subparser = subparsers.add_parser(
                name, help=subcommand.help, description=subcommand.help
            )
            subparser.add_argument("--json", action="store_true", help="Output JSON, for scripts.")
            subcommand.add_arguments(subparser)

    def handle(self, *args: Any, subcommand: str, json: bool, **options: Any) -> None:
        self.subcommands[subcommand](self, as_json=json).handle(**options)
