"""The default store: runs in the project's database, through the Django ORM.

:class:`OrmStore` dispatches each operation to one of its paths (docs/stores.md, "The ORM
store's paths"): the portable path (``portable``), PostgreSQL's functions (``postgres``),
MariaDB's procedure and the MySQL/MariaDB lock rows (``mariadb``); the retention is in
``purge``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage
from django.db import DatabaseError, IntegrityError, OperationalError, connections, transaction
from django.db.models import OuterRef, Q, Subquery, Sum
from django.utils import timezone

from ..._core.limits import RATE_TAG_PREFIX, TAG_PREFIX
from ..._core.records import NewRun, RunRecord, StartOutcome, StepRecord
from ..._rules.admission import window_start
from ..._rules.concurrency import Quota
from ..._rules.overrides import Override
from ..._rules.tickets import KeptTicket, Ticket
from ...db import connection_lost
from ...errors import ConcurrencyLimitError
from ...models import Run, RunTag, Signal, Step
from ...status import TERMINAL_STATUSES, RunStatus
from .. import override_rows, ticket_rows
from ..base import (
    AsyncReleaseListener,
    ReleaseListener,
    StartRequest,
    check_batch_ids,
    existing_outcome,
    is_holders_check,
    quota_list,
)
from ..database_checks import collation_errors, database_warnings
from .mariadb import MariadbPath
from .portable import in_callers_transaction, insert_run, units_query
from .postgres import _HELD_KEYS_SQL, PostgresPath, _function_sets
from .purge import Purging


class OrmStore(PostgresPath, MariadbPath, Purging):
    """Keeps runs in the database ``using`` (default ``"default"``) through the ORM.

    ``fast_path=False`` makes PostgreSQL take the portable path too, and MariaDB start
    runs on it rather than by its procedure. Each method does what
    :class:`~durable_django.stores.BaseStore` says; it overrides the composites with the
    database's own means (row and advisory locks, one ``COUNT``, one statement on
    PostgreSQL, one ``CALL`` for a start on MariaDB).
    """

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
        (:meth:`_advisory_locks`, so both paths serialise against each other); on
        MySQL/MariaDB the locks of the keys' existing rows (:meth:`_row_lock`); elsewhere
        the keys' lock rows, written by one upsert (:meth:`_upsert_locks`).
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
                self._advisory_locks(ordered)
            else:
                self._upsert_locks(ordered)
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
        # The server-side starts know no fair quota's tickets: a fair start reads them
        # in Python, on PostgreSQL in two round trips, elsewhere on the portable path. A
        # start under a rate limit takes PostgreSQL's function or MariaDB's procedure,
        # which count windows too; elsewhere (SQLite, MySQL) the portable path.
        rated = any(quota.rate for quota in quotas)
        server_side = not any(quota.fair for quota in quotas)
        if server_side and self._fast():
            return self._start_on_postgresql(run, quotas, check_existing, read_namespace)
        try:
            if server_side and self._procedure():
                return self._start_on_mariadb(
                    StartRequest(run, quotas, check_existing), read_namespace
                )
            if not server_side and not rated and self._fair_in_two():
                return self._start_fair_on_postgresql(
                    StartRequest(run, quotas, check_existing), read_namespace, ticket
                )
            return self._start_portable(run, quotas, check_existing, read_namespace, ticket)
        except IntegrityError:
            # The id is taken: by a concurrent start without a quota lock that inserted it
            # first, or, unchecked, by a run already there (BaseStore.start_run).
            existing = self.get_run(run.run_id)
            if existing is None:
                raise
            return existing_outcome(run, existing.workflow, existing.namespace, read_namespace)

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
                if self._fast() and not any(
                    q.fair or q.rate for start in starts for q in start.quotas
                ):
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

    # operators' overrides: durable_django.stores.override_rows -------------------------

    def set_override(self, override: Override) -> None:
        override_rows.store(self.using, override)

    def clear_override(self, tag: str, scope: str) -> bool:
        return override_rows.clear(self.using, tag, scope)

    def list_overrides(self, scope: str | None, now: datetime) -> list[Override]:
        return override_rows.live(self.using, scope, now)

    def override_limits(self, tags: Collection[str], scope: str, now: datetime) -> dict[str, int]:
        return override_rows.limits(self.using, tags, scope, now)

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
        from ..postgres.listening import PostgresReleaseListener

        return PostgresReleaseListener(self.using, keys)

    async def arelease_listener(self, keys: Collection[str]) -> AsyncReleaseListener | None:
        if connections[self.using].vendor != "postgresql":
            return None
        from ..postgres.listening import AsyncPostgresReleaseListener

        return await AsyncPostgresReleaseListener.open(self.using, keys)

    def create_run(self, run: NewRun) -> None:
        """The run and its tags, as a start inserts them (``portable.insert_run``)."""
        connection = connections[self.using]
        with transaction.atomic(using=self.using, savepoint=False), connection.cursor() as cursor:
            insert_run(connection, cursor, run)

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

    def rate_units(
        self, quotas: Sequence[Quota], now: datetime, namespace: str | None
    ) -> list[int]:
        """Each rate limit's units in its window, one indexed ``SUM`` per rate limit,
        read from the ``(tag, created_at, weight)`` index's entries of the window alone."""
        return [
            int(
                self._window_rows(quota, now, namespace).aggregate(units=Sum("weight"))["units"]
                or 0
            )
            for quota in quotas
        ]

    def rate_window(
        self, quota: Quota, now: datetime, namespace: str | None
    ) -> list[tuple[datetime, int]]:
        """The window's ``(created_at, weight)`` rows, oldest first, from the same index."""
        rows = self._window_rows(quota, now, namespace).order_by("created_at")
        return [
            (created_at, int(weight))
            for created_at, weight in rows.values_list("created_at", "weight")
        ]

    def _window_rows(self, quota: Quota, now: datetime, namespace: str | None) -> Any:
        rows = RunTag.objects.using(self.using).filter(
            tag=quota.tag, created_at__gt=window_start(quota, now)
        )
        return rows.filter(namespace=namespace) if namespace is not None else rows

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
            run = self._runs().only("status", "namespace", "created_at").get(pk=run_id)
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
                    # A rate limit's tag keeps the run's creation time, as a start's does.
                    created_at=run.created_at if tag.startswith(RATE_TAG_PREFIX) else None,
                )
                for tag, units in weights.items()
                if tag not in present
            )

    def settle_units(self, run_id: str, tag: str, units: int) -> bool:
        """One ``UPDATE`` of the run's tag row."""
        rows = RunTag.objects.using(self.using).filter(run_id=run_id, tag=tag)
        return bool(rows.update(weight=units))

    def quota_keys(
        self, statuses: Collection[str], namespace: str | None
    ) -> dict[str, dict[str, int]]:
        """``{key: {workflow: units}}`` for the quota keys holding runs in ``statuses``."""
        rows = RunTag.objects.using(self.using).filter(
            quota_tags(self.using), status__in=list(statuses)
        )
        if namespace is not None:
            rows = rows.filter(namespace=namespace)
        return grouped_keys(rows, TAG_PREFIX)

    def rate_keys(self, since: datetime, namespace: str | None) -> dict[str, dict[str, int]]:
        """``{key: {workflow: units}}`` of the rate tag rows created after ``since``, in
        one grouped query."""
        rows = RunTag.objects.using(self.using).filter(
            prefixed_tags(self.using, RATE_TAG_PREFIX), created_at__gt=since
        )
        if namespace is not None:
            rows = rows.filter(namespace=namespace)
        return grouped_keys(rows, RATE_TAG_PREFIX)

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


