"""The portable path: a start's statements written once per database vendor
(:class:`PortableSql`), sent on the connection's cursor in one transaction, and the base of
the dialects' paths (docs/stores.md, "The ORM store's paths")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField
from django.utils import timezone

from ..._core.records import NewRun, StartOutcome
from ..._rules.admission import Refusal, refused_by
from ..._rules.concurrency import Quota
from ..._rules.tickets import Ticket
from ...models import QuotaLock, Run, RunQuerySet, RunTag, model_field
from ...status import RunStatus
from ..base import (
    BaseStore,
    StartRequest,
    check_quotas,
    existing_outcome,
    quota_transaction,
)


class PortablePath(BaseStore):
    """The portable start and what every path of :class:`~durable_django.stores.OrmStore`
    shares: its database, whether it takes its fast paths, its runs."""

    is_shared = True
    using: str

    def __init__(self, using: str = "default", *, fast_path: bool = True) -> None:
        self.using = using
        self.fast_path = fast_path

    def __repr__(self) -> str:
        return f"OrmStore(using={self.using!r})"

    def _runs(self) -> RunQuerySet:
        return Run.objects.using(self.using)

    def _fast(self) -> bool:
        """Whether this store takes its PostgreSQL fast path (one statement, no ORM)."""
        return self.fast_path and connections[self.using].vendor == "postgresql"

    def _procedure(self) -> bool:
        """Whether this store starts runs by a ``CALL`` of ``durable_start_run_mariadb_v1``:
        on MariaDB (not MySQL), unless ``fast_path=False``."""
        connection = connections[self.using]
        return (
            self.fast_path
            and connection.vendor == "mysql"
            and bool(getattr(connection, "mysql_is_mariadb", False))
        )

    def _upsert_locks(self, ordered: list[str]) -> None:
        """SQLite's lock rows of the keys ``ordered``, written by one upsert."""
        connection = connections[self.using]
        with connection.cursor() as cursor:
            cursor.execute(
                portable_sql(connection).upsert_locks(len(ordered)),
                [
                    value
                    for key in ordered
                    for value in (key, connection.ops.adapt_datetimefield_value(timezone.now()))
                ],
            )

    def _start_portable(
        self,
        run: NewRun,
        quotas: tuple[Quota, ...],
        check_existing: bool,
        read_namespace: str | None,
        ticket: Ticket | None = None,
    ) -> StartOutcome:
        """``BaseStore.start_run``'s steps, in its order, each one prepared statement on
        the connection's cursor: the keys' locks (:meth:`quota_locks`), the existing run's
        workflow and namespace, every key's units in one query (and a fair quota's kept
        tickets), the run, and its tags in one multi-row insert. A start under a fair
        quota takes this path on PostgreSQL too."""
        connection = connections[self.using]
        sql = portable_sql(connection)
        with quota_transaction(self, quotas), connection.cursor() as cursor:
            if check_existing:
                cursor.execute(sql.existing, [run.run_id])
                found = cursor.fetchone()
                if found is not None:
                    return existing_outcome(run, found[0], found[1], read_namespace)
            check_quotas(self, quotas, run.workflow, read_namespace, ticket)
            insert_run(connection, cursor, run)
        return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)


