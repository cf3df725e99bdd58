"""A transactional step's ``BEGIN`` travels with its first statement on PostgreSQL
(``stores/postgres/beginning.py``): what goes over the wire, counted from libpq's trace of
the connection, and that the transaction is the one ``atomic()`` makes, whatever the step's
first statement is and however it fails."""

from __future__ import annotations

import itertools
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import DataError, OperationalError, connection, transaction

from durable_django import Engine, RunStatus
from durable_django.models import Signal
from durable_django.stores.postgres.beginning import BegunWithFirstStatement, begin_command

from ..helpers import other_connection

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's BEGIN"),
]


@contextmanager
def queries_sent() -> Iterator[list[str]]:
    """The query strings the default connection sends inside the block, read from libpq's
    trace of it: a statement sent with the extended protocol (a kept ``Cursor``) counts as
    ``"(extended)"``, one per round trip."""
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            trace.flush()
            trace.seek(0)
            for line in trace:
                if query := re.match(r'F\t\d+\tQuery\t "(.*)"', line):
                    sent.append(query.group(1))
                elif re.match(r"F\t\d+\tSync\b", line):
                    sent.append("(extended)")


def one_step_run(engine: Engine, fn: Callable[[], Any]) -> str:
    """A run of one transactional step calling ``fn``, started; its id."""
    engine.register("begin.wf", "1", lambda ctx, input: ctx.transaction("it", fn))
    return engine.start("begin.wf", {}).run_id


def written(token: str) -> int:
    return Signal.objects.filter(token=token).count()


def assert_autocommit_again() -> None:
    """The connection is back in autocommit, Django's and psycopg's alike, and works."""
    assert connection.get_autocommit()
    assert connection.connection.autocommit
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_the_begin_travels_with_the_steps_first_statement(orm_engine: Engine):
    token = f"begin:{uuid.uuid4().hex}"
    run_id = one_step_run(orm_engine, lambda: Signal.objects.create(token=token).pk)
    with queries_sent() as sent:
        assert orm_engine.execute(run_id)
    assert orm_engine.get_run(run_id).status == RunStatus.COMPLETED
    assert written(token) == 1
    # The claim, the step's write with its BEGIN, its record with its COMMIT, the end.
    assert len(sent) == 4, sent
    assert "BEGIN" not in [query.strip() for query in sent]
    assert sent[1].startswith('BEGIN; INSERT INTO "durable_signal"'), sent
    assert sent[2].startswith("SELECT durable_record_held_step_v2(") and sent[2].endswith(
        "; COMMIT"
    )
    assert_autocommit_again()


def test_a_step_that_sends_nothing_begins_with_its_record(orm_engine: Engine):
    run_id = one_step_run(orm_engine, lambda: 7)
    with queries_sent() as sent:
        assert orm_engine.execute(run_id)
    assert orm_engine.get_run(run_id).output == 7
    assert len(sent) == 3, sent
    assert re.match(r"BEGIN; SELECT durable_record_held_step_v2\(.*; COMMIT$", sent[1]), sent


@pytest.mark.parametrize(
    ("isolation", "read_only", "deferrable"),
    list(itertools.product([None, 1, 2, 3, 4], [None, True, False], [None, True, False])),
)
def test_the_begin_is_psycopgs_own(isolation: int | None, read_only: Any, deferrable: Any):
    """Bound to psycopg's ``BEGIN`` for every characteristic a connection can have."""
    import psycopg

    connection.ensure_connection()
    raw = psycopg.Connection.connect(**connection.get_connection_params())
    try:
        raw.isolation_level = None if isolation is None else psycopg.IsolationLevel(isolation)
        raw.read_only = read_only
        raw.deferrable = deferrable
        assert begin_command(raw) == raw._get_tx_start_command().decode()
    finally:
        raw.close()


def test_the_transaction_has_the_connections_isolation_level(orm_engine: Engine):
    import psycopg

    def level() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('transaction_isolation')")
            return str(cursor.fetchone()[0])

    run_id = one_step_run(orm_engine, level)
    connection.ensure_connection()
    connection.connection.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    try:
        with queries_sent() as sent:
            assert orm_engine.execute(run_id)
    finally:
        connection.close()
    assert orm_engine.get_run(run_id).output == "serializable"
    assert sent[1].startswith("BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT current_setting")


