"""MariaDB's start in one call: the procedure ``durable_start_run_mariadb_v1`` of
``stores/mariadb/procedures.sql``, what one ``CALL`` creates or refuses, inside a
transaction of the caller's or not, with the lock rows of new keys inserted and committed
before the start's transaction; the file is what the database has."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings

from durable_django import ConcurrencyLimitError, DurableError
from durable_django._core.records import NewRun
from durable_django._rules.concurrency import Quota
from durable_django.models import QuotaLock, Run, RunTag
from durable_django.stores import OrmStore
from durable_django.stores.mariadb import parse_procedures, procedure_definitions, render

from ..helpers import statements_sent

ON_MARIADB = os.environ.get("DURABLE_TEST_DB") == "mariadb"
mariadb_only = pytest.mark.skipif(not ON_MARIADB, reason="the procedure is MariaDB's")

APP = "durable_django"
PROCEDURE = "durable_start_run_mariadb_v1"
ACTIVE = ("pending", "running", "suspended", "blocked")


def fresh(name: str) -> str:
    return f"{name}:{uuid.uuid4().hex[:10]}"


def new_run(quotas: tuple[Quota, ...] = (), run_id: str | None = None, **fields: Any) -> NewRun:
    """A run of workflow ``wf`` carrying the tags of ``quotas`` (and ``fields["tags"]``),
    weighing each quota's weight."""
    tags = (*fields.pop("tags", ()), *(quota.tag for quota in quotas))
    return NewRun(
        run_id=run_id or uuid.uuid4().hex,
        workflow=fields.pop("workflow", "wf"),
        version="1",
        namespace=fields.pop("namespace", "default"),
        input=fields.pop("input", {"n": 1}),
        tags=tags,
        weights={quota.tag: quota.weight for quota in quotas if quota.weight != 1},
        **fields,
    )


def start(store: OrmStore, run: NewRun, *quotas: Quota, check_existing: bool = False) -> Any:
    return store.start_run(run, quotas, check_existing=check_existing, read_namespace=None)


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """Every statement sent through the connection's cursors while the test runs."""
    with statements_sent() as sent:
        yield sent