def in_callers_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether a transaction of the caller's is open on ``connection``: an ``atomic()``
    block, or a connection without autocommit."""
    return connection.in_atomic_block or not connection.get_autocommit()


#: The run's columns a start gives; the others take their field's default.
_STARTED_COLUMNS = (
    "id",
    "workflow",
    "version",
    "namespace",
    "status",
    "queue",
    "input",
    "parent_id",
    "attempt",
    "created_at",
    "updated_at",
)


@dataclasses.dataclass
class PortableSql:
    """The portable start's statements for one database vendor, written once (names
    quoted by the connection's ``quote_name``, every value a parameter), and the run's
    other columns' defaults as that vendor takes them."""

    quote: Callable[[str], str]
    existing: str
    insert_run: str
    run_defaults: list[Any]
    _by_shape: dict[tuple[Any, ...], str] = dataclasses.field(default_factory=dict)

    def insert_tags(self, count: int) -> str:
        """The multi-row insert of ``count`` tags of one run."""
        key = ("tags", count)
        if key not in self._by_shape:
            q = self.quote
            columns = ", ".join(
                q(c) for c in ("run_id", "tag", "status", "namespace", "weight", "created_at")
            )
            rows = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * count)
            self._by_shape[key] = (
                f"INSERT INTO {q(RunTag._meta.db_table)} ({columns}) VALUES {rows}"
            )
        return self._by_shape[key]

    def units(self, tags: int, statuses: int, namespace: bool) -> str:
        """Every tag's units, by tag and status: ``RunTagQuerySet.units``'s query."""
        key = ("units", tags, statuses, namespace)
        if key not in self._by_shape:
            q = self.quote
            tag, status = q("tag"), q("status")
            self._by_shape[key] = (
                f"SELECT {tag}, {status}, SUM({q('weight')}) FROM {q(RunTag._meta.db_table)} "
                f"WHERE {tag} IN ({', '.join(['%s'] * tags)}) "
                f"AND {status} IN ({', '.join(['%s'] * statuses)})"
                + (f" AND {q('namespace')} = %s" if namespace else "")
                + f" GROUP BY {tag}, {status}"
            )
        return self._by_shape[key]

    def update_locks(self, count: int) -> str:
        """The ``UPDATE`` of ``count`` lock rows, in key order (``ORDER BY`` on
        MySQL/MariaDB, where an ``UPDATE`` takes one)."""
        key = ("locks", count)
        if key not in self._by_shape:
            q = self.quote
            self._by_shape[key] = (
                f"UPDATE {q(QuotaLock._meta.db_table)} SET {q('last_start_at')} = %s "
                + (
                    f"WHERE {q('key')} = %s"
                    if count == 1
                    else f"WHERE {q('key')} IN ({', '.join(['%s'] * count)}) ORDER BY {q('key')}"
                )
            )
        return self._by_shape[key]

    def upsert_locks(self, count: int) -> str:
        """SQLite's upsert of ``count`` lock rows."""
        key = ("upsert", count)
        if key not in self._by_shape:
            q = self.quote
            last = q("last_start_at")
            self._by_shape[key] = (
                f"INSERT INTO {q(QuotaLock._meta.db_table)} ({q('key')}, {last}) "
                f"VALUES {', '.join(['(%s, %s)'] * count)} "
                f"ON CONFLICT ({q('key')}) DO UPDATE SET {last} = excluded.{last}"
            )
        return self._by_shape[key]


_PORTABLE_SQL: dict[str, PortableSql] = {}


def portable_sql(connection: BaseDatabaseWrapper) -> PortableSql:
    """The :class:`PortableSql` of ``connection``'s vendor, written on first use."""
    found = _PORTABLE_SQL.get(connection.vendor)
    if found is not None:
        return found
    q = connection.ops.quote_name
    table = q(Run._meta.db_table)
    others = [f for f in Run._meta.concrete_fields if f.column not in _STARTED_COLUMNS]
    columns = [*_STARTED_COLUMNS, *(f.column or f.name for f in others)]
    found = PortableSql(
        quote=q,
        existing=f"SELECT {q('workflow')}, {q('namespace')} FROM {table} WHERE {q('id')} = %s",
        insert_run=(
            f"INSERT INTO {table} ({', '.join(q(c) for c in columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))})"
        ),
        run_defaults=[f.get_db_prep_save(f.get_default(), connection) for f in others],
    )
    _PORTABLE_SQL[connection.vendor] = found
    return found


def insert_run(connection: BaseDatabaseWrapper, cursor: Any, run: NewRun) -> None:
    """Insert the pending ``run`` and its tags (weighing ``run.weights``; a rate limit's
    tag with the run's creation time) on ``cursor``: two statements, the tags in one
    multi-row insert."""
    for statement, params in insert_run_statements(connection, run):
        cursor.execute(statement, params)


