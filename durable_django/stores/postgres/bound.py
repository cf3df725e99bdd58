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

The kept cursor is seen as Django's own are. It is wrapped in Django's
``CursorWrapper`` (``connection.make_cursor``), whose ``execute`` sends it: the execute
wrappers (``connection.execute_wrapper``) and what patches ``CursorWrapper.execute``
(sentry-sdk's Django integration) see the statement, a transaction broken by an earlier
error is refused, and psycopg's errors are raised as Django's (``OperationalError``,
``InterfaceError`` ...). When the connection's cursor factory is not psycopg's own but
overrides ``execute`` (OpenTelemetry's psycopg instrumentation, django-prometheus'
database backends), the kept cursor is made by that factory, so that they see the
statement too; its parameters are then bound as that factory binds them (Django's
default: quoted client-side).

It stays within Django's management of the connection: the connection is opened if need
be (``ensure_connection``). The cursor takes the connection's adapters (Django's JSON and
time zone loaders) and its transaction state: inside ``atomic()`` the statement is part
of the transaction, outside it autocommits. Nothing is prepared unless the connection's
``prepare_threshold`` asks for it (Django's default is never), so a pooler in transaction
mode (PgBouncer) sees only unnamed statements. With the query log on (``DEBUG``), or on
psycopg 2, Django's own cursor sends the statement, so that it is logged as any other,
its parameters quoted.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

try:
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from psycopg import ClientCursor, Connection, Cursor
    from psycopg.pq import Format
except ImportError:  # pragma: no cover - without psycopg 3
    ClientCursor = Connection = Cursor = None  # type: ignore[assignment,misc]

#: ``timestamptz``'s type oid.
_TIMESTAMPTZ_OID = 1184


def fetch_one(
    connection: BaseDatabaseWrapper, statement: str, params: list[Any]
) -> tuple[Any, ...] | None:
    """Execute ``statement`` with ``params`` on ``connection``; its first row, if any."""
    return execute_kept(connection, statement, params, Cursor)


def execute_kept(
    connection: BaseDatabaseWrapper, statement: str, params: list[Any], factory: Any
) -> tuple[Any, ...] | None:
    """Execute ``statement`` on a cursor of class ``factory`` (psycopg's ``Cursor``, or
    its ``ClientCursor`` for a query string of several statements) kept per connection,
    through Django's ``CursorWrapper``; the first row of its first result, if any.
    Through Django's cursor with the query log on or on psycopg 2."""
    if connection.queries_logged or Connection is None:
        return _through_django(connection, statement, params)
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, Connection):  # pragma: no cover - psycopg 2
        return _through_django(connection, statement, params)
    connection.validate_thread_sharing()
    cursor = _cursor(connection, raw, factory)
    cursor.execute(statement, params)
    with connection.wrap_database_errors:
        row: tuple[Any, ...] | None = cursor.cursor.fetchone()
    return row


def binds_client_side(raw: Any) -> bool:
    """Whether the cursors of the DB-API connection ``raw`` are psycopg 3's
    ``ClientCursor``, which send a query string of several statements: Django's default,
    unless ``OPTIONS["server_side_binding"]``, or an instrumentation gave the connection
    a factory of its own (``PsycopgInstrumentor.instrument_connection`` gives psycopg's
    ``Cursor``, bound by the server)."""
    factory = getattr(raw, "cursor_factory", None)
    return (
        ClientCursor is not None and isinstance(factory, type) and issubclass(factory, ClientCursor)
    )


def kept_class(installed: Any, factory: Any) -> Any:
    """The class of the cursor :func:`execute_kept` keeps for ``factory`` on a connection
    whose cursor factory is ``installed``: ``factory``, unless ``installed`` watches
    ``execute`` (an instrumentation's), whose cursors are then made so that it sees the
    statements."""
    return installed if installed.execute is not Cursor.execute else factory


def kept_binds_client_side(connection: BaseDatabaseWrapper) -> bool:
    """Whether what :func:`execute_kept` sends a ``ClientCursor``'s statement on binds
    client-side (a query string of several statements): the kept cursor, unless an
    instrumentation's factory binding on the server stands in its place, also with
    ``OPTIONS["server_side_binding"]``, whose factory only Django's cursors are made of;
    Django's cursor itself with the query log on."""
    raw = connection.connection
    if connection.queries_logged:
        return binds_client_side(raw)
    return ClientCursor is not None and issubclass(
        kept_class(raw.cursor_factory, ClientCursor), ClientCursor
    )


def _cursor(connection: BaseDatabaseWrapper, raw: Any, factory: Any) -> CursorWrapper:
    """Django's wrapper of the cursor of class ``factory`` on ``raw`` (or of the
    connection's factory, when it watches ``execute``), made once per psycopg connection,
    time zone and connection's factory: a cursor copies its connection's adapters when it
    is made, which costs about as much as quoting the parameters it saves. It is used by
    one statement at a time (its row is read before the next is sent), as a connection
    is one thread's."""
    timezone = connection.timezone
    installed = raw.cursor_factory
    kept_cursors = getattr(connection, "_durable_kept_cursors", None)
    if kept_cursors is None:
        kept_cursors = connection._durable_kept_cursors = {}  # type: ignore[attr-defined]
    kept = kept_cursors.get(factory)
    if (
        kept is not None
        and kept[0] is raw
        and kept[1] is timezone
        and kept[2] is installed
        and not kept[3].cursor.closed
    ):
        wrapper: CursorWrapper = kept[3]
        return wrapper
    wrapper = connection.make_cursor(_new_cursor(raw, timezone, kept_class(installed, factory)))
    kept_cursors[factory] = (raw, timezone, installed, wrapper)
    return wrapper


def _new_cursor(raw: Any, timezone: Any, factory: Any) -> Any:
    cursor = factory(raw)
    # As Django's create_cursor: the time zone of the cursor only if the connection's differs.
    loader = raw.adapters.get_loader(_TIMESTAMPTZ_OID, Format.TEXT)
    if getattr(loader, "timezone", None) != timezone:
        register_tzloader(timezone, cursor)
    return cursor


def _through_django(
    connection: BaseDatabaseWrapper, statement: str, params: list[Any]
) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row: tuple[Any, ...] | None = cursor.fetchone()
        return row