def stored(run_id: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    runs = list(
        Run.objects.filter(pk=run_id).values_list(
            "workflow", "namespace", "status", "input", "queue", "attempt", "blocked_reason"
        )
    )
    tags = list(
        RunTag.objects.filter(run_id=run_id)
        .order_by("tag")
        .values_list("tag", "status", "namespace", "weight")
    )
    return runs, tags


def in_transaction() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@in_transaction")
        return bool(cursor.fetchone()[0])


# one call, outside a transaction of the caller's --------------------------------------


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_a_start_is_one_call_that_commits_the_run_and_its_tags(statements: list[str]):
    store = OrmStore()
    key = fresh("k")
    QuotaLock.objects.create(key=key)
    quota = Quota(key, 10, ACTIVE, weight=3)
    run = new_run((quota,), tags=["team:a"], queue="q", input={"text": 'é😀"\\'})
    statements.clear()

    outcome = start(store, run, quota)

    assert (outcome.created, outcome.workflow, outcome.namespace) == (True, "wf", "default")
    assert [sql.split("(")[0] for sql in statements] == [f"CALL {PROCEDURE}"]
    assert not in_transaction()
    assert stored(run.run_id) == (
        [("wf", "default", "pending", {"text": 'é😀"\\'}, "q", 1, "")],
        [(f"concurrency:{key}", "pending", "default", 3), ("team:a", "pending", "default", 1)],
    )
    assert store.quota_units([quota], None) == [3]


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_a_refused_start_writes_nothing_and_holds_no_lock(statements: list[str]):
    store = OrmStore()
    key = fresh("k")
    quota = Quota(key, 5, ACTIVE, weight=3)
    first = new_run((quota,))
    start(store, first, quota)
    statements.clear()
    second = new_run((quota,))

    with pytest.raises(ConcurrencyLimitError) as caught:
        start(store, second, quota)

    assert (caught.value.key, caught.value.limit, caught.value.active) == (key, 5, 3)
    assert [sql.split("(")[0] for sql in statements] == [f"CALL {PROCEDURE}"]
    assert not in_transaction()
    assert stored(second.run_id) == ([], [])
    assert Run.objects.count() == 1
    assert_lock_free(key)


def assert_lock_free(key: str) -> None:
    """Another connection locks the key's row at once: no transaction holds it."""
    wrapper = connections["default"]
    other = type(wrapper)(wrapper.settings_dict, wrapper.alias)
    try:
        with other.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
            cursor.execute(
                "UPDATE durable_quota_lock SET last_start_at = last_start_at WHERE `key` = %s",
                [key],
            )
    finally:
        other.close()


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_the_first_quota_in_declaration_order_that_refuses_is_named():
    store = OrmStore()
    z, a = fresh("z"), fresh("a")  # declared z first; locked a first
    full_z, full_a = Quota(z, 0, ACTIVE), Quota(a, 0, ACTIVE)
    with pytest.raises(ConcurrencyLimitError) as caught:
        start(store, new_run((full_z, full_a)), full_z, full_a)
    assert caught.value.key == z
    roomy_z = Quota(z, 2, ACTIVE, weight=2)
    with pytest.raises(ConcurrencyLimitError) as caught:
        start(store, new_run((roomy_z, full_a)), roomy_z, full_a)
    assert (caught.value.key, caught.value.active) == (a, 0)
    assert Run.objects.count() == 0
    # Each quota counts its own statuses: a suspended run counts for z only.
    only_pending = Quota(a, 1, ("pending",))
    run = new_run((roomy_z, only_pending))
    start(store, run, roomy_z, only_pending)
    Run.objects.filter(pk=run.run_id).update(status="suspended")
    RunTag.objects.filter(run_id=run.run_id).update(status="suspended")
    assert start(store, new_run((only_pending,)), only_pending).created
    with pytest.raises(ConcurrencyLimitError) as caught:
        start(store, new_run((roomy_z,)), roomy_z)
    assert (caught.value.key, caught.value.active) == (z, 2)


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_new_keys_get_their_lock_rows_committed_even_when_refused():
    store = OrmStore()
    keys = [fresh("b"), fresh("a")]
    quotas = tuple(Quota(key, 0, ACTIVE) for key in keys)
    with pytest.raises(ConcurrencyLimitError):
        start(store, new_run(quotas), *quotas)
    assert set(QuotaLock.objects.filter(key__in=keys).values_list("key", flat=True)) == set(keys)
    assert Run.objects.count() == 0 and not in_transaction()
    one = Quota(fresh("c"), 1, ACTIVE)
    assert start(store, new_run((one,)), one).created
    assert QuotaLock.objects.filter(key=one.key).exists()


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_keys_are_compared_byte_for_byte():
    store = OrmStore()
    base = fresh("k")
    keys = (base, base.upper(), f"{base} ", f"{base}é", f"{base}😀", f"{base}'\"\\\n")
    quotas = [Quota(key, 1, ACTIVE) for key in keys]
    for quota in quotas:
        assert start(store, new_run((quota,)), quota).created
    for quota in quotas:
        with pytest.raises(ConcurrencyLimitError):
            start(store, new_run((quota,)), quota)
    assert QuotaLock.objects.filter(key__in=keys).count() == len(keys)
    # Several keys in one start: the one UPDATE names each by its bytes.
    roomy = tuple(Quota(key, 2, ACTIVE) for key in keys)
    assert start(store, new_run(roomy), *roomy).created
    with pytest.raises(ConcurrencyLimitError) as caught:
        start(store, new_run(roomy), *roomy)
    assert (caught.value.key, caught.value.active) == (keys[0], 2)


# an existing run ---------------------------------------------------------------------


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_an_existing_run_is_found_before_any_quota_is_counted():
    store = OrmStore()
    quota = Quota(fresh("k"), 1, ACTIVE)
    run = new_run((quota,), run_id=fresh("run"))
    assert start(store, run, quota, check_existing=True).created
    again = start(store, run, quota, check_existing=True)  # the key is full: found first
    assert (again.created, again.workflow, again.namespace) == (False, "wf", "default")
    assert not in_transaction()
    with pytest.raises(DurableError, match="taken by a run of workflow 'wf'"):
        start(store, new_run((quota,), run_id=run.run_id, workflow="other"), check_existing=True)
    # Without the check, the duplicate id is the database's error, its transaction undone,
    # and the run found after it.
    unlimited = Quota(fresh("k"), 10, ACTIVE)
    found = start(store, new_run((unlimited,), run_id=run.run_id), unlimited)
    assert (found.created, found.workflow, found.namespace) == (False, "wf", "default")
    assert not in_transaction()
    assert_lock_free(unlimited.key)
    assert RunTag.objects.filter(tag=unlimited.tag).count() == 0


# inside a transaction of the caller's ------------------------------------------------


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_inside_the_callers_transaction_the_start_commits_nothing():
    store = OrmStore()
    known = fresh("known")
    QuotaLock.objects.create(key=known)
    new_keys = [fresh("n2"), fresh("n1")]
    quotas = (Quota(known, 1, ACTIVE), *(Quota(key, 3, ACTIVE) for key in new_keys))
    run = new_run(quotas)

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        assert start(store, run, *quotas).created
        assert stored(run.run_id)[0]  # seen inside
        assert in_transaction()
        with pytest.raises(ConcurrencyLimitError):  # the transaction goes on after it
            start(store, new_run(quotas[:1]), quotas[0])
        raise Undo
    assert stored(run.run_id) == ([], [])
    # The new keys' rows were committed on a connection of their own, before any lock.
    assert QuotaLock.objects.filter(key__in=[known, *new_keys]).count() == 3
    with transaction.atomic():
        assert start(store, run, *quotas).created
    assert stored(run.run_id)[0]


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_an_error_inside_the_callers_transaction_undoes_the_start_alone():
    store = OrmStore()
    quota = Quota(fresh("k"), 5, ACTIVE)
    taken = new_run((quota,), run_id=fresh("run"))
    start(store, taken, quota)
    with transaction.atomic():
        mine = new_run((quota,))
        start(store, mine, quota)
        assert not start(store, new_run((quota,), run_id=taken.run_id), quota).created
        other = new_run((quota,))
        start(store, other, quota)
    assert RunTag.objects.filter(tag=quota.tag).count() == 3
    assert {mine.run_id, other.run_id} <= set(Run.objects.values_list("pk", flat=True))


# the count -----------------------------------------------------------------------------


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_the_count_reads_only_the_counted_statuses_of_the_index():
    store = OrmStore()
    quota = Quota(fresh("k"), 1000, ACTIVE)
    done = [new_run((quota,)) for _ in range(300)]
    Run.objects.bulk_create(
        Run(id=r.run_id, workflow="wf", version="1", status="completed", input={}) for r in done
    )
    RunTag.objects.bulk_create(
        RunTag(run_id=r.run_id, tag=quota.tag, status="completed", namespace="default")
        for r in done
    )
    start(store, new_run((quota,)), quota)

    def read_next() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read_next'")
            return int(cursor.fetchone()[1])

    before = read_next()
    start(store, new_run((quota,)), quota)
    assert read_next() - before < 10  # the run counted, not the 300 completed ones


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_a_quota_counts_any_number_of_statuses_each_once():
    """A row of eleven statuses, each active status named more than once: each counted
    once, and no cap on the row's length."""
    key = fresh("k")
    tag = f"concurrency:{key}"
    QuotaLock.objects.create(key=key)
    for n, status in enumerate(ACTIVE):
        Run.objects.create(id=f"{key}-{n}", workflow="wf", version="1", status=status, input={})
        RunTag.objects.create(run_id=f"{key}-{n}", tag=tag, status=status, namespace="default")
    statuses = [*ACTIVE, *ACTIVE, "running", "pending", "blocked"]
    with connection.cursor() as cursor:
        cursor.execute(
            f"CALL {PROCEDURE}({', '.join(['%s'] * 15)})",
            [
                fresh("run"),
                False,
                "wf",
                "1",
                "default",
                "{}",
                json.dumps([[tag, 1]]),
                "q",
                None,
                1,
                json.dumps([key]),
                json.dumps([[tag, 5, 1, statuses]]),
                None,
                "2026-01-01 00:00:00",
                True,
            ],
        )
        assert cursor.fetchone() == ("created", None, 4, "wf", "default", None)


# the migration -------------------------------------------------------------------------


def procedures() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ROUTINE_NAME FROM information_schema.ROUTINES "
            "WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME LIKE 'durable%%'"
        )
        return [name for (name,) in cursor.fetchall()]


