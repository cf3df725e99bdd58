"""The subcommands of ``manage.py durable``, one module each.

Each module listed in :data:`SUBCOMMANDS` defines a :class:`~.base.Subcommand` subclass
and names it ``subcommand``; ``manage.py durable`` builds one argparse subparser per
module, in this order. A new subcommand is a new module added to the list.
"""

from __future__ import annotations

from importlib import import_module

from .base import Subcommand

#: The modules defining the subcommands, in the order ``--help`` lists them.
SUBCOMMANDS: list[str] = [
    "durable_django.management.cli.runs",
    "durable_django.management.cli.show",
    "durable_django.management.cli.cancel",
    "durable_django.management.cli.retry",
    "durable_django.management.cli.signal",
    "durable_django.management.cli.quota",
    "durable_django.management.cli.tick",
    "durable_django.management.cli.schedules",
    "durable_django.management.cli.fire",
    "durable_django.management.cli.purge",
]


def load_subcommands() -> dict[str, type[Subcommand]]:
    """The subcommand classes by name, in :data:`SUBCOMMANDS` order."""
    classes = [import_module(path).subcommand for path in SUBCOMMANDS]
    return {cls.name: cls for cls in classes}


__all__ = ["SUBCOMMANDS", "Subcommand", "load_subcommands"]
