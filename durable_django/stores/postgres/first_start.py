"""The first start on a new PostgreSQL connection, sent as statements.

The first call of a PL/pgSQL function in a server process compiles it and plans each of
its statements; with ``CONN_MAX_AGE = 0`` every start is the first on its connection.
Planning ``durable_start_run_v2``'s work sent as plain statements costs less then, so
the first start on a connection sends them (:func:`statements`: one query string, one
round trip), and every later start calls the function, whose plans it then reuses. Both
take the same locks in the same order and apply the same rule; ``tests/test_first_start.py``
runs every case through both.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.backends.base.base import BaseDatabaseWrapper

from ...concurrency import Quota
from ...limits import TAG_PREFIX
from ...records import NewRun
from .bound import binds_client_side

#: The DB-API connections that have made a start: their next starts call the function.
_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()
EXISTING_SQL = "SELECT workflow, namespace FROM durable_run WHERE id = %s"


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
        and len({quota.key for quota in quotas}) == len(quotas)
        and all(quota.weight >= 1 for quota in quotas)
    )


def statements(
    run: NewRun, quotas: Sequence[Quota], check_existing: bool, read_namespace: str | None
) -> tuple[str, list[Any]]:
    """``durable_start_run_v2``'s work as one query string: the lock of each key, then one
    statement that checks for an existing run (``check_existing``), counts each key's
    units, and inserts the run and its tags when every quota admits its weight. Its one
    row: the existing run's workflow and namespace (or NULLs), whether the run was
    inserted, and each key's units.

    The locks are ``durable_lock_quota_key_v1``'s, one statement per key in the keys' code
    point order, which is ``durable_lock_quota_keys_v1``'s byte order: the function's
    locks, in its order. The statements of one query string run in one transaction
    (outside the caller's, an implicit one, which holds the locks to its end). At READ
    COMMITTED the last statement takes its snapshot after the locks were granted, so its
    counts see every start committed before; the count is the function's, a ``UNION
    ALL`` of one ``tag = K AND status = S`` branch per counted status, for the same reason
    (both columns search the index), here for the quota's own statuses only.
    """
    params: list[Any] = []
    locks = "".join("SELECT durable_lock_quota_key_v1(%s);\n" for _ in quotas)
    params += sorted(quota.key for quota in quotas)
    ctes = []
    if check_existing:
        ctes.append("existing AS (SELECT workflow, namespace FROM durable_run WHERE id = %s)")
        params.append(run.run_id)
    in_namespace = "" if read_namespace is None else " AND namespace = %s"
    for number, quota in enumerate(quotas, 1):
        branches = []
        for status in dict.fromkeys(quota.count_statuses):
            branches.append(
                "SELECT weight FROM durable_run_tag WHERE tag = %s AND status = %s" + in_namespace
            )
            params += [TAG_PREFIX + quota.key, status]
            if read_namespace is not None:
                params.append(read_namespace)
        ctes.append(
            f"q{number} AS (SELECT coalesce(sum(weight), 0) AS active FROM ("
            + " UNION ALL ".join(branches or ["SELECT 0 AS weight WHERE false"])
            + ") AS counted)"
        )
    admitted = [f"q{number}.active + %s <= %s" for number in range(1, len(quotas) + 1)]
    params_admitted: list[Any] = [v for quota in quotas for v in (quota.weight, quota.limit)]
    if check_existing:
        admitted.append("NOT EXISTS (SELECT FROM existing)")
    counts = "".join(f", q{number}" for number in range(1, len(quotas) + 1))
    ctes.append(
        "run AS (INSERT INTO durable_run (id, workflow, version, namespace, status, queue,"
        " input, output, error, parent_id, blocked_reason, attempt, created_at, updated_at,"
        " started_at, finished_at) SELECT %s, %s, %s, %s, 'pending', %s, %s::jsonb, NULL,"
        " NULL, %s, '', %s, clock.at, clock.at, NULL, NULL"
        f" FROM (SELECT clock_timestamp() AS at) AS clock{counts}"
        + (" WHERE " + " AND ".join(admitted) if admitted else "")
        + " ON CONFLICT (id) DO NOTHING RETURNING id)"
    )
    params += [
        run.run_id,
        run.workflow,
        run.version,
        run.namespace,
        run.queue,
        json.dumps(run.input, cls=DjangoJSONEncoder),
        run.parent_id,
        run.attempt,
        *params_admitted,
    ]
    if run.tags:
        weights = {TAG_PREFIX + quota.key: quota.weight for quota in quotas}
        ctes.append(
            "tags AS (INSERT INTO durable_run_tag (run_id, tag, status, namespace, weight)"
            " SELECT run.id, t.tag, 'pending', %s, t.weight FROM run, (VALUES "
            + ", ".join("(%s, %s)" for _ in run.tags)
            + ") AS t(tag, weight))"
        )
        params.append(run.namespace)
        params += [v for tag in run.tags for v in (tag, weights.get(tag, 1))]
    existing = (
        "(SELECT workflow FROM existing), (SELECT namespace FROM existing)"
        if check_existing
        else "NULL, NULL"
    )
    actives = "".join(f", q{number}.active" for number in range(1, len(quotas) + 1))
    sql = (
        locks
        + "WITH "
        + ",\n".join(ctes)
        + f"\nSELECT {existing}, EXISTS (SELECT FROM run){actives}"
        + (" FROM " + ", ".join(f"q{n}" for n in range(1, len(quotas) + 1)) if quotas else "")
    )
    return sql, params
