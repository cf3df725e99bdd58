"""Migration operations made on MariaDB only, where the database routers allow them:
:class:`InstallProcedures` installs procedures of ``procedures.sql`` (and drops them
backwards)."""

from __future__ import annotations

from typing import Any

from ..routines import InstallRoutines
from . import PROCEDURES, render


class InstallProcedures(InstallRoutines):
    """Install the procedures ``names`` of ``procedures.sql`` on a MariaDB database where
    the routers let the app migrate; backwards, drop them. MySQL, SQLite and PostgreSQL
    get nothing.

    Each procedure's placeholders are filled in with the character set and collation of
    the columns they name, read from ``information_schema`` of the database migrated, so
    the tables must exist (a migration after the one creating them installs it).
    """

    file = PROCEDURES

    def applies_to(self, connection: Any) -> bool:
        return connection.vendor == "mysql" and bool(connection.mysql_is_mariadb)

    def statement(self, name: str, schema_editor: Any) -> str:
        with schema_editor.connection.cursor() as cursor:

            def charset_of(table: str, column: str) -> tuple[str, str]:
                cursor.execute(
                    "SELECT CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = %s",
                    [table, column],
                )
                row = cursor.fetchone()
                if row is None:
                    raise ValueError(f"InstallProcedures: no column {table}.{column}")
                return str(row[0]), str(row[1])

            return render(super().statement(name, schema_editor), charset_of)

    def describe(self) -> str:
        return f"Install the MariaDB procedures {', '.join(self.names)}"

    @property
    def migration_name_fragment(self) -> str:
        return "mariadb_procedures"
