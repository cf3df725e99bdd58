"""One statement of the execution fast path, its parameters bound by the server.

Django's cursor on psycopg 3 is a ``ClientCursor`` (unless ``OPTIONS`` has
``server_side_binding``): it quotes every parameter into the statement's text in Python,
arrays and JSON included (the end of a turn passes 22), and Django wraps a new psycopg
cursor for each statement. :func:`fetch_one` sends the statement with psycopg's plain
``Cursor`` on the same connection instead, one kept per connection: the parameters go
apart from the text (the extended protocol's unnamed statement, as Django's server-side
binding sends it), dumped by psycopg's C adapters. A turn of three steps costs its worker
about 0.2 ms of CPU less (docs/benchmarks.md, "Executing runs"); the start's call of
``durable_start_run_v2`` about 70 µs less.

:func:`execute_kept` keeps one cursor per class: :mod:`.committing` sends a query string
of two statements (a record and its ``COMMIT``) on a ``ClientCursor`` kept the same way,
its parameters quoted into the text, which the simple query protocol allows.

It stays within Django's management of the connection: the connection is opened if need
be (``ensure_connection``), a transaction broken by an earlier error is refused
(``validate_no_broken_transaction``), the execute wrappers (``connection.execute_wrapper``)
see the statement, and psycopg's errors are raised as Django's (``OperationalError``,
``InterfaceError`` ...). The cursor takes the connection's adapters (Django's JSON and
time zone loaders) and its transaction state: inside ``atomic()`` the statement is part
of the transaction, outside it autocommits. Nothing is prepared unless the connection's
``prepare_threshold`` asks for it (Django's default is never), so a pooler in transaction
mode (PgBouncer) sees only unnamed statements. With the query log on (``DEBUG``), or on
psycopg 2, Django's own cursor sends the statement, so that it is logged as any other.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

try:
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from psycopg import Connection, Cursor
    from psycopg.pq import Format
except ImportError:  # pragma: no cover - without psycopg 3
    Connection = Cursor = None  # type: ignore[assignment,misc]

#: ``timestamptz``'s type oid.
_TIMESTAMPTZ_OID = 1184


def fetch_one(
    connection: BaseDatabaseWrapper, statement: str, params: list[Any]
) -> tuple[Any, ...] | None:
    """Execute ``statement`` with ``params`` on ``connection``; its first row, if any."""
    return execute_kept(connection, statement, params, Cursor)


def execute_kept(
    connection: BaseDatabaseWrapper,
    statement: str,
    params: list[Any],
    factory: Any,
    *,
    prepare: bool | None = None,
) -> tuple[Any, ...] | None:
    """Execute ``statement`` on a cursor of class ``factory`` (psycopg's ``Cursor``, or
    its ``ClientCursor`` for a query string of several statements) kept per connection;
    the first row of its first result, if any. Through Django's cursor with the query
    log on or on psycopg 2; through the execute wrappers when there are any. ``prepare``
    is psycopg's (``None``: as the connection's ``prepare_threshold`` says)."""
    if connection.queries_logged or Connection is None:
        return _through_django(connection, statement, params)
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, Connection):  # pragma: no cover - psycopg 2
        return _through_django(connection, statement, params)
    connection.validate_thread_sharing()
    if connection.execute_wrappers:
        return _wrapped(connection, raw, statement, params, factory, prepare)
    cursor = _cursor(connection, raw, factory)
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        cursor.execute(statement, params, prepare=prepare)
        row: tuple[Any, ...] | None = cursor.fetchone()
    return row


def _cursor(connection: BaseDatabaseWrapper, raw: Any, factory: Any) -> Any:
    """The cursor of class ``factory`` on ``raw``, made once per psycopg connection and
    time zone: a cursor copies its connection's adapters when it is made, which costs
    about as much as quoting the parameters it saves. It is used by one statement at a
    time (its row is read before the next is sent), as a connection is one thread's."""
    timezone = connection.timezone
    kept_cursors = getattr(connection, "_durable_kept_cursors", None)
    if kept_cursors is None:
        kept_cursors = connection._durable_kept_cursors = {}  # type: ignore[attr-defined]
    kept = kept_cursors.get(factory)
    if kept is not None and kept[0] is raw and kept[1] is timezone and not kept[2].closed:
        return kept[2]
    cursor = _new_cursor(raw, timezone, factory)
    kept_cursors[factory] = (raw, timezone, cursor)
    return cursor


def _new_cursor(raw: Any, timezone: Any, factory: Any) -> Any:
    cursor = factory(raw)
    # As Django's create_cursor: the time zone of the cursor only if the connection's differs.
    loader = raw.adapters.get_loader(_TIMESTAMPTZ_OID, Format.TEXT)
    if getattr(loader, "timezone", None) != timezone:
        register_tzloader(timezone, cursor)
    return cursor


def _wrapped(
    connection: BaseDatabaseWrapper,
    raw: Any,
    statement: str,
    params: list[Any],
    factory: Any,
    prepare: bool | None,
) -> tuple[Any, ...] | None:
    """:func:`execute_kept` through the connection's execute wrappers, on a cursor of its
    own (a wrapper may send statements of its own)."""
    cursor = _new_cursor(raw, connection.timezone, factory)

    def execute(sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        connection.validate_no_broken_transaction()
        with connection.wrap_database_errors:
            return cursor.execute(sql, params, prepare=prepare)

    executor: Any = execute
    for wrapper in reversed(connection.execute_wrappers):
        executor = functools.partial(wrapper, executor)
    with cursor:
        executor(statement, params, False, {"connection": connection, "cursor": cursor})
        with connection.wrap_database_errors:
            row: tuple[Any, ...] | None = cursor.fetchone()
    return row


def _through_django(
    connection: BaseDatabaseWrapper, statement: str, params: list[Any]
) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row: tuple[Any, ...] | None = cursor.fetchone()
        return row
