"""The default store: runs in the project's database, through the Django ORM.

Each operation takes one of these paths:

- on PostgreSQL (``fast_path=True``, the default), one call of a function of
  ``stores/postgres/functions.sql``, installed by migration 0002_routines: a start
  (``durable_start_run_v2``: the advisory lock of each quota key, the existing-run check,
  the weighted counts and the inserts), a batch of starts (``durable_start_runs_v2``:
  every key of the batch locked in byte order, each key's units counted
  once, the elements decided in order, one insert of the runs and one of their tags), a
  claim that also returns the run and its recorded steps (``durable_claim_run_v1``), a
  step's record with the check that the worker still holds the run
  (``durable_record_held_step_v1``), and a status change of the run and its tags
  together, with the turn's last record at the end of a turn (``durable_transition_v1``).
  Each is one round trip, one statement for its caller, planned once per connection.
  The first start on a connection sends the start function's statements instead
  (``stores/postgres/first_start.py``, one round trip): a new server process plans them faster than
  it compiles the function;
- on MariaDB (``fast_path=True``), ``start_run`` is one ``CALL`` of the stored procedure
  ``durable_start_run_mariadb_v1`` (``stores/mariadb/procedures.sql``): the portable
  start's steps below, under the same lock rows, in one round trip
  (:meth:`OrmStore._start_on_mariadb`);
- elsewhere (SQLite, MySQL, and on MariaDB everything but ``start_run``), and for what
  no function covers (a step's record replacing a failed one, a claim or a transition
  setting other columns), the portable path: the ORM's queries in one transaction; a
  start's are parameterised statements written once per database vendor
  (:class:`PortableSql`). A start locks its keys' ``QuotaLock`` rows (on SQLite one
  upsert, which takes the database's write lock; on MySQL/MariaDB one ``UPDATE`` of the
  rows in key order, inserted and committed beforehand when a key is new), then checks
  for an existing run, counts every key in one query and inserts. On MariaDB the
  procedure locks the same rows the same way, so its starts and the portable path's
  (``fast_path=False``, ``start_runs``, retries) serialise against each other. On PostgreSQL
  the portable path (``fast_path=False``, and retries) takes the function's
  advisory locks instead (``durable_lock_quota_key_v1``, ``durable_lock_quota_keys_v1``),
  so the two paths serialise against each other.

A start the database rolls back to break a deadlock is tried again (``start_run``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, IntegrityError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from ..admission import decide, refused_by
from ..concurrency import Quota
from ..db import connection_lost
from ..errors import ConcurrencyLimitError, DurableError
from ..limits import TAG_PREFIX
from ..models import QuotaLock, Run, RunQuerySet, RunTag, Signal, Step, model_field
from ..records import NewRun, RunRecord, StartOutcome, StepRecord
from ..retention import active_ancestors
from ..status import TERMINAL_STATUSES, RunStatus
from ..tickets import KeptTicket, Ticket
from . import ticket_rows
from .base import (
    AsyncReleaseListener,
    BaseStore,
    ReleaseListener,
    StartRequest,
    batch_index,
    check_batch_ids,
    check_quotas,
    existing_outcome,
    is_holders_check,
    quota_list,
    quota_transaction,
)
from .database_checks import collation_errors, database_warnings
from .postgres import arrays, first_start
from .postgres.bound import fetch_one
from .postgres.committing import (
    NOT_HELD_SQLSTATE,
    commits_in_statement,
    execute_and_commit,
    sqlstate,
)

#: The calls of the functions of ``stores/postgres/functions.sql``.
_LOCK_KEY_SQL = "SELECT durable_lock_quota_key_v1(%s)"
_LOCK_KEYS_SQL = "SELECT durable_lock_quota_keys_v1(%s::text[])"
_START_SQL = (
    "SELECT outcome, refused, active, found_workflow, found_namespace FROM "
    "durable_start_run_v2(%s, %s, %s, %s, %s, %s::jsonb, %s::text[], %s, %s, %s, "
    "%s::text[], %s::integer[], %s::integer[], %s::text[], %s)"
)
_START_MANY_SQL = (
    "SELECT position, outcome, refused, active, found_workflow, found_namespace "
    "FROM durable_start_runs_v2(%s::jsonb, %s)"
)
#: The isolation level of the current transaction, and the first of the keys ``%s``
#: whose advisory lock (``durable_lock_quota_key_v1``: a bigint, shown by ``pg_locks`` as
#: its high and low 32 bits) it holds.
_HELD_KEYS_SQL = (
    "SELECT current_setting('transaction_isolation'), ("
    "SELECT min(k) FROM unnest(%s::text[]) AS k JOIN pg_locks AS l ON l.locktype = 'advisory' "
    "AND l.pid = pg_backend_pid() AND l.granted AND l.objsubid = 1 "
    "AND l.classid = ((hashtextextended('durable_django:' || k, 0) >> 32) & 4294967295)::oid "
    "AND l.objid = (hashtextextended('durable_django:' || k, 0) & 4294967295)::oid)"
)
_CLAIM_SQL = "SELECT * FROM durable_claim_run_v1(%s, %s, %s, %s, %s, %s)"
_RECORD_HELD_SQL = "SELECT durable_record_held_step_v1(%s, %s, %s::integer, %s, %s, %s, %s)"
_RECORD_HELD_V2_SQL = "SELECT durable_record_held_step_v2(%s, %s, %s::integer, %s, %s, %s, %s)"
_TRANSITION_SQL = (
    "SELECT durable_transition_v1(%s, %s::text[], %s, %s, %s, %s, %s, %s::text[], "
    "%s, %s, %s, %s, %s, %s, %s, %s, %s::integer, %s, %s::integer, %s, %s, %s)"
)
#: ``json.dumps(value, cls=DjangoJSONEncoder)``'s encoder, made once (it keeps no state):
#: a start's input, a batch of starts.
_JSON = DjangoJSONEncoder()


class OrmStore(BaseStore):
    """Keeps runs in the database ``using`` (default ``"default"``) through the ORM.

    ``fast_path=False`` makes PostgreSQL take the portable path too, and MariaDB start
    runs on it rather than by its procedure. Each method does what
    :class:`~durable_django.stores.BaseStore` says; it overrides the composites with the
    database's own means (row and advisory locks, one ``COUNT``, one statement on
    PostgreSQL, one ``CALL`` for a start on MariaDB).
    """

    is_shared = True
    using: str

    def __init__(self, using: str = "default", *, fast_path: bool = True) -> None:
        self.using = using
        self.fast_path = fast_path

    def __repr__(self) -> str:
        return f"OrmStore(using={self.using!r})"

    def connection_lost(self, error: BaseException) -> bool:
        return connection_lost(error, self.using)

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        """The checks of its database: from its settings, that the quota can serialise
        starts there (``W001``, ``E002``); with ``databases`` naming it (``check
        --database``, ``migrate``), that its columns compare ids and keys exactly
        (``E004``)."""
        messages = database_warnings({self.using: settings.DATABASES.get(self.using, {})})
        if self.using in (kwargs.get("databases") or ()):
            messages += collation_errors(connections[self.using])
        return messages

    # transactions -------------------------------------------------------------------

    def atomic(self) -> contextlib.AbstractContextManager[Any]:
        return transaction.atomic(using=self.using)

    def on_commit(self, callback: Callable[[], None]) -> None:
        # robust: a broker that is down must not fail a start whose run is committed;
        # the error is logged and the tick sends the run again.
        transaction.on_commit(callback, using=self.using, robust=True)

    def quota_lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """One transaction holding the key's lock until it ends (:meth:`quota_locks`)."""
        return self.quota_locks((key,))

    @contextlib.contextmanager
    def quota_locks(self, keys: Collection[str]) -> Iterator[None]:
        """One transaction holding the lock of every key of ``keys`` until it ends, taken
        in the keys' code point order (their byte order).

        On PostgreSQL the transaction-scoped advisory locks ``durable_start_run_v2`` takes
        (``durable_lock_quota_key_v1``, ``durable_lock_quota_keys_v1``, so both paths
        serialise against each other); on MySQL/MariaDB the locks of the keys' existing rows
        (:meth:`_row_lock`); elsewhere the keys' lock rows, written by one upsert.
        """
        ordered = sorted(set(keys))
        connection = connections[self.using]
        if not ordered:
            with transaction.atomic(using=self.using):
                yield
            return
        if connection.vendor == "mysql":
            with self._row_lock(ordered):
                yield
            return
        with transaction.atomic(using=self.using):
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    if len(ordered) == 1:
                        cursor.execute(_LOCK_KEY_SQL, ordered)
                    else:
                        cursor.execute(_LOCK_KEYS_SQL, [ordered])
                yield
                return
            with connection.cursor() as cursor:
                cursor.execute(
                    portable_sql(connection).upsert_locks(len(ordered)),
                    [
                        value
                        for key in ordered
                        for value in (key, connection.ops.adapt_datetimefield_value(timezone.now()))
                    ],
                )
            yield

    @contextlib.contextmanager
    def _row_lock(self, keys: list[str]) -> Iterator[None]:
        """A transaction holding the locks of the keys' rows (``keys`` sorted), taken by one
        ``UPDATE`` of the existing rows in key order, which locks those records and no gap.

        The row of a new key is inserted and committed before any start's transaction
        locks it: an insert inside the start's transaction makes every concurrent starter
        of the key wait with a gap lock, and when the insert is rolled back (as every
        refused start is) those gap locks deadlock them. Outside a transaction of the
        caller's the insert runs on this connection before the start's transaction
        begins; inside one, on a connection of its own. The rows are locked in key order
        (``UPDATE ... ORDER BY``), in one statement, so that starters of overlapping keys
        never wait on each other in a cycle.
        """
        connection = connections[self.using]
        rows = QuotaLock.objects.using(self.using).filter(key__in=keys)
        if in_callers_transaction(connection):
            with transaction.atomic(using=self.using):
                if len(keys) > 1:
                    # A read that takes no lock: the new keys' rows are inserted before the
                    # update below locks every row, in order.
                    existing = set(rows.values_list("key", flat=True))
                    missing = [key for key in keys if key not in existing]
                else:
                    missing = [] if update_lock_rows(connection, keys) else keys
                if missing or len(keys) > 1:
                    if missing:
                        insert_lock_rows_apart(connection, missing)
                    _lock_inserted_rows(connection, keys)
                yield
            return
        with transaction.atomic(using=self.using):
            if update_lock_rows(connection, keys) == len(keys):
                yield
                return
        for key in keys:
            insert_lock_row(connection, key)
        with transaction.atomic(using=self.using):
            _lock_inserted_rows(connection, keys)
            yield

    # starting -----------------------------------------------------------------------

    def start_run(
        self,
        run: NewRun,
        quotas: Quota | Sequence[Quota] | None,
        *,
        check_existing: bool,
        read_namespace: str | None,
        ticket: Ticket | None = None,
    ) -> StartOutcome:
        """Existing-run check, quota checks and insert, as one transaction.

        A start the database chose as the victim of a deadlock is tried again, up to
        :data:`START_ATTEMPTS` times in all, unless it ran inside a transaction of the
        caller's, which the database rolled back whole: then the error is raised, with a
        note saying so.
        """
        quotas = quota_list(quotas)
        attempt = 1
        while True:
            try:
                return self._start(run, quotas, check_existing, read_namespace, ticket)
            except OperationalError as error:
                self._raise_unless_retried(error, attempt, f"The start of run {run.run_id!r}")
            attempt += 1

    def _start(
        self,
        run: NewRun,
        quotas: tuple[Quota, ...],
        check_existing: bool,
        read_namespace: str | None,
        ticket: Ticket | None,
    ) -> StartOutcome:
        # A fair quota's tickets are read by the portable path only: the server-side
        # starts know none.
        server_side = not any(quota.fair for quota in quotas)
        if server_side and self._fast():
            return self._start_on_postgresql(run, quotas, check_existing, read_namespace)
        try:
            if server_side and self._procedure():
                return self._start_on_mariadb(run, quotas, check_existing, read_namespace)
            return self._start_portable(run, quotas, check_existing, read_namespace, ticket)
        except IntegrityError:
            # The id is taken: by a concurrent start without a quota lock that inserted it
            # first, or, unchecked, by a run already there (BaseStore.start_run).
            existing = self.get_run(run.run_id)
            if existing is None:
                raise
            return existing_outcome(run, existing.workflow, existing.namespace, read_namespace)

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

    def _start_on_postgresql(
        self,
        run: NewRun,
        quotas: tuple[Quota, ...],
        check_existing: bool,
        read_namespace: str | None,
    ) -> StartOutcome:
        """One call of ``durable_start_run_v2``, its arrays passed as array literals
        (``postgres.arrays``); or, for the first start on a connection
        (``first_start.by_statements``), its statements sent without the function."""
        connection = connections[self.using]
        connection.ensure_connection()
        if first_start.by_statements(connection, quotas):
            return self._start_by_statements(run, quotas, check_existing, read_namespace)
        params = [
            run.run_id,
            check_existing,
            run.workflow,
            run.version,
            run.namespace,
            _JSON.encode(run.input),
            arrays.text_array(run.tags),
            run.queue,
            run.parent_id,
            run.attempt,
            arrays.text_array([quota.key for quota in quotas]),
            arrays.integer_array([quota.limit for quota in quotas]),
            arrays.integer_array([quota.weight for quota in quotas]),
            _statuses_literal(tuple(tuple(quota.count_statuses) for quota in quotas)),
            read_namespace,
        ]
        row = fetch_one(connection, _START_SQL, params)
        assert row is not None
        outcome, refused, active, workflow, namespace = row
        if outcome == "refused":
            raise refused_by(quotas, refused, active).error(run.workflow)
        if outcome == "exists":
            return existing_outcome(run, workflow, namespace, read_namespace)
        return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)

    def _start_by_statements(
        self,
        run: NewRun,
        quotas: tuple[Quota, ...],
        check_existing: bool,
        read_namespace: str | None,
    ) -> StartOutcome:
        """What ``durable_start_run_v2`` does, as the statements of one query string
        (``first_start.statements``): one round trip, one transaction of its own outside the
        caller's."""
        sql, params = first_start.statements(run, quotas, check_existing, read_namespace)
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            while cursor.nextset():
                pass
            found_workflow, found_namespace, inserted, *actives = cursor.fetchone()
        if found_workflow is not None:
            return existing_outcome(run, found_workflow, found_namespace, read_namespace)
        if inserted:
            return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)
        refusal = decide(quotas, actives)
        if refusal is not None:
            raise refusal.error(run.workflow)
        # Admitted, but a concurrent start without a quota lock inserted this id first;
        # it has committed by now, and this statement's snapshot sees it.
        with connections[self.using].cursor() as cursor:
            cursor.execute(first_start.EXISTING_SQL, [run.run_id])
            workflow, namespace = cursor.fetchone()
        return existing_outcome(run, workflow, namespace, read_namespace)

    def _start_on_mariadb(
        self,
        run: NewRun,
        quotas: tuple[Quota, ...],
        check_existing: bool,
        read_namespace: str | None,
    ) -> StartOutcome:
        """One ``CALL`` of the procedure ``durable_start_run_mariadb_v1`` (``procedures.sql``),
        which takes the portable start's steps under the same locks (:meth:`_row_lock`).

        Outside a transaction of the caller's the procedure runs its own transaction,
        committed or rolled back before it returns: the whole start is one round trip.
        Inside one it runs in a savepoint of it, commits nothing, and the savepoint is
        rolled back if it fails. When a key's lock row is missing the procedure locks and
        writes nothing and says so (``missing``); the rows are then inserted and committed
        on their own, as :meth:`_row_lock` does, and the procedure is called again.
        """
        connection = connections[self.using]
        keys = sorted({quota.key for quota in quotas})
        params = _procedure_params(connection, run, quotas, keys, check_existing, read_namespace)
        own = not in_callers_transaction(connection)
        for attempt in (1, 2):
            params[-1] = own
            with (
                contextlib.nullcontext() if own else transaction.atomic(using=self.using),
                connection.cursor() as cursor,
            ):
                cursor.execute(_MARIADB_START_SQL, params)
                outcome, refused, active, workflow, namespace = cursor.fetchone()
            if outcome != "missing":
                break
            if attempt == 2:
                raise DurableError(
                    f"a quota key of {keys!r} has no lock row although one was just "
                    "inserted: durable_quota_lock rows must not be deleted"
                )
            if own:
                for key in keys:
                    insert_lock_row(connection, key)
            else:
                # A read that takes no lock finds the missing rows.
                rows = QuotaLock.objects.using(self.using).filter(key__in=keys)
                existing = set(rows.values_list("key", flat=True))
                insert_lock_rows_apart(connection, [key for key in keys if key not in existing])
        if outcome == "refused":
            raise refused_by(quotas, refused, active).error(run.workflow)
        if outcome == "exists":
            return existing_outcome(run, workflow, namespace, read_namespace)
        return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)

    def start_runs(
        self, starts: Sequence[StartRequest], *, read_namespace: str | None
    ) -> list[StartOutcome | ConcurrencyLimitError]:
        """A batch of starts in one transaction, as :meth:`BaseStore.start_runs` says: on
        PostgreSQL one call of ``durable_start_runs_v2`` (one round trip), elsewhere the
        portable path.

        A batch the database chose as the victim of a deadlock is tried again, as a start
        is (:meth:`start_run`); so is one that met a run id a concurrent start without a
        quota inserted first, whose second attempt finds that run.
        """
        check_batch_ids(starts)
        attempt = 1
        while True:
            try:
                if self._fast() and not any(q.fair for start in starts for q in start.quotas):
                    return self._start_many_on_postgresql(starts, read_namespace)
                return super().start_runs(starts, read_namespace=read_namespace)
            except IntegrityError:
                if attempt >= START_ATTEMPTS:
                    raise
            except OperationalError as error:
                self._raise_unless_retried(error, attempt, "A batch of starts")
            attempt += 1

    def _raise_unless_retried(self, error: OperationalError, attempt: int, what: str) -> None:
        """Raise ``error`` unless it is a deadlock the start (``what``) may be tried again
        after: attempts remain, and the transaction the database rolled back was the
        start's own, not a caller's (then the error gets a note saying so)."""
        if not is_deadlock(error) or attempt >= START_ATTEMPTS:
            raise error
        if in_callers_transaction(connections[self.using]):
            error.add_note(
                f"{what} was chosen as the victim of a deadlock: the database rolled back "
                "the whole transaction it ran in, the caller's. Run that transaction again "
                "from its beginning."
            )
            raise error

    def _start_many_on_postgresql(
        self, starts: Sequence[StartRequest], read_namespace: str | None
    ) -> list[StartOutcome | ConcurrencyLimitError]:
        batch = [_start_json(start) for start in starts]
        with transaction.atomic(using=self.using):
            with connections[self.using].cursor() as cursor:
                cursor.execute(_START_MANY_SQL, [_JSON.encode(batch), read_namespace])
                rows = cursor.fetchall()
            assert [row[0] for row in rows] == list(range(1, len(starts) + 1))
            outcomes: list[StartOutcome | ConcurrencyLimitError] = []
            for index, (start, (_, outcome, refused, active, workflow, namespace)) in enumerate(
                zip(starts, rows, strict=True)
            ):
                run = start.run
                if outcome == "refused":
                    outcomes.append(refused_by(start.quotas, refused, active).error(run.workflow))
                elif outcome == "exists":
                    # A clash raises here, inside the transaction: the batch is undone.
                    with batch_index(index):
                        outcomes.append(existing_outcome(run, workflow, namespace, read_namespace))
                else:
                    outcomes.append(StartOutcome(True, run.workflow, run.namespace))
            return outcomes

    # fair quotas' tickets: durable_django.stores.ticket_rows ---------------------------

    def ticket_line(self, key: str, namespace: str | None = None) -> list[KeptTicket]:
        return ticket_rows.line(self.using, key, namespace)

    def keep_ticket(self, ticket: KeptTicket, *, most: int) -> None:
        ticket_rows.keep(self.using, ticket, most)

    def hold_tickets(self, key: str, namespace: str | None, until: datetime) -> None:
        ticket_rows.hold(self.using, key, namespace, until)

    def end_hold(self, key: str, namespace: str | None, now: datetime) -> None:
        ticket_rows.end_hold(self.using, key, namespace, now)

    def drop_ticket(self, ticket_id: str) -> None:
        ticket_rows.drop(self.using, ticket_id)

    def purge_tickets(self, expired_before: datetime, limit: int) -> int:
        return ticket_rows.purge(self.using, expired_before, limit)

    # runs ---------------------------------------------------------------------------

    def in_transaction(self) -> bool:
        return connections[self.using].in_atomic_block

    def waiting_in_transaction(self, keys: Collection[str]) -> str | None:
        """On PostgreSQL a savepoint's rollback releases the advisory locks taken since
        (the keys' locks), so a start may wait in a ``READ COMMITTED`` transaction that does
        not hold one of its keys' locks already (one query tells both). Elsewhere a rolled
        back attempt keeps its locks: SQLite's write lock, InnoDB's row locks."""
        connection = connections[self.using]
        if connection.vendor == "sqlite":
            return "SQLite keeps the write lock a refused start took until the transaction ends"
        if connection.vendor != "postgresql":
            return (
                "MySQL and MariaDB keep the row locks a refused start took until the "
                "transaction ends"
            )
        with connection.cursor() as cursor:
            cursor.execute(_HELD_KEYS_SQL, [sorted(set(keys))])
            isolation, held = cursor.fetchone()
        if isolation != "read committed":
            return f"its isolation level, {isolation}, would never see a slot free"
        if held:
            return f"it holds the lock of quota key {held!r} (it started a run under it)"
        return None

    def reconnect(self) -> None:
        connection = connections[self.using]
        if not connection.in_atomic_block:
            with contextlib.suppress(Exception):
                connection.close()

    def release_listener(self, keys: Collection[str]) -> ReleaseListener | None:
        if connections[self.using].vendor != "postgresql":
            return None
        from .postgres.listening import PostgresReleaseListener

        return PostgresReleaseListener(self.using, keys)

    async def arelease_listener(self, keys: Collection[str]) -> AsyncReleaseListener | None:
        if connections[self.using].vendor != "postgresql":
            return None
        from .postgres.listening import AsyncPostgresReleaseListener

        return await AsyncPostgresReleaseListener.open(self.using, keys)

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

    def create_run(self, run: NewRun) -> None:
        now = timezone.now()
        with transaction.atomic(using=self.using, savepoint=False):
            self._runs().create(
                id=run.run_id,
                workflow=run.workflow,
                version=run.version,
                namespace=run.namespace,
                status=RunStatus.PENDING,
                queue=run.queue,
                input=run.input,
                parent_id=run.parent_id,
                attempt=run.attempt,
                created_at=now,
                updated_at=now,
            )
            if run.tags:
                RunTag.objects.using(self.using).bulk_create(
                    RunTag(
                        run_id=run.run_id,
                        tag=tag,
                        status=RunStatus.PENDING,
                        namespace=run.namespace,
                        weight=run.weights.get(tag, 1),
                    )
                    for tag in run.tags
                )

    def get_run(self, run_id: str) -> RunRecord | None:
        row = self._runs().filter(pk=run_id).prefetch_related("tag_rows").first()
        return _record(row) if row is not None else None

    def existing_runs(self, run_ids: Collection[str]) -> dict[str, tuple[str, str]]:
        """One query for the whole batch."""
        rows = self._runs().filter(pk__in=list(run_ids)).values_list("id", "workflow", "namespace")
        return {run_id: (workflow, namespace) for run_id, workflow, namespace in rows}

    def list_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        workflow: str | None = None,
        namespace: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        rows = self._runs().prefetch_related("tag_rows").order_by("-created_at", "-pk")
        if tag is not None:
            rows = rows.tagged(tag)
        if statuses is not None:
            rows = rows.filter(status__in=list(statuses))
        if workflow is not None:
            rows = rows.filter(workflow=workflow)
        if namespace is not None:
            rows = rows.filter(namespace=namespace)
        if limit is not None:
            rows = rows[:limit]
        return [_record(row) for row in rows]

    def count_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        if tag is not None:
            return RunTag.objects.using(self.using).count_runs(
                tag=tag,
                statuses=list(statuses) if statuses is not None else RunStatus.values,
                namespace=namespace,
            )
        rows = self._runs()
        if statuses is not None:
            rows = rows.filter(status__in=list(statuses))
        if namespace is not None:
            rows = rows.filter(namespace=namespace)
        return rows.count()

    def quota_units(self, quotas: Sequence[Quota], namespace: str | None) -> list[int]:
        """Every quota's units in one query (``RunTagQuerySet.units``; elsewhere than on
        PostgreSQL, its statement written once per shape and sent on the cursor)."""
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            return RunTag.objects.using(self.using).units(
                [(quota.tag, quota.count_statuses) for quota in quotas], namespace
            )
        return units_query(connection, quotas, namespace)

    def transition(
        self,
        run_id: str,
        from_statuses: Collection[str],
        status: str,
        *,
        owner: str | None = None,
        lease_expired_before: datetime | None = None,
        updated_before: datetime | None = None,
        **fields: Any,
    ) -> bool:
        if is_holders_check(from_statuses, status, owner, fields):
            # Lock the run's row, change nothing (``updated_at`` included).
            held = self._runs().filter(pk=run_id, status=status, lease_owner=owner)
            with transaction.atomic(using=self.using, savepoint=False):
                return held.select_for_update().exists()
        if self._fast() and _function_sets(fields):
            return self._transition_on_postgresql(
                run_id, from_statuses, status, owner, lease_expired_before, updated_before, fields
            )
        rows = self._runs().filter(pk=run_id, status__in=list(from_statuses))
        if owner is not None:
            rows = rows.filter(lease_owner=owner)
        if lease_expired_before is not None:
            rows = rows.filter(lease_expires_at__lt=lease_expired_before)
        if updated_before is not None:
            rows = rows.filter(updated_at__lt=updated_before)
        with transaction.atomic(using=self.using, savepoint=False):
            changed = rows.update(status=status, updated_at=timezone.now(), **fields)
            if changed and set(from_statuses) != {status}:
                RunTag.objects.using(self.using).filter(run_id=run_id).update(status=status)
        return bool(changed)

    def end_turn(
        self, run_id: str, owner: str, status: str, step: StepRecord, **fields: Any
    ) -> bool:
        """``transition(run_id, [RUNNING], status, owner=owner, **fields)`` and, when it
        happens, ``record_step(run_id, step)``, in one transaction; on PostgreSQL one
        statement. The turn's last step is recorded with the transition ending the turn."""
        if not self._fast() or not _function_sets(fields):
            return super().end_turn(run_id, owner, status, step, **fields)
        return self._transition_on_postgresql(
            run_id, [RunStatus.RUNNING], status, owner, None, None, fields, step
        )

    def _transition_on_postgresql(
        self,
        run_id: str,
        from_statuses: Collection[str],
        status: str,
        owner: str | None,
        lease_expired_before: datetime | None,
        updated_before: datetime | None,
        fields: dict[str, Any],
        step: StepRecord | None = None,
    ) -> bool:
        """One call of ``durable_transition_v1``, with ``step`` to record if given."""
        connection = connections[self.using]
        params: list[Any] = [
            run_id,
            [str(s) for s in from_statuses],
            str(status),
            timezone.now(),
            owner,
            lease_expired_before,
            updated_before,
            list(fields),
        ]
        for name in _TRANSITION_FIELDS:
            value = fields.get(name)
            if name in fields and name in _JSON_FIELDS:
                value = model_field(Run, name, JSONField).get_db_prep_save(value, connection)
            params.append(value)
        if step is None:
            params += [None, None, None, None]
        else:
            params += [step.position, step.name, *_step_json(step, connection)]
        row = fetch_one(connection, _TRANSITION_SQL, params)
        assert row is not None
        return bool(row[0])

    def claim_run(self, run_id: str, **fields: Any) -> tuple[RunRecord, list[StepRecord]] | None:
        """Move a pending run to running with ``fields``; return it and its recorded steps,
        or ``None`` when it was not pending. ``transition``, ``get_run`` and ``get_steps``
        in one; on PostgreSQL, for a worker's claim (``lease_owner``, ``lease_expires_at``,
        ``started_at`` and ``wake_at=None``), one call of ``durable_claim_run_v1``."""
        if not self._fast() or fields.keys() != _CLAIM_FIELDS or fields["wake_at"] is not None:
            return super().claim_run(run_id, **fields)
        connection = connections[self.using]
        params = [
            run_id,
            fields["lease_owner"],
            fields["lease_expires_at"],
            fields["started_at"],
            timezone.now(),
            # Outside a transaction of the caller's, the claim's commit need not wait for
            # the disk (functions.sql says why that is safe).
            not connection.in_atomic_block,
        ]
        row = fetch_one(connection, _CLAIM_SQL, params)
        if row is None:
            return None
        *values, tags, steps = row
        run = dict(zip(_RUN_COLUMNS, values, strict=True))
        for name in ("input", "output", "error", "wait"):
            field = model_field(Run, name, JSONField)
            run[name] = field.from_db_value(run[name], field.cached_col, connection)
        record = RunRecord(run_id=run.pop("id"), tags=sorted(tags), **run)
        return record, [
            StepRecord(position=position, name=name, result=result, error=error)
            for position, name, result, error in steps or ()
        ]

    def due_runs(self, now: datetime, pending_before: datetime, limit: int) -> list[RunRecord]:
        due = (
            Q(status__in=[RunStatus.SUSPENDED, RunStatus.BLOCKED], wake_at__lte=now)
            | Q(status=RunStatus.RUNNING, lease_expires_at__lt=now)
            | Q(status=RunStatus.PENDING, updated_at__lt=pending_before)
        )
        rows = self._runs().filter(due).order_by("updated_at")[:limit]
        return [_record(row, tags=[]) for row in rows]

    def get_steps(self, run_id: str) -> list[StepRecord]:
        rows = Step.objects.using(self.using).filter(run_id=run_id).order_by("position")
        return [
            StepRecord(position=s.position, name=s.name, result=s.result, error=s.error)
            for s in rows
        ]

    def record_step(self, run_id: str, step: StepRecord, *, replace: bool = False) -> None:
        steps = Step.objects.using(self.using)
        if replace:
            steps.filter(run_id=run_id, position=step.position).update(
                name=step.name, result=step.result, error=step.error, created_at=timezone.now()
            )
            return
        steps.create(
            run_id=run_id,
            position=step.position,
            name=step.name,
            result=step.result,
            error=step.error,
        )

    def record_held_step(
        self, run_id: str, step: StepRecord, owner: str, *, replace: bool = False
    ) -> bool:
        """Record ``step`` only while ``owner`` holds the running run; False (and nothing
        recorded) when it does not. ``transition(run_id, [RUNNING], RUNNING, owner=owner)``
        and ``record_step`` in one transaction; on PostgreSQL, unless it replaces a record,
        one call of ``durable_record_held_step_v1``."""
        if not self._fast() or replace:
            return super().record_held_step(run_id, step, owner, replace=replace)
        connection = connections[self.using]
        result, error = _step_json(step, connection)
        row = fetch_one(
            connection,
            _RECORD_HELD_SQL,
            [run_id, owner, step.position, step.name, result, error, timezone.now()],
        )
        assert row is not None
        return bool(row[0])

    def commit_held_step(self, run_id: str, step: StepRecord, owner: str) -> bool:
        """``record_held_step``, then, on PostgreSQL when the step's ``atomic()`` is the
        connection's outermost, the transaction's ``COMMIT`` in the same query string:
        one round trip (``durable_record_held_step_v2`` raises when the run is no longer
        held, so that the server skips the ``COMMIT``; the transaction is then marked
        for rollback and False returned). The ``atomic()`` then finds nothing to commit
        and runs its ``on_commit`` callbacks as usual."""
        connection = connections[self.using]
        if not self._fast() or not commits_in_statement(connection):
            return self.record_held_step(run_id, step, owner)
        result, error = _step_json(step, connection)
        params = [run_id, owner, step.position, step.name, result, error, timezone.now()]
        try:
            execute_and_commit(connection, _RECORD_HELD_V2_SQL, params)
        except DatabaseError as failure:
            if sqlstate(failure) != NOT_HELD_SQLSTATE:
                raise
            transaction.set_rollback(True, using=self.using)
            return False
        return True

    def delete_run(self, run_id: str) -> None:
        # Its tags and steps go with it (Django deletes them first, by run id).
        self._runs().filter(pk=run_id).delete()

    def forget_failed_steps(self, run_id: str) -> None:
        Step.objects.using(self.using).filter(run_id=run_id, error__isnull=False).delete()

    def set_quota_tags(self, run_id: str, weights: Mapping[str, int]) -> None:
        tags = RunTag.objects.using(self.using)
        with transaction.atomic(using=self.using, savepoint=False):
            tags.filter(quota_tags(self.using), run_id=run_id).exclude(
                tag__in=list(weights)
            ).delete()
            if not weights:
                return
            run = self._runs().only("status", "namespace").get(pk=run_id)
            present = set(
                tags.filter(run_id=run_id, tag__in=list(weights)).values_list("tag", flat=True)
            )
            for tag in present:
                tags.filter(run_id=run_id, tag=tag).update(status=run.status, weight=weights[tag])
            tags.bulk_create(
                RunTag(
                    run_id=run_id,
                    tag=tag,
                    status=run.status,
                    namespace=run.namespace,
                    weight=units,
                )
                for tag, units in weights.items()
                if tag not in present
            )

    def quota_keys(
        self, statuses: Collection[str], namespace: str | None
    ) -> dict[str, dict[str, int]]:
        """``{key: {workflow: units}}`` for the quota keys holding runs in ``statuses``."""
        rows = RunTag.objects.using(self.using).filter(
            quota_tags(self.using), status__in=list(statuses)
        )
        if namespace is not None:
            rows = rows.filter(namespace=namespace)
        found: dict[str, dict[str, int]] = {}
        for tag, workflow, count in rows.values_list("tag", "run__workflow").annotate(
            count=Sum("weight")
        ):
            found.setdefault(tag[len(TAG_PREFIX) :], {})[workflow] = count
        return found

    def quota_holders(
        self, tag: str, statuses: Collection[str], namespace: str | None
    ) -> list[RunRecord]:
        """The key's holders: their tag rows found through the tag index, then their runs
        by primary key, oldest first."""
        tagged = RunTag.objects.using(self.using).filter(tag=tag, status__in=list(statuses))
        if namespace is not None:
            tagged = tagged.filter(namespace=namespace)
        weight = tagged.filter(run_id=OuterRef("pk")).values("weight")[:1]
        rows = self._runs().filter(pk__in=tagged.values("run_id"), status__in=list(statuses))
        rows = rows.annotate(key_weight=Subquery(weight))
        return [_holder_record(row, tag) for row in rows.order_by("created_at", "pk")]

    def finished_spans(
        self, tag: str, namespace: str | None, finished_since: datetime, limit: int
    ) -> list[tuple[datetime, datetime]]:
        """The key's finished tag rows found through the tag index, joined to their runs
        for the times, the latest ``limit`` that finished since ``finished_since``."""
        rows = RunTag.objects.using(self.using).filter(
            tag=tag,
            status__in=list(TERMINAL_STATUSES),
            run__finished_at__gte=finished_since,
        )
        if namespace is not None:
            rows = rows.filter(namespace=namespace)
        found = rows.order_by("-run__finished_at").values_list(
            "run__created_at", "run__finished_at"
        )[:limit]
        return [(created, finished) for created, finished in found if finished is not None]

    # signals ------------------------------------------------------------------------

    def send_signal(self, token: str, payload: Any) -> None:
        Signal.objects.using(self.using).create(token=token, payload=payload)

    def take_signal(self, run_id: str, token: str, step: StepRecord) -> tuple[bool, Any]:
        signals = Signal.objects.using(self.using)
        with transaction.atomic(using=self.using):
            kept = signals.filter(token=token, consumed_by="").order_by("id")
            if connections[self.using].features.has_select_for_update_skip_locked:
                kept = kept.select_for_update(skip_locked=True)
            signal = kept.first()
            if signal is None:
                return False, None
            signals.filter(pk=signal.pk).update(consumed_by=run_id, consumed_at=timezone.now())
            self.record_step(run_id, dataclasses.replace(step, result=signal.payload))
        return True, signal.payload

    def has_signal(self, token: str) -> bool:
        return Signal.objects.using(self.using).filter(token=token, consumed_by="").exists()

    def runs_waiting_on_signal(self, token: str) -> list[RunRecord]:
        rows = self._runs().filter(status=RunStatus.SUSPENDED, wait__signal=token)
        # MySQL/MariaDB compare the strings of a JSON column ignoring trailing spaces.
        return [
            _record(row, tags=[])
            for row in rows
            if row.wait is not None and row.wait.get("signal") == token
        ]

    # retention ----------------------------------------------------------------------

    def purge_runs(
        self,
        finished_before: datetime,
        statuses: Collection[str],
        namespace: str | None,
        limit: int,
        after: str | None = None,
    ) -> tuple[int, str | None]:
        """Delete, in one transaction, those of the next ``limit`` runs (by id, after
        ``after``) in ``statuses`` that finished before ``finished_before`` (in
        ``namespace`` when given) whose whole ancestry has finished, with their tags and
        steps. Returns how many it deleted and the id to go on after (``None``: no run
        left). Runs held by another transaction (a retry under way), or whose ancestor
        is, are skipped."""
        runs = self._runs().filter(status__in=list(statuses), finished_at__lt=finished_before)
        if namespace is not None:
            runs = runs.filter(namespace=namespace)
        if after is not None:
            runs = runs.filter(pk__gt=after)
        with transaction.atomic(using=self.using):
            batch = list(
                runs.select_for_update(skip_locked=True)
                .order_by("pk")
                .values_list("pk", "parent_id")[:limit]
            )
            deleted = self._delete_with_finished_ancestry(dict(batch))
        return len(deleted), batch[-1][0] if len(batch) == limit else None

    def delete_runs(self, run_ids: Collection[str]) -> list[str]:
        """Delete those of ``run_ids`` that have finished and whose whole ancestry has
        finished, with their tags and steps, in one transaction; return their ids. The
        others stay: active, held by another transaction, or below an active run."""
        with transaction.atomic(using=self.using):
            batch = (
                self._runs()
                .filter(pk__in=list(run_ids), status__in=TERMINAL_STATUSES)
                .select_for_update(skip_locked=True)
                .values_list("pk", "parent_id")
            )
            return self._delete_with_finished_ancestry(dict(batch))

    def _delete_with_finished_ancestry(self, batch: dict[str, str | None]) -> list[str]:
        """Delete the runs of ``batch`` (locked, finished; ``{id: parent_id}``) whose
        ancestors have all finished; those ancestors stay locked until the transaction
        ends, so a retry cannot make one active again meanwhile."""
        below_active = active_ancestors(batch, self._lock_finished)
        ids = [run_id for run_id in batch if run_id not in below_active]
        if ids:
            # Its tags and steps go with it (Django deletes them first, by run id).
            self._runs().filter(pk__in=ids).delete()
        return ids

    def _lock_finished(self, run_ids: set[str]) -> dict[str, tuple[str, str | None]]:
        """``(status, parent_id)`` of the runs found among ``run_ids``, the finished ones
        locked until the transaction ends. A finished run another transaction holds (a
        retry under way) is reported as ``"locked"``; active runs are read, not locked."""
        runs = self._runs().filter(pk__in=list(run_ids))
        found = {
            run_id: (status, parent_id)
            for run_id, status, parent_id in runs.filter(status__in=TERMINAL_STATUSES)
            .select_for_update(skip_locked=True)
            .values_list("pk", "status", "parent_id")
        }
        if len(found) < len(run_ids):
            rest = runs.exclude(pk__in=list(found)).values_list("pk", "status", "parent_id")
            for run_id, status, parent_id in rest:
                found[run_id] = ("locked" if status in TERMINAL_STATUSES else status, parent_id)
        return found

    def purge_signals(self, taken_before: datetime, limit: int) -> int:
        """Delete up to ``limit`` signals taken by a run before ``taken_before``; signals
        still kept for a waiter stay."""
        signals = Signal.objects.using(self.using)
        with transaction.atomic(using=self.using):
            ids = list(
                signals.filter(consumed_at__lt=taken_before)
                .order_by()
                .values_list("pk", flat=True)[:limit]
            )
            if ids:
                signals.filter(pk__in=ids).delete()
        return len(ids)


