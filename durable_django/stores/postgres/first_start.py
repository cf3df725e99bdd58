"""The first start on a new PostgreSQL connection, sent as statements.

The first call of a PL/pgSQL function in a server process compiles it and plans each of
its statements; with ``CONN_MAX_AGE = 0`` every start is the first on its connection.
Planning ``durable_start_run_v2``'s work sent as plain statements costs less then, so
the first start on a connection sends them (:func:`statements`: one query string, one
round trip), and every later start calls the function, whose plans it then reuses. Both
are rendered from the same fragments (``start_text``), take the same locks in the same
order and apply the same rule; ``tests/stores/test_first_start.py`` runs every case through both.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..._rules.concurrency import Quota
from .bound import binds_client_side
from .start_text import EXISTING_SQL, statements

__all__ = ["EXISTING_SQL", "by_statements", "statements"]

#: The DB-API connections that have made a start: their next starts call the function.
_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()


def by_statements(connection: BaseDatabaseWrapper, quotas: Sequence[Quota]) -> bool:
    """Whether this start, the first on the DB-API connection, sends
    :func:`statements` instead of calling ``durable_start_run_v2``.

    The first call of a PL/pgSQL function in a server process compiles it and plans each
    of its statements, which costs more than planning the statements sent alone; every
    later call reuses those plans, which costs less. With ``CONN_MAX_AGE = 0`` every start
    is the first on its connection. The statements need the connection's cursors to bind
    the parameters on the client (``bound.binds_client_side``: Django's default, several
    statements in one query string), and the arguments the function accepts (each key
    once, weights of at least 1; it raises the errors of the others).
    """
    raw = connection.connection
    if raw in _STARTED:
        return False
    _STARTED.add(raw)
    return (
        binds_client_side(raw)
        and not any(quota.rate for quota in quotas)  # windows are the function's alone
        and len({quota.key for quota in quotas}) == len(quotas)
        and all(quota.weight >= 1 for quota in quotas)
    )