def insert_run_statements(
    connection: BaseDatabaseWrapper, run: NewRun
) -> list[tuple[str, list[Any]]]:
    """The statements inserting the pending ``run`` and its tags (weighing
    ``run.weights``), with their parameters: the run, and its tags in one multi-row
    insert when it has any."""
    sql = portable_sql(connection)
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    statements: list[tuple[str, list[Any]]] = [
        (
            sql.insert_run,
            [
                run.run_id,
                run.workflow,
                run.version,
                run.namespace,
                RunStatus.PENDING.value,
                run.queue,
                model_field(Run, "input", JSONField).get_db_prep_save(run.input, connection),
                run.parent_id,
                run.attempt,
                now,
                now,
                *sql.run_defaults,
            ],
        )
    ]
    if run.tags:
        pending = RunStatus.PENDING.value
        statements.append(
            (
                sql.insert_tags(len(run.tags)),
                [
                    value
                    for tag in run.tags
                    for value in (
                        run.run_id,
                        tag,
                        pending,
                        run.namespace,
                        run.weights.get(tag, 1),
                        now if tag in run.rate_tags else None,
                    )
                ],
            )
        )
    return statements


@dataclasses.dataclass(frozen=True)
class UnitsQuery:
    """``RunTagQuerySet.units``'s query for some quotas, written once per shape: its
    statement and parameters (``None`` when it counts nothing), and the reading of its
    rows into each quota's units."""

    statement: str | None
    params: list[Any]
    wanted: list[tuple[str, list[str]]]

    def units(self, rows: Iterable[tuple[str, str, Any]]) -> list[int]:
        """Each quota's units, from the statement's rows (tag, status, units)."""
        found = {(tag, status): units for tag, status, units in rows}
        return [int(sum(found.get((tag, status), 0) for status in s)) for tag, s in self.wanted]


def units_statement(
    connection: BaseDatabaseWrapper, quotas: Sequence[Quota], namespace: str | None
) -> UnitsQuery:
    """The :class:`UnitsQuery` of ``quotas``' units in ``namespace`` (every one: ``None``)."""
    wanted = [(quota.tag, list(dict.fromkeys(quota.count_statuses))) for quota in quotas]
    tags = list(dict.fromkeys(tag for tag, _ in wanted))
    statuses = list(dict.fromkeys(status for _, s in wanted for status in s))
    if not tags or not statuses:
        return UnitsQuery(None, [], wanted)
    params: list[Any] = [*tags, *statuses]
    if namespace is not None:
        params.append(namespace)
    statement = portable_sql(connection).units(len(tags), len(statuses), namespace is not None)
    return UnitsQuery(statement, params, wanted)


def units_query(
    connection: BaseDatabaseWrapper, quotas: Sequence[Quota], namespace: str | None
) -> list[int]:
    """``RunTagQuerySet.units`` for ``quotas``, its statement sent on the cursor."""
    query = units_statement(connection, quotas, namespace)
    if query.statement is None:
        return query.units(())
    with connection.cursor() as cursor:
        cursor.execute(query.statement, query.params)
        return query.units(cursor.fetchall())


def routine_outcome(
    start: StartRequest,
    row: Sequence[Any],
    read_namespace: str | None,
    timed: Callable[[Refusal], Refusal] | None = None,
) -> StartOutcome:
    """A server routine's answer to ``start`` (``durable_start_run_v2``,
    ``durable_start_run_mariadb_v1``): its row ``(outcome, refused, active, workflow,
    namespace, refused_limit)``, the refusal decoded by ``admission.refused_by``, given
    its exact ``retry_after`` by ``timed`` for a start under a rate limit
    (``base.timed_refusal``), and raised."""
    outcome, refused, active, workflow, namespace, limit = row
    run = start.run
    if outcome == "refused":
        refusal = refused_by(start.quotas, refused, active, limit)
        raise (refusal if timed is None else timed(refusal)).error(run.workflow)
    if outcome == "exists":
        return existing_outcome(run, workflow, namespace, read_namespace)
    return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)
