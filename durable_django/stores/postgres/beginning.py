"""A transaction's ``BEGIN`` sent in the same query string as its first statement.

Inside Django's outermost ``atomic()`` psycopg 3 starts the transaction itself: its
connection is out of autocommit, and before the first statement it sends ``BEGIN`` on its
own and waits for the answer, one round trip more per transaction. A transactional step
(``ctx.transaction``) pays it on every step.

:class:`BegunWithFirstStatement` saves it. Its execute wrapper, the innermost, waits for
the transaction's first statement that Django's cursors send (the execute wrappers and
the database instrumentations see it, as every statement); when that statement can carry
it, the wrapper sends ``BEGIN; <statement>`` as one query string, and psycopg, told for
that one call that the connection is in autocommit, sends no ``BEGIN`` of its own. A
statement that fails leaves the transaction begun and failed, as after psycopg's own
``BEGIN``, and its error is raised at that same call, as before. The cursor is then
moved to the statement's own result, so that what Django reads (its rows, ``rowcount``,
``description``) is the statement's.

The statement carries it only when it can, otherwise psycopg begins as ever: it must be
sent by a ``ClientCursor`` (its parameters quoted into the text: the simple query
protocol, which allows several statements), alone (not ``executemany``), as text (not
psycopg's ``sql.Composed``), on this connection while no transaction is open. A
statement that does not pass through Django's execute (a ``COPY``, the psycopg
connection used directly) finds psycopg out of autocommit as ``atomic()`` left it, and
psycopg sends the ``BEGIN`` first: no statement ever runs outside the transaction. The
``BEGIN`` is psycopg's own for the connection (isolation level, read only, deferrable:
:func:`begin_command`).

Once the server is in the transaction psycopg is left in autocommit until it ends, which
changes nothing while it is open (every statement is in it, whatever the flag), and its
``commit()`` and ``rollback()`` send ``COMMIT`` or ``ROLLBACK`` from the server's state, as
always. Django's end of ``atomic()`` puts the connection back in autocommit, as always.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from .bound import binds_client_side

try:
    from psycopg import ClientCursor, Connection
    from psycopg.pq import TransactionStatus
except ImportError:  # pragma: no cover - without psycopg 3
    ClientCursor = Connection = TransactionStatus = None  # type: ignore[assignment,misc]


class BegunWithFirstStatement:
    """A context in ``connection``'s outermost ``atomic()`` whose ``BEGIN`` is sent with
    its first statement (see the module). ``atomic``, when given, is entered first and
    left last: the whole transaction. Does nothing more than ``atomic`` in a caller's
    transaction, or when the connection's cursors bind server-side."""

    __slots__ = ("atomic", "connection", "wrapper")

    def __init__(
        self,
        connection: BaseDatabaseWrapper,
        atomic: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.connection = connection
        self.atomic = atomic
        self.wrapper: _FirstStatement | None = None

    def __enter__(self) -> None:
        if self.atomic is not None:
            self.atomic.__enter__()
        if _rides(self.connection):
            self.wrapper = _FirstStatement(self.connection.connection)
            self.connection.execute_wrappers.append(self.wrapper)

    def __exit__(self, *exc_info: Any) -> bool | None:
        if self.wrapper is not None:
            self.connection.execute_wrappers.remove(self.wrapper)
            self.wrapper = None
        if self.atomic is not None:
            return self.atomic.__exit__(*exc_info)
        return None


def begin_command(raw: Any) -> str:
    """The ``BEGIN`` psycopg sends for the connection ``raw``, with its transaction
    characteristics (``isolation_level``, ``read_only``, ``deferrable``)."""
    parts = ["BEGIN"]
    if raw.isolation_level is not None:
        parts.append("ISOLATION LEVEL " + raw.isolation_level.name.replace("_", " "))
    if raw.read_only is not None:
        parts.append("READ ONLY" if raw.read_only else "READ WRITE")
    if raw.deferrable is not None:
        parts.append("DEFERRABLE" if raw.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


def _rides(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is in its outermost ``atomic()`` with no transaction open
    yet on the server, its cursors binding client-side."""
    if Connection is None or not connection.in_atomic_block:
        return False
    if len(connection.atomic_blocks) != 1 or connection.savepoint_ids:
        return False
    raw = connection.connection
    return (
        isinstance(raw, Connection)
        and not raw.autocommit
        and raw.pgconn.transaction_status == TransactionStatus.IDLE
        and binds_client_side(raw)
    )


class _FirstStatement:
    """The execute wrapper that sends the transaction's ``BEGIN`` with its first
    statement, then steps aside."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.pending = True

    def __call__(
        self,
        execute: Callable[..., Any],
        sql: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        if not self.pending:
            return execute(sql, params, many, context)
        self.pending = False
        raw = self.raw
        cursor = getattr(context.get("cursor"), "cursor", None)
        if (
            many
            or not isinstance(sql, str)  # psycopg.sql's composed statements, bytes
            or not isinstance(cursor, ClientCursor)
            or cursor.connection is not raw
            or raw.autocommit
            or raw.pgconn.transaction_status != TransactionStatus.IDLE
        ):
            return execute(sql, params, many, context)  # psycopg sends its BEGIN
        raw.autocommit = True  # for this call: the statement carries the BEGIN
        try:
            result = execute(f"{begin_command(raw)}; {sql}", params, many, context)
        finally:
            if raw.pgconn.transaction_status == TransactionStatus.IDLE:
                raw.autocommit = False  # nothing began (the connection failed first)
        cursor.nextset()  # past BEGIN's result, to the statement's
        return result
