"""The PostgreSQL fast path: the calls of the functions of ``stores/postgres/functions.sql``
and the first start's statements (``stores/postgres/first_start.py``), their arguments
and answers marshalled (docs/stores.md, "The ORM store's paths")."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField
from django.utils import timezone

from ..._core.records import NewRun, RunRecord, StartOutcome, StepRecord
from ..._rules.admission import decide, refused_by
from ..._rules.concurrency import Quota
from ..._rules.overrides import in_force, scope_of
from ..._rules.tickets import Ticket
from ...errors import ConcurrencyLimitError
from ...models import Run, Step, model_field
from ...status import RunStatus
from .. import override_rows, ticket_rows
from ..base import StartRequest, batch_index, decide_read, existing_outcome, timed_refusal
from ..postgres import arrays, batch_columns, first_start
from ..postgres.beginning import BegunWithFirstStatement
from ..postgres.bound import binds_client_side, fetch_one
from ..postgres.committing import (
    NOT_HELD_SQLSTATE,
    commits_in_statement,
    execute_and_commit,
    sqlstate,
)
from .portable import (
    PortablePath,
    in_callers_transaction,
    insert_run_statements,
    portable_sql,
    routine_outcome,
    units_statement,
)

#: The calls of the functions of ``stores/postgres/functions.sql``.
_LOCK_KEY_SQL = "SELECT durable_lock_quota_key_v1(%s)"
_LOCK_KEYS_SQL = "SELECT durable_lock_quota_keys_v1(%s::text[])"
_START_SQL = (
    "SELECT outcome, refused, active, found_workflow, found_namespace, refused_limit FROM "
    "durable_start_run_v2(%s, %s, %s, %s, %s, %s::jsonb, %s::text[], %s, %s, %s, "
    "%s::text[], %s::integer[], %s::integer[], %s::text[], %s)"
)
#: The same call for a start under a rate limit: each quota's window (``NULL`` for a
#: concurrency quota) and the start's time, on the starting process's clock.
_RATED_START_SQL = _START_SQL.removesuffix(")") + ", %s::double precision[], %s::timestamptz)"
_START_MANY_SQL = (
    "SELECT position, outcome, refused, active, found_workflow, found_namespace, "
    "refused_limit FROM durable_start_runs_v2(%s::jsonb, %s)"
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
#: A fair start's ends of its transaction: how it begins, commits and undoes it, on its
#: own (outside a transaction of the caller's) or in a savepoint of the caller's.
_OWN = ("BEGIN", "COMMIT", "ROLLBACK")
_SAVEPOINT = (
    "SAVEPOINT durable_start",
    "RELEASE SAVEPOINT durable_start",
    "ROLLBACK TO SAVEPOINT durable_start; RELEASE SAVEPOINT durable_start",
)
#: ``json.dumps(value, cls=DjangoJSONEncoder)``'s encoder, made once (it keeps no state):
#: a start's input, a batch of starts.
_JSON = DjangoJSONEncoder()


class PostgresPath(PortablePath):
    """The round trips of PostgreSQL's fast path; each composite falls back on the
    portable path (``BaseStore``'s) where no function covers the call."""

    def step_transaction(self) -> contextlib.AbstractContextManager[Any]:
        """``atomic()`` on the store's database; on the fast path its ``BEGIN`` travels
        with its first statement (:class:`~..postgres.beginning.BegunWithFirstStatement`),
        one round trip less per transactional step."""
        atomic = transaction.atomic(using=self.using)
        if not self._fast():
            return atomic
        return BegunWithFirstStatement(connections[self.using], atomic)

    def _advisory_locks(self, ordered: list[str]) -> None:
        """The transaction-scoped advisory locks of the keys ``ordered`` that
        ``durable_start_run_v2`` takes (``durable_lock_quota_key_v1``,
        ``durable_lock_quota_keys_v1``)."""
        with connections[self.using].cursor() as cursor:
            cursor.execute(*_lock_statement(ordered))

    def _fair_in_two(self) -> bool:
        """Whether a start under a fair quota takes :meth:`_start_fair_on_postgresql`:
        on the fast path, where the connection's cursors bind client-side (several
        statements in one query string)."""
        if not self._fast():
            return False
        connection = connections[self.using]
        connection.ensure_connection()
        return binds_client_side(connection.connection)

    def _start_fair_on_postgresql(
        self, start: StartRequest, read_namespace: str | None, ticket: Ticket | None
    ) -> StartOutcome:
        """``BaseStore.start_run``'s steps under a fair quota, in two round trips.

        The read is one query string: the transaction's ``BEGIN`` (inside a transaction
        of the caller's, a savepoint), the keys' advisory locks (:meth:`_advisory_locks`),
        the operators' overrides of the keys (``override_rows.limits_statement``), the
        existing run, every key's units (``portable.units_statement``) and the fair
        keys' kept tickets (``ticket_rows.lines_statement``). The decision is made in
        Python (``decide_read``). The write is another: the run, its tags, the dropped
        ticket, and the ``COMMIT`` (inside a caller's transaction, the savepoint's
        release). A start that is refused, finds a run, or fails, ends its transaction
        (or rolls its savepoint back) instead of writing.
        """
        run, quotas, check_existing = start.run, start.quotas, start.check_existing
        connection = connections[self.using]
        own = not in_callers_transaction(connection)
        begin, commit, undo = _OWN if own else _SAVEPOINT
        query = units_statement(connection, quotas, read_namespace)
        fair_keys = [quota.key for quota in quotas if quota.fair]
        lines_sql, lines_params = ticket_rows.lines_statement(connection, fair_keys, read_namespace)
        now = timezone.now()
        reads: list[tuple[str, list[Any]]] = [
            (begin, []),
            _lock_statement(sorted({quota.key for quota in quotas})),
            override_rows.limits_statement(
                connection, [q.tag for q in quotas], scope_of(read_namespace), now
            ),
        ]
        if check_existing:
            reads.append((portable_sql(connection).existing, [run.run_id]))
        if query.statement is not None:
            reads.append((query.statement, query.params))
        reads.append((lines_sql, lines_params))
        with connections[self.using].cursor() as cursor:
            try:
                overridden, *results = _results(cursor, *_joined(reads))[2:]
                quotas = in_force(quotas, override_rows.limits_from(overridden))
                if check_existing and results[0]:
                    workflow, namespace = results[0][0]
                    outcome = existing_outcome(run, workflow, namespace, read_namespace)
                    cursor.execute(commit)
                    return outcome
                lines = ticket_rows.lines_from(results[-1])
                decision = decide_read(
                    quotas,
                    query.units(results[-2] if query.statement is not None else ()),
                    lambda key: lines.get(key, []),
                    read_namespace,
                    ticket,
                )
                if decision.refusal is not None:
                    raise decision.refusal.error(run.workflow)
                writes = insert_run_statements(connection, run)
                taken = decision.taken_ticket()
                if taken is not None:
                    writes.append(ticket_rows.drop_statement(connection, taken))
                writes.append((commit, []))
                cursor.execute(*_joined(writes))
            except BaseException:
                with contextlib.suppress(DatabaseError):
                    cursor.execute(undo)
                raise
        decision.end_hold_on_commit(self)
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
            return self._start_by_statements(
                StartRequest(run, quotas, check_existing), read_namespace
            )
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
        if not any(quota.rate for quota in quotas):
            row = fetch_one(connection, _START_SQL, params)
            assert row is not None
            return routine_outcome(StartRequest(run, quotas, check_existing), row, read_namespace)
        now = timezone.now()
        params += [arrays.float_array([quota.per for quota in quotas]), now]
        row = fetch_one(connection, _RATED_START_SQL, params)
        assert row is not None
        return routine_outcome(
            StartRequest(run, quotas, check_existing),
            row,
            read_namespace,
            lambda refusal: timed_refusal(self, refusal, now, read_namespace),
        )

    def _start_by_statements(self, start: StartRequest, read_namespace: str | None) -> StartOutcome:
        """What ``durable_start_run_v2`` does, as the statements of one query string
        (``first_start.statements``): one round trip, one transaction of its own outside the
        caller's."""
        run, quotas = start.run, start.quotas
        sql, params = first_start.statements(run, quotas, start.check_existing, read_namespace)
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            while cursor.nextset():
                pass
            found_workflow, found_namespace, inserted, *read = cursor.fetchone()
        if found_workflow is not None:
            return existing_outcome(run, found_workflow, found_namespace, read_namespace)
        if inserted:
            return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)
        actives, limits = read[0::2], read[1::2]
        limits_read = {q.tag: int(limit) for q, limit in zip(quotas, limits, strict=True)}
        refusal = decide(in_force(quotas, limits_read), actives)
        if refusal is not None:
            raise refusal.error(run.workflow)
        # Admitted, but a concurrent start without a quota lock inserted this id first;
        # it has committed by now, and this statement's snapshot sees it.
        with connections[self.using].cursor() as cursor:
            cursor.execute(first_start.EXISTING_SQL, [run.run_id])
            workflow, namespace = cursor.fetchone()
        return existing_outcome(run, workflow, namespace, read_namespace)

    def _start_many_on_postgresql(
        self, starts: Sequence[StartRequest], read_namespace: str | None
    ) -> list[StartOutcome | ConcurrencyLimitError]:
        batch = batch_columns.columns([_batch_element(start) for start in starts], read_namespace)
        with transaction.atomic(using=self.using):
            with connections[self.using].cursor() as cursor:
                cursor.execute(_START_MANY_SQL, [_JSON.encode(batch), read_namespace])
                rows = cursor.fetchall()
            assert [row[0] for row in rows] == list(range(1, len(starts) + 1))
            outcomes: list[StartOutcome | ConcurrencyLimitError] = []
            for index, (
                start,
                (_, outcome, refused, active, workflow, namespace, limit),
            ) in enumerate(zip(starts, rows, strict=True)):
                run = start.run
                if outcome == "refused":
                    refusal = refused_by(start.quotas, refused, active, limit)
                    outcomes.append(refusal.error(run.workflow))
                elif outcome == "exists":
                    # A clash raises here, inside the transaction: the batch is undone.
                    with batch_index(index):
                        outcomes.append(existing_outcome(run, workflow, namespace, read_namespace))
                else:
                    outcomes.append(StartOutcome(True, run.workflow, run.namespace))
            return outcomes

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
        run = dict(zip(_CLAIMED_COLUMNS, values, strict=True))
        for name in ("input", "output", "error", "wait"):
            field = model_field(Run, name, JSONField)
            run[name] = field.from_db_value(run[name], field.cached_col, connection)
        # What the claim set is not read back: it is what this call gave.
        record = RunRecord(
            run_id=run_id,
            status=RunStatus.RUNNING,
            updated_at=params[4],
            lease_owner=fields["lease_owner"],
            lease_expires_at=fields["lease_expires_at"],
            started_at=fields["started_at"],
            wake_at=None,
            tags=sorted(tags),
            **run,
        )
        return record, [
            StepRecord(position=position, name=name, result=result, error=error)
            for position, name, result, error in steps or ()
        ]

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


