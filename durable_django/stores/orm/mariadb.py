"""MariaDB's start procedure call and the MySQL/MariaDB lock rows (docs/stores.md,
"The ORM store's paths")."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField
from django.utils import timezone

from ..._core.records import StartOutcome
from ...errors import DurableError
from ...models import QuotaLock, Run, model_field
from ..base import StartRequest, timed_refusal
from .portable import PortablePath, in_callers_transaction, portable_sql, routine_outcome


class MariadbPath(PortablePath):
    """The quota keys' lock rows on MySQL/MariaDB, and MariaDB's one-``CALL`` start."""

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

    def _start_on_mariadb(self, start: StartRequest, read_namespace: str | None) -> StartOutcome:
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
        keys = sorted({quota.key for quota in start.quotas})
        now = timezone.now()
        params = _procedure_params(connection, start, keys, read_namespace, now)
        own = not in_callers_transaction(connection)
        for attempt in (1, 2):
            params[-1] = own
            with (
                contextlib.nullcontext() if own else transaction.atomic(using=self.using),
                connection.cursor() as cursor,
            ):
                cursor.execute(_MARIADB_START_SQL, params)
                row = cursor.fetchone()
            if row[0] != "missing":
                break
            if attempt == 2:
                raise _no_lock_row(keys)
            if own:
                for key in keys:
                    insert_lock_row(connection, key)
            else:
                # A read that takes no lock finds the missing rows.
                rows = QuotaLock.objects.using(self.using).filter(key__in=keys)
                existing = set(rows.values_list("key", flat=True))
                insert_lock_rows_apart(connection, [key for key in keys if key not in existing])
        return routine_outcome(
            start,
            row,
            read_namespace,
            lambda refusal: timed_refusal(self, refusal, now, read_namespace),
        )


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
        raise _no_lock_row(keys)


def _no_lock_row(keys: list[str]) -> DurableError:
    """The error of a key of ``keys`` whose lock row is missing just after its insert."""
    return DurableError(
        f"a quota key of {keys!r} has no lock row although one was just inserted: "
        "durable_quota_lock rows must not be deleted"
    )


#: The call of MariaDB's start procedure (``stores/mariadb/procedures.sql``).
_MARIADB_START_SQL = f"CALL durable_start_run_mariadb_v1({', '.join(['%s'] * 15)})"


def _procedure_params(
    connection: BaseDatabaseWrapper,
    start: StartRequest,
    keys: list[str],
    read_namespace: str | None,
    now: datetime,
) -> list[Any]:
    """The arguments of ``durable_start_run_mariadb_v1`` for a start at ``now`` (the
    starting process's clock, which stamps the run and reads the rate limits' windows),
    the last one (whether the procedure runs a transaction of its own) left for the
    caller to set."""
    run, quotas = start.run, start.quotas
    rated = run.rate_tags
    return [
        run.run_id,
        start.check_existing,
        run.workflow,
        run.version,
        run.namespace,
        model_field(Run, "input", JSONField).get_db_prep_save(run.input, connection),
        json.dumps(
            [[tag, run.weights.get(tag, 1), *([1] if tag in rated else [])] for tag in run.tags],
            ensure_ascii=False,
        ),
        run.queue,
        run.parent_id,
        run.attempt,
        json.dumps(keys, ensure_ascii=False),
        json.dumps(
            [
                [
                    quota.tag,
                    quota.limit,
                    quota.weight,
                    list(dict.fromkeys(quota.count_statuses)),
                    *([] if quota.per is None else [quota.per]),
                ]
                for quota in quotas
            ],
            ensure_ascii=False,
        ),
        read_namespace,
        connection.ops.adapt_datetimefield_value(now),
        None,
    ]


def update_lock_rows(connection: BaseDatabaseWrapper, keys: Sequence[str]) -> int:
    """``UPDATE`` the lock rows of ``keys`` (sorted) in key order; how many it found."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(portable_sql(connection).update_locks(len(keys)), [now, *keys])
        return int(cursor.rowcount)
