"""A statement and the ``COMMIT`` of its transaction in one round trip.

A transactional step's record is the last statement of its transaction: sending
``COMMIT`` after it in the same query string saves the round trip the commit of
``atomic()`` would make (psycopg's ``ClientCursor`` quotes the parameters into the text
and sends it with the simple query protocol, which allows several statements). The server
runs the ``COMMIT`` only when the statement succeeded; psycopg then sees the connection
idle, and ``atomic()``'s own commit sends nothing (psycopg skips a commit outside a
transaction) but runs the ``on_commit`` callbacks as always.

Done only where it is sound: the ``atomic()`` is the connection's outermost (a savepoint
of a caller's transaction must not commit it), nothing asked for a rollback, and the
kept cursor binds client-side (``bound.kept_binds_client_side``). It does with Django's
``OPTIONS["server_side_binding"]`` too, which only Django's own cursors follow; not when
an instrumentation's cursor factory binding on the server stands in its place, which
sends one statement per query.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from .bound import execute_kept, kept_binds_client_side

try:
    from psycopg import ClientCursor
except ImportError:  # pragma: no cover - without psycopg 3
    ClientCursor = None  # type: ignore[assignment,misc]

#: The SQLSTATE ``durable_record_held_step_v2`` raises when the run is no longer held.
NOT_HELD_SQLSTATE = "DUR01"


def commits_in_statement(connection: BaseDatabaseWrapper) -> bool:
    """Whether the transaction of ``connection``'s only ``atomic()`` may be committed by a
    statement of its own (:func:`execute_and_commit`)."""
    if not connection.in_atomic_block:
        return False
    if len(connection.atomic_blocks) != 1 or connection.savepoint_ids:
        return False
    if connection.needs_rollback or not connection.commit_on_exit:
        return False
    return kept_binds_client_side(connection)


def execute_and_commit(connection: BaseDatabaseWrapper, statement: str, params: list[Any]) -> None:
    """Send ``statement`` then ``COMMIT`` as one query string, its parameters quoted
    client-side, on a ``ClientCursor`` kept per connection (:mod:`.bound`: seen as
    Django's cursors are, by the execute wrappers, the query log and the database
    instrumentations). Never prepared: a ``ClientCursor`` never prepares. An error of
    either raises as Django's; the transaction is then over, rolled back by the server."""
    execute_kept(connection, f"{statement}; COMMIT", params, ClientCursor)


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of the psycopg error behind Django's ``error``, if any."""
    return getattr(error.__cause__, "sqlstate", None)