#: The run's columns ``durable_claim_run_v1`` returns, in its order: those the claim does
#: not set.
_CLAIMED_COLUMNS = (
    "workflow",
    "version",
    "namespace",
    "input",
    "output",
    "error",
    "queue",
    "parent_id",
    "blocked_reason",
    "attempt",
    "created_at",
    "finished_at",
    "wait",
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


def _batch_element(start: StartRequest) -> dict[str, Any]:
    """One start of a batch, an element as :func:`batch_columns.columns` reads it: the
    arguments of ``durable_start_run_v2`` by name, ``parent_id`` left out for none, and
    ``statuses`` holding each quota's counted statuses."""
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
        "statuses": [quota.count_statuses for quota in quotas],
    }
    if run.parent_id is not None:
        item["parent_id"] = run.parent_id
    return item


@functools.lru_cache(maxsize=256)
def _status_rows(statuses: tuple[tuple[str, ...], ...]) -> tuple[tuple[str | None, ...], ...]:
    """Each quota's counted statuses, one row per quota, padded with ``None`` to the
    longest: the two-dimensional array ``durable_start_run_v2`` takes. A process meets
    few combinations of counted statuses, and pads each once. Rows of rate limits alone
    (which count no status) are one ``None`` wide: an array of empty rows has no rows."""
    width = max((len(row) for row in statuses), default=0) or (1 if statuses else 0)
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


def _lock_statement(ordered: list[str]) -> tuple[str, list[Any]]:
    """The statement taking the advisory locks of the keys ``ordered``, and its
    parameters: ``durable_lock_quota_key_v1`` for one, ``durable_lock_quota_keys_v1``
    for several."""
    if len(ordered) == 1:
        return _LOCK_KEY_SQL, ordered
    return _LOCK_KEYS_SQL, [ordered]


def _joined(statements: list[tuple[str, list[Any]]]) -> tuple[str, list[Any]]:
    """``statements`` as one query string, and its parameters."""
    return (
        "; ".join(statement for statement, _ in statements),
        [value for _, params in statements for value in params],
    )


def _results(cursor: Any, statement: str, params: list[Any]) -> list[list[Any]]:
    """Send the query string ``statement``; the rows of each of its statements."""
    cursor.execute(statement, params)
    results = []
    while True:
        results.append(cursor.fetchall() if cursor.description is not None else [])
        if not cursor.nextset():
            return results
