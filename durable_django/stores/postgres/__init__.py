"""The ORM store's PostgreSQL functions: ``functions.sql``, the only copy of their code,
and the reading of it that the migrations and the tests share."""

from __future__ import annotations

import functools
import re
from pathlib import Path

#: The file holding every function, with the rule its names follow in its header.
FUNCTIONS_FILE = Path(__file__).with_name("functions.sql")

#: One function of the file: its ``CREATE OR REPLACE FUNCTION`` statement, whose
#: dollar-quoted body ends with a line ``$$;``.
_FUNCTION = re.compile(
    r"^CREATE OR REPLACE FUNCTION (?P<name>\w+)\(.*?^\$\$;$", re.MULTILINE | re.DOTALL
)
#: A versioned name: ``durable_`` and what the function does, then ``_v`` and its version.
_VERSIONED_NAME = re.compile(r"durable_[a-z_]+_v[1-9][0-9]*")
_COMMENT = re.compile(r"^--.*$", re.MULTILINE)


@functools.cache
def function_definitions() -> dict[str, str]:
    """``{name: CREATE OR REPLACE FUNCTION statement}`` for every function of
    :data:`FUNCTIONS_FILE`, in the file's order (see :func:`parse_functions`)."""
    return parse_functions(FUNCTIONS_FILE.read_text(encoding="utf-8"))


def parse_functions(text: str) -> dict[str, str]:
    """``{name: CREATE OR REPLACE FUNCTION statement}`` for every function of ``text``.

    Raises :class:`ValueError` when ``text`` holds anything else than comments and such
    statements, or a name that is not versioned (``durable_<what>_v<N>``) or not unique.
    """
    definitions: dict[str, str] = {}
    for match in _FUNCTION.finditer(text):
        name = match["name"]
        if not _VERSIONED_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a versioned name (durable_<what>_v<N>)")
        if name in definitions:
            raise ValueError(f"{name!r} is defined twice")
        definitions[name] = match[0]
    rest = _COMMENT.sub("", _FUNCTION.sub("", text)).strip()
    if rest:
        raise ValueError(f"not a CREATE OR REPLACE FUNCTION statement: {rest[:80]!r}")
    return definitions