#: The text just after every tag of a quota key in byte order: the prefix's last
#: character is followed by the next one.
_TAG_PREFIX_END = TAG_PREFIX[:-1] + chr(ord(TAG_PREFIX[-1]) + 1)


def quota_tags(using: str) -> Q:
    """The tags of quota keys: those starting with :data:`TAG_PREFIX`, byte for byte.

    Django's ``startswith`` is a ``LIKE``, case-sensitive on PostgreSQL and MySQL/MariaDB
    but not on SQLite, whose ``LIKE`` ignores the case of ASCII letters. There it is the
    range of tags that byte order (SQLite's ``BINARY`` collation) puts from the prefix
    up to :data:`_TAG_PREFIX_END`, which is also a range of the index on ``tag``.
    """
    if connections[using].vendor == "sqlite":
        return Q(tag__gte=TAG_PREFIX, tag__lt=_TAG_PREFIX_END)
    return Q(tag__startswith=TAG_PREFIX)


#: How many times a start is tried in all when the database breaks a deadlock by rolling
#: it back (only outside a transaction of the caller's).
START_ATTEMPTS = 3


def is_deadlock(error: DatabaseError) -> bool:
    """Whether the database rolled back the transaction to break a deadlock."""
    cause = error.__cause__
    if getattr(cause, "sqlstate", None) == "40P01":  # PostgreSQL's deadlock_detected
        return True
    return bool(error.args) and error.args[0] == 1213  # MySQL/MariaDB's ER_LOCK_DEADLOCK


