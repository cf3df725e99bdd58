"""The kept tickets of fair quotas as rows of ``durable_quota_ticket`` (``QuotaTicket``).

A ticket is read and dropped inside a start's transaction, under its key's lock, through
the ORM. It is kept, and held, once a refused start's transaction has ended: those writes
must outlive a transaction of the caller's that is rolled back (a view under
``ATOMIC_REQUESTS`` turning the refusal into a 429 rolls back everything it wrote), so
inside one they are made on a connection of their own, in autocommit. SQLite allows one
writer at a time, and the caller's transaction may hold it: there they join the caller's
transaction, and are lost if it rolls back (the client's next retry is then a ticket not
kept yet, which the store keeps at its next refusal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q, QuerySet
from django.utils import timezone

from .._rules.tickets import KeptTicket
from ..models import QuotaTicket


def line(using: str, key: str, namespace: str | None) -> list[KeptTicket]:
    """The tickets kept for ``key`` in ``namespace`` (every one when ``None``), live or
    not, by place."""
    rows = _in_line(QuotaTicket.objects.using(using), key, namespace)
    return [
        KeptTicket(id, key, joined, weight, expires, kept_in, held)
        for id, joined, weight, expires, kept_in, held in rows.order_by(
            "joined_at", "id"
        ).values_list("id", "joined_at", "weight", "expires_at", "namespace", "held_until")
    ]


def lines_statement(
    connection: BaseDatabaseWrapper, keys: Sequence[str], namespace: str | None
) -> tuple[str, list[Any]]:
    """The statement reading the tickets kept for ``keys`` (in ``namespace``; every one
    when ``None``), live or not, by key and place, and its parameters; its rows read by
    :func:`lines_from`."""
    table, quote = _table(connection)
    columns = ("quota_key", "id", "joined_at", "weight", "expires_at", "namespace", "held_until")
    where = f"{quote('quota_key')} IN ({', '.join(['%s'] * len(keys))})"
    params: list[Any] = list(keys)
    if namespace is not None:
        where += f" AND {quote('namespace')} = %s"
        params.append(namespace)
    order = ", ".join(quote(column) for column in ("quota_key", "joined_at", "id"))
    return (
        f"SELECT {', '.join(quote(column) for column in columns)} FROM {table} "
        f"WHERE {where} ORDER BY {order}",
        params,
    )


def lines_from(rows: Iterable[Sequence[Any]]) -> dict[str, list[KeptTicket]]:
    """The lines :func:`lines_statement` read, by key."""
    lines: dict[str, list[KeptTicket]] = {}
    for key, id, joined, weight, expires, kept_in, held in rows:
        lines.setdefault(key, []).append(
            KeptTicket(id, key, joined, weight, expires, kept_in, held)
        )
    return lines


def drop_statement(connection: BaseDatabaseWrapper, ticket_id: str) -> tuple[str, list[Any]]:
    """The statement deleting the kept ticket ``ticket_id``, and its parameters."""
    table, quote = _table(connection)
    return f"DELETE FROM {table} WHERE {quote('id')} = %s", [ticket_id]


def drop(using: str, ticket_id: str) -> None:
    """Delete the kept ticket ``ticket_id``."""
    QuotaTicket.objects.using(using).filter(id=ticket_id).delete()


def end_hold(using: str, key: str, namespace: str | None, now: datetime) -> None:
    """Unbind ``key``'s tickets (in ``namespace``) from a hold still running at ``now``."""
    rows = QuotaTicket.objects.using(using)
    bound = _in_line(rows, key, namespace).filter(held_until__gt=now)
    ids = list(bound.order_by("id").values_list("id", flat=True))
    if ids:  # locked by id, in id order, as every write of the line's rows locks them
        rows.filter(id__in=ids, held_until__gt=now).update(held_until=None)


def purge(using: str, expired_before: datetime, limit: int) -> int:
    """Delete up to ``limit`` tickets out of their line before ``expired_before``."""
    rows = QuotaTicket.objects.using(using)
    gone = Q(expires_at__lt=expired_before) | Q(held_until__lt=expired_before)
    batch = list(rows.filter(gone).values_list("id", flat=True)[:limit])
    return rows.filter(id__in=batch).delete()[0] if batch else 0