def shown(name: str) -> str:
    """``name``'s statement as the server shows it, in the file's form: ``CREATE OR
    REPLACE PROCEDURE name(`` for its ``CREATE DEFINER=... PROCEDURE `name`(``."""
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW CREATE PROCEDURE {connection.ops.quote_name(name)}")
        text = str(cursor.fetchone()[2])
    head, body = text.split("(", 1)
    assert head.startswith("CREATE DEFINER=") and head.endswith(f" PROCEDURE `{name}`"), head
    return f"CREATE OR REPLACE PROCEDURE {name}({body}"


def rendered(statement: str) -> str:
    """The file's ``statement`` filled in for this database's columns."""

    def charset_of(table: str, column: str) -> tuple[str, str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = %s",
                [table, column],
            )
            charset, collation = cursor.fetchone()
        return charset, collation

    return render(statement, charset_of)


@mariadb_only
@pytest.mark.django_db
def test_the_database_has_exactly_the_procedures_of_the_file():
    assert sorted(procedures()) == sorted(procedure_definitions())
    for name, statement in procedure_definitions().items():
        assert shown(name) == rendered(statement), name


def test_a_procedure_ends_at_its_unindented_end_and_is_sent_without_its_semicolon():
    text = (
        "-- one\n\nCREATE OR REPLACE PROCEDURE durable_x_v2(IN p VARCHAR(9) {charset:t.c})\n"
        "BEGIN\n    BEGIN\n    END;\n    SELECT '{introducer:t.c} X''41''';\nEND;\n"
    )
    (statement,) = parse_procedures(text).values()
    assert statement.endswith("    END;\n    SELECT '{introducer:t.c} X''41''';\nEND;")
    assert render(statement, lambda table, column: ("utf8mb4", f"{table}_{column}_bin")) == (
        "CREATE OR REPLACE PROCEDURE durable_x_v2(IN p VARCHAR(9) "
        "CHARACTER SET utf8mb4 COLLATE t_c_bin)\n"
        "BEGIN\n    BEGIN\n    END;\n    SELECT '_utf8mb4 X''41''';\nEND"
    )


