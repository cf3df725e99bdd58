"""Listening for quota releases on PostgreSQL: ``LISTEN`` on a connection of its own.

The trigger ``durable_quota_release_notify_v1`` (installed with its triggers by
migration ``0002_routines``) sends, in the transaction that moves a quota tag out of an
active status (or deletes it), ``pg_notify(channel, tag)`` on the tag's
:func:`release_channel`, when a waiter of the tag is registered. A listener opens its own
autocommit connection with the Django connection's parameters (never the caller's
connection, which may be in a transaction) and, before it is returned, in one round trip
(:func:`registration`): registers for its keys (a session-level shared advisory lock per
key, :data:`WAITER_LOCK`, which goes with the connection, closed or lost), waits out the
releases that tested for waiters before it registered (:data:`RELEASE_LOCK`, taken and
given back), and ``LISTEN``\\ s the channels of its keys. So the start's next count sees
every release that did not see the registration.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

import psycopg
from django.db import connections
from psycopg import sql

from ..._core.limits import TAG_PREFIX
from ..base import AsyncReleaseListener, ReleaseListener

#: The prefix of a release channel; the rest is the first 16 hex digits of the tag's md5.
CHANNEL_PREFIX = "durable_quota_"


def release_channel(key: str) -> str:
    """The channel the release of a slot of quota ``key`` is notified on (as the trigger
    names it: ``'durable_quota_' || left(md5(tag), 16)``)."""
    digest = hashlib.md5((TAG_PREFIX + key).encode(), usedforsecurity=False).hexdigest()
    return CHANNEL_PREFIX + digest[:16]


#: The advisory lock class of a waiter's registration, ``(WAITER_LOCK, hashtext(tag))``,
#: held shared by each listener of the tag; the trigger tries it to know whether to notify.
WAITER_LOCK = 1702001001
#: The advisory lock class a release holds shared until it ends, on its tag's bucket
#: ``(RELEASE_LOCK, hashtext(tag) & RELEASE_BUCKETS - 1)``.
RELEASE_LOCK = 1702001002
#: How many buckets the release locks fall in (a power of two).
RELEASE_BUCKETS = 1024
#: How long a listener waits for a release in progress before it gives up (and the start
#: polls instead).
REGISTRATION_LOCK_TIMEOUT = "1s"


def _connection_params(using: str) -> dict[str, Any]:
    params: dict[str, Any] = connections[using].get_connection_params()
    params.pop("cursor_factory", None)
    params["autocommit"] = True
    return params


def registration(keys: Collection[str]) -> sql.Composed:
    """The statements, in order, registering a waiter of ``keys`` on its own connection:
    the registrations, the release locks taken and given back, the ``LISTEN``\\ s."""
    tags = [sql.Literal(TAG_PREFIX + key) for key in sorted(set(keys))]
    waiter = sql.SQL(f"{WAITER_LOCK}, hashtext({{}})")
    bucket = sql.SQL(f"{RELEASE_LOCK}, hashtext({{}}) & {RELEASE_BUCKETS - 1}")
    statements: list[sql.Composable] = [
        sql.SQL(f"SET LOCAL lock_timeout = '{REGISTRATION_LOCK_TIMEOUT}'")
    ]
    statements += [
        sql.SQL("SELECT pg_advisory_lock_shared({})").format(waiter.format(tag)) for tag in tags
    ]
    for tag in tags:
        statements.append(sql.SQL("SELECT pg_advisory_lock({})").format(bucket.format(tag)))
        statements.append(sql.SQL("SELECT pg_advisory_unlock({})").format(bucket.format(tag)))
    statements += [
        sql.SQL("LISTEN {}").format(sql.Identifier(release_channel(key)))
        for key in sorted(set(keys))
    ]
    return sql.SQL("; ").join(statements)


class PostgresReleaseListener(ReleaseListener):
    """A connection of its own, listening to the channels of ``keys``."""

    def __init__(self, using: str, keys: Collection[str]) -> None:
        self._connection = psycopg.Connection.connect(**_connection_params(using))
        try:
            self._connection.execute(registration(keys))
        except BaseException:
            self._connection.close()
            raise

    def wait(self, timeout: float) -> bool:
        received = False
        for _ in self._connection.notifies(timeout=max(timeout, 0.0), stop_after=1):
            received = True
        return received

    def close(self) -> None:
        self._connection.close()


class AsyncPostgresReleaseListener(AsyncReleaseListener):
    """:class:`PostgresReleaseListener` on psycopg's async connection."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._connection = connection

    @classmethod
    async def open(cls, using: str, keys: Collection[str]) -> AsyncPostgresReleaseListener:
        connection = await psycopg.AsyncConnection.connect(**_connection_params(using))
        try:
            await connection.execute(registration(keys))
        except BaseException:
            await connection.close()
            raise
        return cls(connection)

    async def wait(self, timeout: float) -> bool:
        received = False
        async for _ in self._connection.notifies(timeout=max(timeout, 0.0), stop_after=1):
            received = True
        return received

    async def close(self) -> None:
        await self._connection.close()