def in_callers_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether a transaction of the caller's is open on ``connection``: an ``atomic()``
    block, or a connection without autocommit."""
    return connection.in_atomic_block or not connection.get_autocommit()


def insert_lock_row(connection: BaseDatabaseWrapper, key: str) -> None:
    """Insert, on a MySQL/MariaDB ``connection`` in autocommit, the lock row of quota
    ``key`` unless it exists.

    The existence test is a consistent read, which waits for no lock. When another
    starter inserts the same key at the same moment, one of the two inserts fails as a
    duplicate, and the row is there all the same.
    """
    quote = connection.ops.quote_name
    table, column = quote(QuotaLock._meta.db_table), quote("key")
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({column}, {quote('last_start_at')}) "
                f"SELECT %s, %s FROM DUAL WHERE NOT EXISTS "
                f"(SELECT 1 FROM {table} WHERE {column} = %s)",
                [key, connection.ops.adapt_datetimefield_value(timezone.now()), key],
            )
    except IntegrityError:
        pass


def insert_lock_rows_apart(connection: BaseDatabaseWrapper, keys: Sequence[str]) -> None:
    """Insert and commit the lock rows of ``keys`` (:func:`insert_lock_row`) on a
    connection of their own to ``connection``'s database, opened and closed here: for a
    start inside a transaction of the caller's, which must not insert them itself."""
    own = type(connection)(connection.settings_dict, connection.alias)
    try:
        for key in keys:
            insert_lock_row(own, key)
    finally:
        own.close()