def test_the_first_statement_reads_as_its_own():
    """What Django reads of the statement that carried the BEGIN (rows, row count) is the
    statement's, not BEGIN's."""
    token = f"begin:{uuid.uuid4().hex}"
    Signal.objects.create(token=token)
    with transaction.atomic(), BegunWithFirstStatement(connection):
        assert Signal.objects.filter(token=token).update(payload={"a": 1}) == 1
        assert connection.connection.pgconn.transaction_status == 2  # INTRANS
    with transaction.atomic(), BegunWithFirstStatement(connection):
        assert [s.payload for s in Signal.objects.filter(token=token)] == [{"a": 1}]
    assert_autocommit_again()


#: A write the database refuses: a token longer than its column.
TOO_LONG = "x" * 10_000


def test_a_first_statement_that_fails_fails_the_step_with_nothing_written(orm_engine: Engine):
    token = f"begin:{uuid.uuid4().hex}"
    run_id = one_step_run(orm_engine, lambda: Signal.objects.create(token=TOO_LONG))
    assert orm_engine.execute(run_id)
    run = orm_engine.get_run(run_id)
    assert run.status == RunStatus.FAILED
    assert "DataError" in str(run.error)
    assert not Signal.objects.filter(token=TOO_LONG).exists()
    assert written(token) == 0
    assert_autocommit_again()


def test_a_failure_at_the_first_statement_is_raised_there():
    with pytest.raises(DataError), transaction.atomic(), BegunWithFirstStatement(connection):
        Signal.objects.create(token=TOO_LONG)
    assert_autocommit_again()


def test_a_statement_around_djangos_execute_is_still_in_the_transaction():
    """psycopg used directly, before any statement through Django's cursors, finds the
    connection out of autocommit as ``atomic()`` left it: it begins the transaction
    itself, and the statement rolls back with it."""
    token = f"begin:{uuid.uuid4().hex}"

    class Undone(Exception):
        pass

    with pytest.raises(Undone), transaction.atomic(), BegunWithFirstStatement(connection):
        connection.connection.execute(
            "INSERT INTO durable_signal (token, payload, created_at, consumed_by) "
            "VALUES (%s, 'null', now(), '')",
            [token],
        )
        Signal.objects.create(token=token + ":2")
        raise Undone
    assert written(token) == 0 and written(token + ":2") == 0
    assert_autocommit_again()


def test_executemany_and_a_server_side_cursor_first_begin_as_ever():
    token = f"begin:{uuid.uuid4().hex}"
    with (
        transaction.atomic(),
        BegunWithFirstStatement(connection),
        connection.cursor() as cursor,
    ):
        cursor.executemany(
            "INSERT INTO durable_signal (token, payload, created_at, consumed_by) "
            "VALUES (%s, 'null', now(), '')",
            [[token + ":1"], [token + ":2"]],
        )
    assert written(token + ":1") == written(token + ":2") == 1
    with transaction.atomic(), BegunWithFirstStatement(connection):
        assert len(list(Signal.objects.filter(token__startswith=token).iterator(1))) == 2
    assert_autocommit_again()


def test_a_composed_statement_first_begins_as_ever():
    from psycopg import sql

    token = f"begin:{uuid.uuid4().hex}"
    statement = sql.SQL(
        "INSERT INTO {} (token, payload, created_at, consumed_by) VALUES (%s, 'null', now(), '')"
    ).format(sql.Identifier("durable_signal"))
    with transaction.atomic(), BegunWithFirstStatement(connection), connection.cursor() as cursor:
        cursor.execute(statement, [token])
    assert written(token) == 1
    assert_autocommit_again()


def test_in_a_callers_transaction_it_leaves_the_statements_alone():
    with transaction.atomic():
        Signal.objects.exists()
        with transaction.atomic(), BegunWithFirstStatement(connection), queries_sent() as sent:
            Signal.objects.exists()
    assert not [query for query in sent if query.startswith("BEGIN")]


def test_a_connection_dropped_before_the_first_statement_raises_and_is_replaced():
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with (
        pytest.raises(OperationalError),
        transaction.atomic(),
        BegunWithFirstStatement(connection),
    ):
        with other_connection() as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
        Signal.objects.exists()
    connection.close()
    assert not Signal.objects.filter(token="never").exists()
    assert_autocommit_again()
