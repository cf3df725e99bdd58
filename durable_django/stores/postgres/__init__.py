"""The ORM store's PostgreSQL functions: ``functions.sql``, the only copy of their code,
read by :class:`~durable_django.stores.routines.RoutineFile`, the reader the migrations
and the tests share with MariaDB's ``procedures.sql``."""

from __future__ import annotations

from pathlib import Path

from ..routines import RoutineFile

#: The file holding every function, with the rule its names follow in its header.
FUNCTIONS_FILE = Path(__file__).with_name("functions.sql")

#: :data:`FUNCTIONS_FILE` as the reader sees it: ``CREATE OR REPLACE FUNCTION``
#: statements, each with a dollar-quoted body ending with a line ``$$;``.
FUNCTIONS = RoutineFile(FUNCTIONS_FILE, "FUNCTION", "$$;")


def function_definitions() -> dict[str, str]:
    """``{name: CREATE OR REPLACE FUNCTION statement}`` for every function of
    :data:`FUNCTIONS_FILE`, in the file's order (see :func:`parse_functions`)."""
    return FUNCTIONS.definitions()


def parse_functions(text: str) -> dict[str, str]:
    """``{name: CREATE OR REPLACE FUNCTION statement}`` for every function of ``text``.

    Raises :class:`ValueError` when ``text`` holds anything else than comments and such
    statements, or a name that is not versioned (``durable_<what>_v<N>``) or not unique.
    """
    return FUNCTIONS.parse(text)
