"""The ORM store's MariaDB procedures: ``procedures.sql``, the only copy of their code,
read by :class:`~durable_django.stores.routines.RoutineFile` as PostgreSQL's
``functions.sql`` is, and the filling of its collation placeholders."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ..routines import RoutineFile

#: The file holding every procedure, with the rule its names follow in its header.
PROCEDURES_FILE = Path(__file__).with_name("procedures.sql")

#: :data:`PROCEDURES_FILE` as the reader sees it: ``CREATE OR REPLACE PROCEDURE``
#: statements, each ending with a line ``END;``.
PROCEDURES = RoutineFile(PROCEDURES_FILE, "PROCEDURE", "END;")

#: A placeholder of the file: ``{charset:TABLE.COLUMN}`` or ``{introducer:TABLE.COLUMN}``.
_PLACEHOLDER = re.compile(r"\{(?P<form>charset|introducer):(?P<table>\w+)\.(?P<column>\w+)\}")


def procedure_definitions() -> dict[str, str]:
    """``{name: CREATE OR REPLACE PROCEDURE statement}`` for every procedure of
    :data:`PROCEDURES_FILE`, in the file's order, placeholders unfilled."""
    return PROCEDURES.definitions()


def parse_procedures(text: str) -> dict[str, str]:
    """``{name: CREATE OR REPLACE PROCEDURE statement}`` for every procedure of ``text``.

    Raises :class:`ValueError` as :meth:`RoutineFile.parse` does.
    """
    return PROCEDURES.parse(text)


def render(statement: str, charset_of: Callable[[str, str], tuple[str, str]]) -> str:
    """``statement`` as sent to the server: its placeholders filled in from
    ``charset_of(table, column) -> (character set, collation)``, and without the ``;``
    that ends it in the file (a driver sends one statement)."""

    def fill(match: re.Match[str]) -> str:
        charset, collation = charset_of(match["table"], match["column"])
        if match["form"] == "introducer":
            return f"_{charset}"
        return f"CHARACTER SET {charset} COLLATE {collation}"

    return _PLACEHOLDER.sub(fill, statement).removesuffix(";")