def _lock_inserted_rows(connection: BaseDatabaseWrapper, keys: list[str]) -> None:
    if update_lock_rows(connection, keys) != len(keys):
        raise DurableError(
            f"a quota key of {keys!r} has no lock row although one was just inserted: "
            "durable_quota_lock rows must not be deleted"
        )


#: The run's columns, in the order the PostgreSQL fast path reads them.
_RUN_COLUMNS = (
    "id",
    "workflow",
    "version",
    "namespace",
    "status",
    "input",
    "output",
    "error",
    "queue",
    "parent_id",
    "blocked_reason",
    "attempt",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "wake_at",
    "wait",
    "lease_owner",
    "lease_expires_at",
)

#: The fields of a claim that ``durable_claim_run_v1`` makes (``wake_at`` is cleared).
_CLAIM_FIELDS = frozenset({"lease_owner", "lease_expires_at", "started_at", "wake_at"})
#: The fields ``durable_transition_v1`` can set, in the order of its arguments.
_TRANSITION_FIELDS = (
    "lease_owner",
    "lease_expires_at",
    "blocked_reason",
    "output",
    "error",
    "finished_at",
    "wait",
    "wake_at",
    "attempt",
    "started_at",
)
_JSON_FIELDS = frozenset({"output", "error", "wait"})


