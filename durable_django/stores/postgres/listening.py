"""Listening for quota releases on PostgreSQL: ``LISTEN`` on a connection of its own.

The trigger ``durable_quota_release_notify_v1`` (installed with its triggers by
migration ``0002_routines``) sends, in the transaction that moves a quota tag out of an
active status (or deletes it), ``pg_notify(channel, tag)`` on the tag's
:func:`release_channel`. A listener opens its own autocommit connection with the Django
connection's parameters (never the caller's connection, which may be in a transaction),
and ``LISTEN``\\ s the channels of its keys before it is returned.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

import psycopg
from django.db import connections

from ...limits import TAG_PREFIX
from ..base import AsyncReleaseListener, ReleaseListener

#: The prefix of a release channel; the rest is the first 16 hex digits of the tag's md5.
CHANNEL_PREFIX = "durable_quota_"


def release_channel(key: str) -> str:
    """The channel the release of a slot of quota ``key`` is notified on (as the trigger
    names it: ``'durable_quota_' || left(md5(tag), 16)``)."""
    digest = hashlib.md5((TAG_PREFIX + key).encode(), usedforsecurity=False).hexdigest()
    return CHANNEL_PREFIX + digest[:16]


def _connection_params(using: str) -> dict[str, Any]:
    params: dict[str, Any] = connections[using].get_connection_params()
    params.pop("cursor_factory", None)
    params["autocommit"] = True
    return params


def _listen_statements(keys: Collection[str]) -> list[str]:
    return [f'LISTEN "{release_channel(key)}"' for key in sorted(set(keys))]


class PostgresReleaseListener(ReleaseListener):
    """A connection of its own, listening to the channels of ``keys``."""

    def __init__(self, using: str, keys: Collection[str]) -> None:
        self._connection = psycopg.Connection.connect(**_connection_params(using))
        try:
            for statement in _listen_statements(keys):
                self._connection.execute(statement.encode())
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
            for statement in _listen_statements(keys):
                await connection.execute(statement.encode())
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