def prefixed_tags(using: str, prefix: str) -> Q:
    """The tags starting with ``prefix`` (:data:`TAG_PREFIX`, :data:`RATE_TAG_PREFIX`),
    byte for byte.

    Django's ``startswith`` is a ``LIKE``, case-sensitive on PostgreSQL and MySQL/MariaDB
    but not on SQLite, whose ``LIKE`` ignores the case of ASCII letters. There it is the
    range of tags that byte order (SQLite's ``BINARY`` collation) puts from the prefix
    up to the text just after every tag of the prefix (its last character followed by
    the next one), which is also a range of the index on ``tag``.
    """
    if connections[using].vendor == "sqlite":
        return Q(tag__gte=prefix, tag__lt=prefix[:-1] + chr(ord(prefix[-1]) + 1))
    return Q(tag__startswith=prefix)


def quota_tags(using: str) -> Q:
    """The tags of quota keys: those starting with :data:`TAG_PREFIX`."""
    return prefixed_tags(using, TAG_PREFIX)


def grouped_keys(rows: Any, prefix: str) -> dict[str, dict[str, int]]:
    """``{key: {workflow: units}}`` of tag rows of ``prefix``: their weights summed per
    tag and workflow, in one grouped query."""
    found: dict[str, dict[str, int]] = {}
    for tag, workflow, units in rows.values_list("tag", "run__workflow").annotate(
        units=Sum("weight")
    ):
        found.setdefault(tag[len(prefix) :], {})[workflow] = int(units)
    return found


#: How many times a start is tried in all when the database breaks a deadlock by rolling
#: it back (only outside a transaction of the caller's).
START_ATTEMPTS = 3


def is_deadlock(error: DatabaseError) -> bool:
    """Whether the database rolled back the transaction to break a deadlock."""
    cause = error.__cause__
    if getattr(cause, "sqlstate", None) == "40P01":  # PostgreSQL's deadlock_detected
        return True
    return bool(error.args) and error.args[0] == 1213  # MySQL/MariaDB's ER_LOCK_DEADLOCK


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
