"""The current thread's database connections, after the database went away.

Django opens a connection per thread and reopens it only once it has been closed: a
connection that the server dropped (a restart, a failover, a network blip) fails every
query until someone closes it. Workers, the lease keeper and the tick close theirs after
an error, and check them after a long time away from the database.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import DatabaseError, InterfaceError, connections


def close_connections() -> None:
    """Close this thread's database connections; the next query opens a fresh one.

    A connection inside an atomic block is left to the block's owner. Errors while
    closing a connection that is already broken are ignored.
    """
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            continue
        with contextlib.suppress(Exception):
            connection.close()


@contextlib.contextmanager
def closing_what_it_opens() -> Iterator[None]:
    """Close, when the block ends, the connections of this thread that the block opened
    (outside an atomic block): a thread that may never come back to the database keeps
    none open, and one that had its connection open (a request's, a worker's) keeps it."""
    opened = {c.alias for c in connections.all(initialized_only=True) if c.connection is not None}
    try:
        yield
    finally:
        for connection in connections.all(initialized_only=True):
            if connection.alias in opened or connection.in_atomic_block:
                continue
            with contextlib.suppress(Exception):
                connection.close()


def close_stale_connections() -> None:
    """Close this thread's connections that are broken or older than ``CONN_MAX_AGE``,
    as Django does before and after each request; for other units of work, like a tick.

    Unlike ``django.db.close_old_connections``, it leaves a connection inside an atomic
    block alone.
    """
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            continue
        with contextlib.suppress(Exception):
            connection.close_if_unusable_or_obsolete()


def close_dropped_connections() -> None:
    """Close this thread's open connections that no longer answer a ``SELECT 1``.

    One round trip per open connection; meant for the moment a thread comes back to the
    database after a long time away from it.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or connection.in_atomic_block:
            continue
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception:
            with contextlib.suppress(Exception):
                connection.close()


def connection_lost(error: BaseException, using: str) -> bool:
    """Whether ``error`` is the database ``using`` going away (a restart, a failover, a
    network cut: its connection no longer answers), not the database refusing one
    statement, after which the connection goes on working. Safe to ask inside the
    transaction the error happened in."""
    if not isinstance(error, DatabaseError):
        return False
    if isinstance(error, InterfaceError):
        # The connection was closed under the statement (psycopg: "connection already
        # closed"; PyMySQL closes its socket after a lost read and raises
        # InterfaceError(0, '') at the next): never the database refusing it.
        return True
    connection = connections[using]
    raw = connection.connection
    if raw is None:
        return True
    # PyMySQL says whether its socket is still open; its ping, which is_usable() sends,
    # would open a new one and hide that the old one was gone.
    is_open = getattr(raw, "open", None)
    if isinstance(is_open, bool) and not is_open:
        return True
    # psycopg marks a connection whose server went away; asking it needs no query, so the
    # answer holds inside a transaction a refused statement aborted (where a probe query
    # fails on a connection that still works).
    broken = getattr(raw, "broken", None)
    if isinstance(broken, bool):
        return broken or bool(raw.closed)
    return not connection.is_usable()


def one_line(error: BaseException) -> str:
    """An exception for a log line: its type and its message, on one line."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"