def _start_json(start: StartRequest) -> dict[str, Any]:
    """One start of a batch as ``durable_start_runs_v2`` (and v1) reads it: the arguments of
    ``durable_start_run_v2``, those that are ``NULL`` left out. ``statuses`` holds one
    row per quota, padded with ``null`` to the longest (a two-dimensional array)."""
    run, quotas = start.run, start.quotas
    item: dict[str, Any] = {
        "id": run.run_id,
        "check_existing": start.check_existing,
        "workflow": run.workflow,
        "version": run.version,
        "namespace": run.namespace,
        "input": run.input,
        "tags": list(run.tags),
        "queue": run.queue,
        "attempt": run.attempt,
        "keys": [quota.key for quota in quotas],
        "limits": [quota.limit for quota in quotas],
        "weights": [quota.weight for quota in quotas],
        "statuses": _status_rows(tuple(tuple(quota.count_statuses) for quota in quotas)),
    }
    if run.parent_id is not None:
        item["parent_id"] = run.parent_id
    return item


@functools.lru_cache(maxsize=256)
def _status_rows(statuses: tuple[tuple[str, ...], ...]) -> tuple[tuple[str | None, ...], ...]:
    """Each quota's counted statuses, one row per quota, padded with ``None`` to the
    longest: the two-dimensional array ``durable_start_run_v2`` takes. A process meets
    few combinations of counted statuses, and pads each once."""
    width = max((len(row) for row in statuses), default=0)
    return tuple((*row, *[None] * (width - len(row))) for row in statuses)


