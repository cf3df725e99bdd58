"""The ORM store's server-side routines kept as data: one ``.sql`` file per dialect
(``stores/postgres/functions.sql``, ``stores/mariadb/procedures.sql``), the only copy of
their code; the one reader of them that the migrations and the tests share, and the one
migration operation installing them (:class:`InstallRoutines`, a subclass per dialect).

Every file follows the same rules, written in its header: nothing but comments and
``CREATE OR REPLACE <kind> durable_<what>_v<N>(`` statements, each ending with a line of
its own (``$$;`` for PostgreSQL's dollar-quoted bodies, ``END;`` for MariaDB's compound
statements); every name versioned and unique; a released version never changes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from django.db.migrations.operations.base import OperationCategory

from .database_operations import DatabaseOperation

#: A versioned name: ``durable_`` and what the routine does, then ``_v`` and its version.
_VERSIONED_NAME = re.compile(r"durable_[a-z_]+_v[1-9][0-9]*")
_COMMENT = re.compile(r"^--.*$", re.MULTILINE)


@dataclass(frozen=True)
class RoutineFile:
    """A ``.sql`` file of routines of one ``kind`` (``FUNCTION``, ``PROCEDURE``), each
    statement ending with the line ``last_line``."""

    path: Path
    kind: str
    last_line: str

    @functools.cached_property
    def _statement(self) -> re.Pattern[str]:
        return re.compile(
            rf"^CREATE OR REPLACE {self.kind} (?P<name>\w+)\(.*?^{re.escape(self.last_line)}$",
            re.MULTILINE | re.DOTALL,
        )

    def definitions(self) -> dict[str, str]:
        """``{name: statement}`` for every routine of the file, in the file's order (see
        :meth:`parse`); read once per process."""
        return _read(self)

    def parse(self, text: str) -> dict[str, str]:
        """``{name: statement}`` for every routine of ``text``, in its order.

        Raises :class:`ValueError` when ``text`` holds anything else than comments and
        such statements, or a name that is not versioned (``durable_<what>_v<N>``) or
        not unique.
        """
        definitions: dict[str, str] = {}
        for match in self._statement.finditer(text):
            name = match["name"]
            if not _VERSIONED_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a versioned name (durable_<what>_v<N>)")
            if name in definitions:
                raise ValueError(f"{name!r} is defined twice")
            definitions[name] = match[0]
        rest = _COMMENT.sub("", self._statement.sub("", text)).strip()
        if rest:
            raise ValueError(f"not a CREATE OR REPLACE {self.kind} statement: {rest[:80]!r}")
        return definitions

    def unknown(self, names: list[str]) -> list[str]:
        """The names of ``names`` the file does not define, sorted."""
        return sorted(set(names) - self.definitions().keys())


@functools.cache
def _read(file: RoutineFile) -> dict[str, str]:
    return file.parse(file.path.read_text(encoding="utf-8"))


class InstallRoutines(DatabaseOperation):
    """Install the routines ``names`` of a dialect's :class:`RoutineFile` on a database of
    that dialect where the routers let the app migrate (``router.allow_migrate(alias,
    app_label, **hints)``, as ``RunSQL`` asks); backwards, drop them. Other databases get
    nothing.

    A migration names the routines it installs: a later one adding a new version of a
    routine installs that version alone, and its reverse drops that version alone. A
    subclass gives the file and says which databases it applies to.

    With ``replace``, a migration installs again routines an earlier one installed, whose
    text changed before their first release (a changed result, which ``CREATE OR
    REPLACE`` alone refuses on PostgreSQL): each is dropped, then created from the file;
    backwards it does nothing, and the earlier migration's reverse drops them.
    """

    category = OperationCategory.ADDITION

    #: The file the routines are read from.
    file: ClassVar[RoutineFile]

    def __init__(
        self, names: Sequence[str], hints: dict[str, Any] | None = None, replace: bool = False
    ) -> None:
        unknown = self.file.unknown(list(names))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: {self.file.path.name} does not define {unknown}"
            )
        self.names = list(names)
        self.hints = hints or {}
        self.replace = replace

    def applies_to(self, connection: Any) -> bool:
        """Whether ``connection``'s database is of the file's dialect."""
        raise NotImplementedError

    def statement(self, name: str, schema_editor: Any) -> str:
        """The statement installing ``name`` on ``schema_editor``'s database: the file's."""
        return self.file.definitions()[name]

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self.allowed(app_label, schema_editor, to_state):
            for name in self.names:
                if self.replace:
                    self._drop(name, schema_editor)
                # No parameters: the statement is sent as it is written, ``%`` included.
                schema_editor.execute(self.statement(name, schema_editor), params=None)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self.allowed(app_label, schema_editor, from_state) and not self.replace:
            for name in reversed(self.names):
                self._drop(name, schema_editor)

    def _drop(self, name: str, schema_editor: Any) -> None:
        # A versioned name is never overloaded: it names one routine.
        schema_editor.execute(
            f"DROP {self.file.kind} IF EXISTS {schema_editor.quote_name(name)}", params=None
        )

    def describe(self) -> str:
        return f"Install the routines {', '.join(self.names)} of {self.file.path.name}"
