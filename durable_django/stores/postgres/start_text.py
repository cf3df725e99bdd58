"""The PostgreSQL fragments of the admission rule, written once.

A start's SQL is sent two ways: ``durable_start_run_v2`` (``functions.sql``), and, for
the first start on a connection, the same work as plain statements
(:func:`statements`, one query string), which a new server process plans faster than it
compiles the function. Both are made of the fragments here: the index search of one
(tag, status) (:func:`search`), summed into a quota's units (:func:`units` in the
function, whose statuses are an argument; :func:`units_of_statuses` in the statements,
whose statuses are known as they are written), a rate limit's units in its window
(:func:`window_units`, the function's alone: a start under a rate limit always calls it),
the limit in force, an operator's override or the declared one (:func:`limit_in_force`),
the admission condition (:func:`admits`) and the inserts of the run and its tags
(:func:`insert_run`, :func:`insert_tags`). The
set-based batch ``durable_start_runs_v2`` uses :func:`search`, :func:`override_limit`,
:func:`admits` and :func:`insert_run` too.

``functions.sql`` holds the functions as released, written out once there;
``tests/stores/test_postgresql_functions.py`` binds them to this module: each fragment,
rendered with the function's own names, stands in the file's single start and batch, so
a fragment changed here and not there (or the other way round) fails that test."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from ..._core.limits import RATE_TAG_PREFIX, TAG_PREFIX
from ..._core.records import NewRun
from ..._rules.concurrency import Quota

#: The columns a start writes into ``durable_run``, in :func:`run_row`'s order.
RUN_COLUMNS = (
    "id, workflow, version, namespace, status, queue, input, output, error,\n"
    "parent_id, blocked_reason, attempt, created_at, updated_at, started_at, finished_at"
)


def search(tag: str, status: str, namespace: str | None) -> str:
    """The weights of ``tag``'s rows in one ``status`` (in ``namespace`` unless it is NULL;
    ``None``: every namespace): ``tag`` and ``status`` are the search key of the index on
    (tag, status, namespace), so it reads only those rows, never the key's finished
    history, whatever the planner's statistics say."""
    text = f"SELECT t.weight FROM durable_run_tag AS t\nWHERE t.tag = {tag} AND t.status = {status}"
    if namespace is not None:
        text += f"\n    AND ({namespace} IS NULL OR t.namespace = {namespace})"
    return text


def units(tag: str, statuses: str, namespace: str | None) -> str:
    """A quota's units, as one statement (one snapshot): :func:`search` for each distinct
    non-NULL status of the array ``statuses``, summed (``active``). ``OFFSET 0`` keeps each
    search a subquery of its own: merged into a join, it would be searched by tag alone,
    reading the key's finished history."""
    return (
        "SELECT coalesce(sum(c.weight), 0) AS active\n"
        "FROM (\n"
        f"    SELECT DISTINCT s.status FROM unnest({statuses}) AS s(status)\n"
        "    WHERE s.status IS NOT NULL\n"
        ") AS st\n"
        "CROSS JOIN LATERAL (\n"
        + _indented(search(tag, "st.status", namespace), 4)
        + "\n    OFFSET 0\n"
        ") AS c"
    )


def units_of_statuses(tag: str, statuses: int, namespace: str | None) -> str:
    """A quota's units when its ``statuses`` (distinct) are known as the text is written:
    a ``UNION ALL`` of one :func:`search` per status (``%s`` each), summed (``active``);
    planned faster than :func:`units`' ``LATERAL`` on a new connection."""
    searches = [search(tag, "%s", namespace) for _ in range(statuses)]
    return (
        "SELECT coalesce(sum(c.weight), 0) AS active\nFROM (\n"
        + _indented("\nUNION ALL\n".join(searches), 4)
        + "\n) AS c"
    )


def window_units(tag: str, since: str, namespace: str | None) -> str:
    """A rate limit's units, as one statement: the weights of ``tag``'s rows created after
    ``since`` (in ``namespace`` unless it is NULL), whatever their status, summed
    (``active``). ``tag`` and ``created_at`` lead the index on (tag, created_at, weight),
    so it reads the window's entries alone, never the key's older history."""
    text = (
        "SELECT coalesce(sum(t.weight), 0) AS active FROM durable_run_tag AS t\n"
        f"WHERE t.tag = {tag} AND t.created_at > {since}"
    )
    if namespace is not None:
        text += f"\n    AND ({namespace} IS NULL OR t.namespace = {namespace})"
    return text