class RefuseDurable:
    def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool | None:
        return False if app_label == APP else None


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_the_migration_installs_the_procedure_reverses_and_honours_the_routers():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes(APP)[0]
    assert procedures() == [PROCEDURE]
    try:
        with override_settings(DATABASE_ROUTERS=[RefuseDurable()]):
            MigrationExecutor(connection).migrate([(APP, "0001_initial")])
            assert procedures() == [PROCEDURE]  # refused: not dropped
            MigrationExecutor(connection).migrate([latest])
        MigrationExecutor(connection).migrate([(APP, "0001_initial")])
        assert procedures() == []
        with override_settings(DATABASE_ROUTERS=[RefuseDurable()]):
            MigrationExecutor(connection).migrate([latest])
            assert procedures() == []  # refused: not installed
            MigrationExecutor(connection).migrate([(APP, "0001_initial")])
    finally:
        MigrationExecutor(connection).migrate([latest])
    assert procedures() == [PROCEDURE]


@pytest.mark.skipif(ON_MARIADB, reason="other databases")
@pytest.mark.django_db
def test_other_databases_take_the_portable_start(statements: list[str]):
    store = OrmStore()
    quota = Quota(fresh("k"), 1, ACTIVE)
    start(store, new_run((quota,)), quota)
    assert not any(sql.startswith("CALL") for sql in statements)


@mariadb_only
@pytest.mark.django_db(transaction=True)
def test_the_portable_path_stays_on_mariadb_with_fast_path_off(statements: list[str]):
    store = OrmStore(fast_path=False)
    quota = Quota(fresh("k"), 1, ACTIVE)
    run = new_run((quota,))
    start(store, run, quota)
    assert not any(sql.startswith("CALL") for sql in statements)
    with pytest.raises(ConcurrencyLimitError):
        OrmStore().start_run(new_run((quota,)), [quota], check_existing=False, read_namespace=None)
    assert json.loads(json.dumps(stored(run.run_id)[1])) == [[quota.tag, "pending", "default", 1]]
