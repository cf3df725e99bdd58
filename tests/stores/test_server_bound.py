"""The execution fast path's statements, their parameters bound by the server
(``stores/postgres/bound.py``): within Django's management of the connection."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from durable_django.stores.postgres.bound import fetch_one

from ..helpers import other_connection

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the fast path is PostgreSQL's"),
]


def test_the_parameters_go_apart_from_the_text_and_the_row_reads_as_djangos():
    moment = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    row = fetch_one(
        connection,
        "SELECT %s::text, %s::text[], %s::integer, %s::timestamptz, %s::jsonb, %s::text",
        ["it's", ["a", "b'c"], 7, moment, '{"k": [1, 2]}', None],
    )
    # jsonb reads as text, as Django's loaders make it; timestamptz as an aware UTC time.
    assert row == ("it's", ["a", "b'c"], 7, moment, '{"k": [1, 2]}', None)
    assert fetch_one(connection, "SELECT 1 WHERE false", []) is None


def test_the_connection_is_opened_when_closed():
    connection.close()
    assert fetch_one(connection, "SELECT %s::integer", [1]) == (1,)


def test_the_execute_wrappers_see_the_statement():
    seen: list[tuple[str, Any]] = []

    def spy(execute, sql, params, many, context):
        seen.append((sql, params))
        assert context["connection"] is connections["default"]
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        assert fetch_one(connection, "SELECT %s::integer", [3]) == (3,)
    assert seen == [("SELECT %s::integer", [3])]


def test_with_the_query_log_the_statement_is_logged():
    with CaptureQueriesContext(connection) as queries:
        assert fetch_one(connection, "SELECT %s::integer", [4]) == (4,)
    assert [q["sql"] for q in queries.captured_queries] == ["SELECT 4::integer"]


def test_errors_are_djangos():
    with pytest.raises(DatabaseError) as raised:
        fetch_one(connection, "SELECT 1/%s::integer", [0])
    assert type(raised.value).__module__ == "django.db.utils"


def test_a_dropped_connection_raises_djangos_operational_error():
    (pid,) = fetch_one(connection, "SELECT pg_backend_pid()", [])  # type: ignore[misc]
    with other_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError):
        fetch_one(connection, "SELECT 1", [])
    connection.close()


def test_inside_atomic_it_is_part_of_the_transaction():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE bound_t (v integer)")
    try:
        with transaction.atomic():
            fetch_one(connection, "INSERT INTO bound_t VALUES (%s) RETURNING v", [1])
            transaction.set_rollback(True)
        assert fetch_one(connection, "SELECT count(*) FROM bound_t", []) == (0,)
        with transaction.atomic():
            fetch_one(connection, "INSERT INTO bound_t VALUES (%s) RETURNING v", [2])
        assert fetch_one(connection, "SELECT count(*) FROM bound_t", []) == (1,)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE bound_t")


def test_a_broken_transaction_is_refused():
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False):
            fetch_one(connection, "SELECT 1/%s::integer", [0])
        with pytest.raises(TransactionManagementError):
            fetch_one(connection, "SELECT 1", [])


def test_nothing_is_prepared():
    for _ in range(10):
        fetch_one(connection, "SELECT %s::integer", [5])
    assert fetch_one(connection, "SELECT count(*) FROM pg_prepared_statements", []) == (0,)


def test_one_cursor_per_connection_usable_after_an_error():
    from psycopg import Cursor

    fetch_one(connection, "SELECT 1", [])
    kept = connection._durable_kept_cursors[Cursor][3].cursor
    with pytest.raises(DatabaseError):
        fetch_one(connection, "SELECT 1/%s::integer", [0])
    assert fetch_one(connection, "SELECT %s::integer", [6]) == (6,)
    assert connection._durable_kept_cursors[Cursor][3].cursor is kept
    connection.close()
    assert fetch_one(connection, "SELECT %s::integer", [7]) == (7,)
    assert connection._durable_kept_cursors[Cursor][3].cursor is not kept


def test_a_cursor_factory_watching_execute_makes_the_kept_cursor():
    """An instrumentation's factory (OpenTelemetry's, django-prometheus') sees the
    statement, even when it is installed after the kept cursor was made."""
    from psycopg import ClientCursor

    seen: list[str] = []

    class Watching(ClientCursor):
        def execute(self, query, params=None, **kwargs):
            seen.append(query)
            return super().execute(query, params, **kwargs)

    fetch_one(connection, "SELECT 1", [])
    raw = connection.connection
    own = raw.cursor_factory
    raw.cursor_factory = Watching
    try:
        assert fetch_one(connection, "SELECT %s::integer", [8]) == (8,)
    finally:
        raw.cursor_factory = own
    assert seen == ["SELECT %s::integer"]
    fetch_one(connection, "SELECT 1", [])
    assert seen == ["SELECT %s::integer"]