def override_limit(tag: str, namespace: str, now: str) -> str:
    """The limit of an operator's override of ``tag`` in force at ``now`` for the starts
    reading ``namespace`` (NULL: every namespace, the scope ``''``), as one scalar
    subquery: NULL when none is (``overrides.scope_of``). The table's unique index on
    (tag, scope) answers it."""
    return (
        "(SELECT o.quota_limit FROM durable_quota_override AS o\n"
        f"WHERE o.tag = {tag} AND o.scope = coalesce({namespace}, '')\n"
        f"    AND (o.until IS NULL OR o.until > {now}))"
    )


def limit_in_force(declared: str, tag: str, namespace: str, now: str) -> str:
    """A quota's limit: its override's (:func:`override_limit`), else ``declared``."""
    return f"coalesce({override_limit(tag, namespace, now)}, {declared})"


def admits(units: str, weight: str, limit: str) -> str:
    """The admission of one quota: its units and the start's weight within its limit."""
    return f"{units} + {weight} <= {limit}"


def run_row(
    run_id: str,
    workflow: str,
    version: str,
    namespace: str,
    queue: str,
    input: str,
    parent_id: str,
    attempt: str,
    now: str,
) -> str:
    """A new run's values, in :data:`RUN_COLUMNS`' order: ``pending``, created and
    updated at ``now``."""
    return (
        f"{run_id}, {workflow}, {version}, {namespace}, 'pending', {queue}, {input}, NULL,"
        f" NULL,\n{parent_id}, '', {attempt}, {now}, {now}, NULL, NULL"
    )


def insert_run(row: str, rest: str = "") -> str:
    """The insert of a new run (of runs, with ``rest`` a FROM clause) of :func:`run_row`'s
    ``row``; an id already held inserts nothing."""
    return (
        f"INSERT INTO durable_run (\n{_indented(RUN_COLUMNS, 4)}\n)\n"
        f"SELECT\n{_indented(row, 4)}\n{rest}ON CONFLICT (id) DO NOTHING"
    )


def insert_tags(run_id: str, namespace: str, tags: str) -> str:
    """The insert of a new run's tag rows from ``tags``, a relation of ``(tag, weight,
    created_at)`` rows: a quota's tag weighs its quota's weight, any other tag 1, and a
    rate limit's tag keeps the run's creation time (:func:`weighed_tags` in the function;
    the statements, which start under no rate limit, write the values). ``run_id`` may
    name a column of a relation ``run`` (the statements' inserted run), which is then
    read."""
    source = "run, " if run_id.startswith("run.") else ""
    return (
        "INSERT INTO durable_run_tag (run_id, tag, status, namespace, weight, created_at)\n"
        f"SELECT {run_id}, t.tag, 'pending', {namespace}, t.weight, t.created_at\n"
        f"FROM {source}{tags} AS t(tag, weight, created_at)"
    )


def weighed_tags(tags: str, keys: str, weights: str, pers: str, now: str) -> str:
    """The ``(tag, weight, created_at)`` rows of the array ``tags``: a quota's tag weighs
    its weight (``keys``, ``weights`` and ``pers`` parallel arrays), any other tag 1; a
    concurrency quota's tag is ``'concurrency:' || key``, a rate limit's (its ``per`` not
    NULL) ``'rate:' || key``, which keeps ``now``."""
    return (
        f"(\n    SELECT t.tag, coalesce(q.weight, 1), CASE WHEN q.per IS NOT NULL THEN {now} END\n"
        f"    FROM unnest({tags}) AS t(tag)\n"
        f"    LEFT JOIN unnest({keys}, {weights}, {pers}) AS q(key, weight, per)\n"
        f"        ON t.tag = CASE WHEN q.per IS NULL THEN '{TAG_PREFIX}' "
        f"ELSE '{RATE_TAG_PREFIX}' END || q.key\n)"
    )