def keep(using: str, ticket: KeptTicket, most: int) -> None:
    """Move the expiry of ``ticket``, or insert it unless its line keeps ``most`` live
    tickets; first delete the key's tickets out of the line."""
    with _writing(using) as (connection, cursor):
        table, quote = _table(connection)
        adapt = connection.ops.adapt_datetimefield_value
        now = adapt(timezone.now())
        key, expires, held = quote("quota_key"), quote("expires_at"), quote("held_until")
        gone = f"({expires} <= %s OR {held} <= %s)"
        dead = _ids(cursor, table, quote, f"{key} = %s AND {gone}", [ticket.key, now, now])
        if dead:
            cursor.execute(
                f"DELETE FROM {table} WHERE {_id_in(quote, dead)} AND {gone}", [*dead, now, now]
            )
        cursor.execute(
            f"UPDATE {table} SET {expires} = %s, {quote('weight')} = %s WHERE {quote('id')} = %s",
            [adapt(ticket.expires_at), ticket.weight, ticket.id],
        )
        if cursor.rowcount:
            return
        cursor.execute(
            f"SELECT COUNT(*) FROM {table} WHERE {key} = %s AND {quote('namespace')} = %s",
            [ticket.key, ticket.namespace],
        )
        if cursor.fetchone()[0] >= most:
            return  # a full line: the ticket stays valid, unkept
        try:
            with _savepoint(connection):
                cursor.execute(
                    f"INSERT INTO {table} ({quote('id')}, {key}, {quote('namespace')}, "
                    f"{quote('joined_at')}, {quote('weight')}, {expires}, {held}) "
                    f"VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [
                        ticket.id,
                        ticket.key,
                        ticket.namespace,
                        adapt(ticket.joined_at),
                        ticket.weight,
                        adapt(ticket.expires_at),
                        adapt(ticket.held_until),
                    ],
                )
        except IntegrityError:  # the same ticket, kept by a concurrent retry
            pass


def hold(using: str, key: str, namespace: str | None, until: datetime) -> None:
    """Bind ``key``'s tickets (in ``namespace``) that no hold binds to one ending ``until``."""
    with _writing(using) as (connection, cursor):
        table, quote = _table(connection)
        where, params = f"{quote('quota_key')} = %s", [key]
        if namespace is not None:
            where, params = f"{where} AND {quote('namespace')} = %s", [key, namespace]
        free = f"{quote('held_until')} IS NULL"
        ids = _ids(cursor, table, quote, f"{where} AND {free}", params)
        if ids:
            cursor.execute(
                f"UPDATE {table} SET {quote('held_until')} = %s "
                f"WHERE {_id_in(quote, ids)} AND {free}",
                [connection.ops.adapt_datetimefield_value(until), *ids],
            )


def _ids(cursor: Any, table: str, quote: Any, where: str, params: list[Any]) -> list[str]:
    """The ids of the rows ``where`` selects, read without a lock, in id order: the rows a
    write then locks by id, so that the writes of one line lock its rows in one order
    (a range of the ``(quota_key, joined_at)`` index, locked by one statement while a
    start deletes a row by id, deadlocks on MySQL/MariaDB)."""
    id = quote("id")
    cursor.execute(f"SELECT {id} FROM {table} WHERE {where} ORDER BY {id}", params)
    return [row[0] for row in cursor.fetchall()]


def _id_in(quote: Any, ids: list[str]) -> str:
    return f"{quote('id')} IN ({', '.join(['%s'] * len(ids))})"


def _in_line(rows: QuerySet[QuotaTicket], key: str, namespace: str | None) -> QuerySet[QuotaTicket]:
    rows = rows.filter(quota_key=key)
    return rows if namespace is None else rows.filter(namespace=namespace)


def _table(connection: BaseDatabaseWrapper) -> tuple[str, Any]:
    quote = connection.ops.quote_name
    return quote(QuotaTicket._meta.db_table), quote


#: How long a write on a connection of its own waits for a row lock. The caller's open
#: transaction may hold the lock itself (it admitted a start with that ticket, and a
#: second start of the same request presents it again): the write then fails after this
#: long, is logged, and the refusal stands, instead of waiting on its own caller forever.
_LOCK_TIMEOUT = {
    "postgresql": "SET lock_timeout = '2s'",
    "mysql": "SET SESSION innodb_lock_wait_timeout = 2",
}


@contextlib.contextmanager
def _writing(using: str) -> Iterator[tuple[BaseDatabaseWrapper, Any]]:
    """A connection and cursor whose writes commit at the end of the block: this thread's
    own, in a transaction, unless a transaction of the caller's is open on a database
    other than SQLite; then a new connection, in autocommit, closed after."""
    connection = connections[using]
    if connection.vendor == "sqlite" or not (
        connection.in_atomic_block or not connection.get_autocommit()
    ):
        with transaction.atomic(using=using), connection.cursor() as cursor:
            yield connection, cursor
        return
    own = type(connection)(connection.settings_dict, connection.alias)
    try:
        with own.cursor() as cursor:
            if own.vendor in _LOCK_TIMEOUT:
                cursor.execute(_LOCK_TIMEOUT[own.vendor])
            yield own, cursor
    finally:
        own.close()


@contextlib.contextmanager
def _savepoint(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """A savepoint where a transaction is open (so a failed insert leaves it usable)."""
    if connection.in_atomic_block:
        with transaction.atomic(using=connection.alias):
            yield
    else:
        yield
