"""The checks of a database that holds runs, which ``OrmStore.check`` gives for its own:
settings under which the quota could admit too many runs, and columns that would compare
ids and keys inexactly."""

from __future__ import annotations

from typing import Any

from django.core import checks

_SAFE_ISOLATION = {None, "", "read committed", "read uncommitted"}

#: The migration that gives the columns holding ids and keys their binary collation.
BINARY_COLLATION_MIGRATION = ("durable_django", "0001_initial")


def database_warnings(databases: dict[str, dict[str, Any]]) -> list[checks.CheckMessage]:
    """Flag, for each database of a ``DATABASES`` dict, settings under which the quota
    could admit too many runs: SQLite without a write-locking transaction mode
    (``W001``), an isolation level above READ COMMITTED (``E002``)."""
    messages: list[checks.CheckMessage] = []
    for alias, config in databases.items():
        engine = config.get("ENGINE", "")
        options = config.get("OPTIONS", {}) or {}
        if engine.endswith("sqlite3") and str(options.get("transaction_mode", "")).upper() not in (
            "IMMEDIATE",
            "EXCLUSIVE",
        ):
            messages.append(
                checks.Warning(
                    f"database {alias!r} is SQLite without a write-locking transaction mode",
                    hint=(
                        f'Set DATABASES["{alias}"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" '
                        "so concurrent starts wait for each other instead of failing with "
                        '"database is locked".'
                    ),
                    id="durable_django.W001",
                )
            )
        isolation = options.get("isolation_level")
        if engine.endswith(("mysql", "postgresql")) and _isolation_name(isolation) not in (
            _SAFE_ISOLATION
        ):
            # An error, not a warning: at these levels the quota silently admits too many.
            messages.append(
                checks.Error(
                    f"database {alias!r} runs transactions at isolation level {isolation!r}",
                    hint=(
                        "The quota count must see every run committed before its lock was "
                        "taken; keep Django's default READ COMMITTED isolation."
                    ),
                    id="durable_django.E002",
                )
            )
    return messages


def _isolation_name(isolation: Any) -> str | None:
    if isinstance(isolation, str) or isolation is None:
        return isolation.lower() if isolation else isolation
    try:  # psycopg's IsolationLevel enum
        from psycopg import IsolationLevel
    except ImportError:  # pragma: no cover
        return str(isolation)
    try:
        return IsolationLevel(isolation).name.replace("_", " ").lower()
    except ValueError:
        return str(isolation)


def collation_errors(connection: Any) -> list[checks.CheckMessage]:
    """Refuse, on MySQL/MariaDB, columns holding run ids and keys that compare without
    regard to case, accents or trailing spaces (``E004``); it reads the database.

    Only once migration 0001 is recorded as applied (before, ``migrate`` makes the tables
    with their collations): a column without the collation its field asks for was made
    otherwise, or the migration was faked.
    """
    if connection.vendor != "mysql":
        return []
    from django.apps import apps
    from django.db import DatabaseError
    from django.db.migrations.recorder import MigrationRecorder

    try:
        if BINARY_COLLATION_MIGRATION not in MigrationRecorder(connection).applied_migrations():
            return []
        expected = {
            (model._meta.db_table, field.column): collation
            for model in apps.get_app_config("durable_django").get_models()
            for field in model._meta.local_fields
            if (collation := field.db_parameters(connection).get("collation"))
        }
        tables = sorted({table for table, _ in expected})
        placeholders = ", ".join(["%s"] * len(tables))
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({placeholders})",
                tables,
            )
            found = {(table, column): collation for table, column, collation in cursor.fetchall()}
    except DatabaseError:
        return []  # not migrated, or not reachable: Django's own checks say so
    wrong = [
        f"{table}.{column} ({found[table, column]})"
        for (table, column), collation in expected.items()
        if (table, column) in found and found[table, column] != collation
    ]
    if not wrong:
        return []
    wanted = ", ".join(sorted(set(expected.values())))
    return [
        checks.Error(
            f"database {connection.alias!r}: columns holding run ids, quota keys, tags, "
            "workflow names, namespaces, signal tokens or schedule keys compare without "
            f"regard to case, accents or trailing spaces: {', '.join(wrong)}",
            hint=(
                f"They need the binary, no-pad collation {wanted} that migration "
                "durable_django 0001 gives them when it makes the tables. Change them to "
                "it (`ALTER TABLE ... MODIFY ... COLLATE ...`), or make the tables again: "
                "`python manage.py migrate durable_django zero --skip-checks`, which "
                "deletes every run, then `python manage.py migrate durable_django`."
            ),
            id="durable_django.E004",
        )
    ]