@functools.lru_cache(maxsize=256)
def _statuses_literal(statuses: tuple[tuple[str, ...], ...]) -> str:
    """:func:`_status_rows` as an array literal, written once per combination."""
    return arrays.text_rows(_status_rows(statuses))


def _function_sets(fields: dict[str, Any]) -> bool:
    """Whether ``durable_transition_v1`` can set ``fields``: its columns, given as values
    (expressions such as ``F()`` are for the ORM to compile)."""
    return fields.keys() <= set(_TRANSITION_FIELDS) and not any(
        hasattr(value, "resolve_expression") for value in fields.values()
    )


def _step_json(step: StepRecord, connection: BaseDatabaseWrapper) -> tuple[Any, Any]:
    """A step's result and error, as the database takes them."""
    return (
        Step._meta.get_field("result").get_db_prep_save(step.result, connection),
        Step._meta.get_field("error").get_db_prep_save(step.error, connection),
    )


def _holder_record(row: Run, tag: str) -> RunRecord:
    """A holder of ``tag`` read with its weight under it (annotated ``key_weight``)."""
    weight: int = getattr(row, "key_weight", 1)
    return dataclasses.replace(_record(row, [tag]), weights={tag: weight} if weight != 1 else {})


def _record(row: Run, tags: list[str] | None = None) -> RunRecord:
    weights = (
        {} if tags is not None else {t.tag: t.weight for t in row.tag_rows.all() if t.weight != 1}
    )
    return RunRecord(
        run_id=row.pk,
        workflow=row.workflow,
        version=row.version,
        namespace=row.namespace,
        status=row.status,
        input=row.input,
        output=row.output,
        error=row.error,
        tags=sorted(t.tag for t in row.tag_rows.all()) if tags is None else tags,
        queue=row.queue,
        parent_id=row.parent_id,
        blocked_reason=row.blocked_reason,
        attempt=row.attempt,
        created_at=row.created_at,
        updated_at=row.updated_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        wake_at=row.wake_at,
        wait=row.wait,
        lease_owner=row.lease_owner,
        lease_expires_at=row.lease_expires_at,
        weights=weights,
    )