def _indented(text: str, spaces: int) -> str:
    return textwrap.indent(text, " " * spaces)


#: Reads the run holding an id, after statements found it taken.
EXISTING_SQL = "SELECT workflow, namespace FROM durable_run WHERE id = %s"


def statements(
    run: NewRun, quotas: Sequence[Quota], check_existing: bool, read_namespace: str | None
) -> tuple[str, list[Any]]:
    """``durable_start_run_v2``'s work as one query string, its parameters bound on the
    client: the lock of each key, then one statement that checks for an existing run
    (``check_existing``), counts each quota's units (:func:`units`), reads its limit in
    force (:func:`limit_in_force`), and inserts the run and its tags (:func:`insert_run`,
    :func:`insert_tags`) when every quota admits its weight (:func:`admits`). Its one
    row: the existing run's workflow and namespace (or NULLs), whether the run was
    inserted, and each quota's units and limit.

    The locks are ``durable_lock_quota_key_v1``'s, one statement per key in the keys' code
    point order, which is ``durable_lock_quota_keys_v1``'s byte order: the function's
    locks, in its order. The statements of one query string run in one transaction
    (outside the caller's, an implicit one, which holds the locks to its end). At READ
    COMMITTED the last statement takes its snapshot after the locks were granted, so its
    counts see every start committed before.
    """
    params: list[Any] = sorted(quota.key for quota in quotas)
    locks = "".join("SELECT durable_lock_quota_key_v1(%s);\n" for _ in quotas)
    ctes = []
    if check_existing:
        ctes.append("existing AS (SELECT workflow, namespace FROM durable_run WHERE id = %s)")
        params.append(run.run_id)
    numbers = range(1, len(quotas) + 1)
    namespace = None if read_namespace is None else "%s"
    namespaces = [] if read_namespace is None else [read_namespace, read_namespace]
    for number, quota in zip(numbers, quotas, strict=True):
        statuses = dict.fromkeys(quota.count_statuses)  # each status counted once
        count = units_of_statuses("%s", len(statuses), namespace)
        ctes.append(f"q{number} AS (\n{count}\n)")
        for status in statuses:
            params += [TAG_PREFIX + quota.key, status, *namespaces]
        limit = limit_in_force("%s", "%s", "%s::text", "clock_timestamp()")
        ctes.append(f"l{number} AS (SELECT {limit} AS lim)")
        params += [TAG_PREFIX + quota.key, read_namespace, quota.limit]
    admitted = [admits(f"q{number}.active", "%s", f"l{number}.lim") for number in numbers]
    params_admitted = [quota.weight for quota in quotas]
    if check_existing:
        admitted.append("NOT EXISTS (SELECT FROM existing)")
    counts = "".join(f", q{number}, l{number}" for number in numbers)
    row = run_row("%s", "%s", "%s", "%s", "%s", "%s::jsonb", "%s", "%s", "clock.at")
    where = "WHERE " + " AND ".join(admitted) + "\n" if admitted else ""
    ctes.append(
        "run AS (\n"
        + insert_run(row, f"FROM (SELECT clock_timestamp() AS at) AS clock{counts}\n{where}")
        + "\nRETURNING id\n)"
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
        values = "(VALUES " + ", ".join("(%s, %s, NULL::timestamptz)" for _ in run.tags) + ")"
        ctes.append(f"tags AS (\n{insert_tags('run.id', '%s', values)}\n)")
        weights = {TAG_PREFIX + quota.key: quota.weight for quota in quotas}
        params.append(run.namespace)
        params += [value for tag in run.tags for value in (tag, weights.get(tag, 1))]
    existing = (
        "(SELECT workflow FROM existing), (SELECT namespace FROM existing)"
        if check_existing
        else "NULL, NULL"
    )
    actives = "".join(f", q{number}.active, l{number}.lim" for number in numbers)
    sql = (
        locks
        + "WITH "
        + ",\n".join(ctes)
        + f"\nSELECT {existing}, EXISTS (SELECT FROM run){actives}"
        + (" FROM " + ", ".join(f"q{n}, l{n}" for n in numbers) if quotas else "")
    )
    return sql, params