# the portable start's statements ------------------------------------------------------


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
            columns = ", ".join(q(c) for c in ("run_id", "tag", "status", "namespace", "weight"))
            rows = ", ".join(["(%s, %s, %s, %s, %s)"] * count)
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
    """Insert the pending ``run`` and its tags (weighing ``run.weights``) on ``cursor``:
    two statements, the tags in one multi-row insert."""
    sql = portable_sql(connection)
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    cursor.execute(
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
    if run.tags:
        pending = RunStatus.PENDING.value
        cursor.execute(
            sql.insert_tags(len(run.tags)),
            [
                value
                for tag in run.tags
                for value in (run.run_id, tag, pending, run.namespace, run.weights.get(tag, 1))
            ],
        )


def units_query(
    connection: BaseDatabaseWrapper, quotas: Sequence[Quota], namespace: str | None
) -> list[int]:
    """``RunTagQuerySet.units`` for ``quotas``, its statement sent on the cursor."""
    wanted = [(quota.tag, list(dict.fromkeys(quota.count_statuses))) for quota in quotas]
    tags = list(dict.fromkeys(tag for tag, _ in wanted))
    statuses = list(dict.fromkeys(status for _, s in wanted for status in s))
    if not tags or not statuses:
        return [0 for _ in wanted]
    params: list[Any] = [*tags, *statuses]
    if namespace is not None:
        params.append(namespace)
    with connection.cursor() as cursor:
        cursor.execute(
            portable_sql(connection).units(len(tags), len(statuses), namespace is not None), params
        )
        found = {(tag, status): units for tag, status, units in cursor.fetchall()}
    return [int(sum(found.get((tag, status), 0) for status in s)) for tag, s in wanted]


#: The call of MariaDB's start procedure (``stores/mariadb/procedures.sql``).
_MARIADB_START_SQL = f"CALL durable_start_run_mariadb_v1({', '.join(['%s'] * 15)})"


def _procedure_params(
    connection: BaseDatabaseWrapper,
    run: NewRun,
    quotas: Sequence[Quota],
    keys: list[str],
    check_existing: bool,
    read_namespace: str | None,
) -> list[Any]:
    """The arguments of ``durable_start_run_mariadb_v1``, the last one (whether the
    procedure runs a transaction of its own) left for the caller to set."""
    return [
        run.run_id,
        check_existing,
        run.workflow,
        run.version,
        run.namespace,
        model_field(Run, "input", JSONField).get_db_prep_save(run.input, connection),
        json.dumps([[tag, run.weights.get(tag, 1)] for tag in run.tags], ensure_ascii=False),
        run.queue,
        run.parent_id,
        run.attempt,
        json.dumps(keys, ensure_ascii=False),
        json.dumps(
            [
                [quota.tag, quota.limit, quota.weight, list(dict.fromkeys(quota.count_statuses))]
                for quota in quotas
            ],
            ensure_ascii=False,
        ),
        read_namespace,
        connection.ops.adapt_datetimefield_value(timezone.now()),
        None,
    ]


def update_lock_rows(connection: BaseDatabaseWrapper, keys: Sequence[str]) -> int:
    """``UPDATE`` the lock rows of ``keys`` (sorted) in key order; how many it found."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(portable_sql(connection).update_locks(len(keys)), [now, *keys])
        return int(cursor.rowcount)
