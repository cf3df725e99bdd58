"""Run ids, quota keys, tags, workflow names, namespaces, signal tokens and schedule keys
compare byte for byte on every database: neither case, nor accents, nor trailing spaces
are ignored. On the ORM store (each test database) and the memory store; the store
contract suite (``tests/stores/test_store_contract.py``) checks the same of each store's calls."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from durable_django import ConcurrencyLimitError, Engine, RunStatus
from durable_django.fields import binary_collation
from durable_django.models import Schedule
from durable_django.stores import OrmStore
from durable_django.stores.database_checks import collation_errors
from durable_django.testing import run_until_idle

from ..helpers import echo, force_status

#: Two texts a case-insensitive, accent-insensitive or space-padding comparison confuses.
PAIRS = [
    pytest.param("export:alice:1", "export:Alice:1", id="case"),
    pytest.param("tenant:acme", "TENANT:ACME", id="case-of-a-key"),
    pytest.param("k", "k ", id="trailing-space"),
    pytest.param("e", "é", id="accent"),
]


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_run_ids(engine: Engine, first: str, second: str):
    engine.register("wf", "1", echo)
    one = engine.start("wf", {"who": first}, run_id=first)
    two = engine.start("wf", {"who": second}, run_id=second)
    assert (one.run_id, one.created, two.run_id, two.created) == (first, True, second, True)
    assert engine.get_run(first).input == {"who": first}
    assert engine.get_run(second).input == {"who": second}
    assert not engine.start("wf", {"who": "again"}, run_id=second).created
    run_until_idle(engine)
    assert (one.result(), two.result()) == ({"echo": {"who": first}}, {"echo": {"who": second}})


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_quota_keys(engine: Engine, first: str, second: str):
    engine.register("wf", "1", echo)
    for key in (first, second):
        assert engine.start("wf", {}, concurrency={"key": key, "limit": 1}).created
    for key in (first, second):
        with pytest.raises(ConcurrencyLimitError) as refused:
            engine.start("wf", {}, concurrency={"key": key, "limit": 1})
        assert (refused.value.key, refused.value.active) == (key, 1)
        assert engine.count_runs(tag=f"concurrency:{key}") == 1
    assert sorted((u.key, u.active) for u in engine.quota_usage()) == sorted(
        [(first, 1), (second, 1)]
    )


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_workflow_names(engine: Engine, first: str, second: str):
    engine.register(first, "1", echo)
    engine.register(second, "1", echo)
    one = engine.start(first, {}, run_id="one")
    engine.start(second, {}, run_id="two")
    assert [r.run_id for r in engine.list_runs(workflow=first)] == ["one"]
    assert [r.run_id for r in engine.list_runs(workflow=second)] == ["two"]
    # The same run id with the other name is a clash, not a re-start.
    with pytest.raises(Exception, match="taken by a run of workflow"):
        engine.start(second, {}, run_id=one.run_id)


def wait_for_token(ctx, token):
    return ctx.wait_for_signal(token)


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_signal_tokens_of_kept_signals(engine: Engine, first: str, second: str):
    engine.register("wf", "1", wait_for_token)
    engine.signal(second, "for the second")
    engine.signal(first, "for the first")
    one, two = engine.start("wf", first), engine.start("wf", second)
    run_until_idle(engine)
    assert (one.result(), two.result()) == ("for the first", "for the second")


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_signal_tokens_wake_their_waiters_only(engine: Engine, first: str, second: str):
    engine.register("wf", "1", wait_for_token)
    one, two = engine.start("wf", first), engine.start("wf", second)
    run_until_idle(engine)
    engine.signal(first, "for the first")
    # Only the first token's waiter is woken.
    assert engine.get_run(two.run_id).status == RunStatus.SUSPENDED
    run_until_idle(engine)
    assert one.result() == "for the first"
    assert engine.get_run(two.run_id).status == RunStatus.SUSPENDED
    assert not engine.store.has_signal(second)
    engine.signal(second, "for the second")
    run_until_idle(engine)
    assert two.result() == "for the second"


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_schedule_keys(db, first: str, second: str):
    from durable_django import engine as default_engine

    default_engine.register("tests.scheduled", "1", echo)
    try:
        for key in (first, second):
            Schedule.objects.put(key, workflow="tests.scheduled", interval_seconds=60, input=key)
    finally:
        default_engine.registry.remove("tests.scheduled")
    assert Schedule.objects.count() == 2
    assert Schedule.objects.get(key=first).input == first
    assert Schedule.objects.get(key=second).input == second


# the quota's tag prefix ------------------------------------------------------------------


def test_a_tag_in_another_case_than_the_quota_prefix_is_a_user_tag(engine: Engine):
    """Only tags starting with ``concurrency:`` exactly are the quota's."""
    engine.register("wf", "1", echo)
    handle = engine.start(
        "wf", {}, tags=["CONCURRENCY:x", "Concurrency:y"], concurrency={"key": "x", "limit": 1}
    )
    assert [(u.key, u.active) for u in engine.quota_usage()] == [("x", 1)]
    assert engine.count_runs(tag="CONCURRENCY:x") == 1
    with pytest.raises(ValueError, match="reserved"):
        engine.start("wf", {}, tags=["concurrency:x"])
    # A retry puts the run under another quota: its user tags stay.
    force_status(engine, handle.run_id, RunStatus.FAILED)
    engine.retry(handle.run_id, concurrency={"key": "z", "limit": 1})
    assert engine.get_run(handle.run_id).tags == [
        "CONCURRENCY:x",
        "Concurrency:y",
        "concurrency:z",
    ]
    assert [(u.key, u.active) for u in engine.quota_usage()] == [("z", 1)]


# the collations on MySQL/MariaDB ------------------------------------------------------------

mysql_only = pytest.mark.skipif(
    connection.vendor != "mysql", reason="PostgreSQL and SQLite compare bytes already"
)

#: Every column holding a run id, quota key, tag, workflow name, namespace, signal token
#: or schedule key.
EXACT_COLUMNS = {
    "durable_run.id",
    "durable_run.workflow",
    "durable_run.namespace",
    "durable_run.parent_id",
    "durable_run_tag.run_id",
    "durable_run_tag.tag",
    "durable_run_tag.namespace",
    "durable_step.run_id",
    "durable_signal.token",
    "durable_signal.consumed_by",
    "durable_schedule.key",
    "durable_schedule.workflow",
    "durable_schedule.concurrency_key",
    "durable_schedule.last_run_id",
    "durable_quota_lock.key",
    "durable_quota_ticket.quota_key",
    "durable_quota_override.tag",
    "durable_quota_override.scope",
    "durable_quota_ticket.namespace",
}


def collations() -> dict[str, str]:
    """``{"table.column": collation}`` of every ``varchar`` column of durable_django's
    tables (MariaDB's JSON columns are ``utf8mb4_bin`` texts)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CONCAT(TABLE_NAME, '.', COLUMN_NAME), COLLATION_NAME "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME LIKE 'durable\\_%%' AND DATA_TYPE = 'varchar'"
        )
        return dict(cursor.fetchall())


def foreign_keys() -> set[str]:
    """The columns of durable_django's tables with a foreign key to ``durable_run.id``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CONCAT(TABLE_NAME, '.', COLUMN_NAME) FROM information_schema.KEY_COLUMN_USAGE "
            "WHERE TABLE_SCHEMA = DATABASE() AND REFERENCED_TABLE_NAME = 'durable_run' "
            "AND REFERENCED_COLUMN_NAME = 'id'"
        )
        return {column for (column,) in cursor.fetchall()}


def database_default() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA "
            "WHERE SCHEMA_NAME = DATABASE()"
        )
        return cursor.fetchone()[0]


@mysql_only
@pytest.mark.django_db
def test_ids_and_keys_have_a_binary_no_pad_collation_and_nothing_else():
    """The suite's database has the server's default collation; the migrations give the
    columns of ids and keys the binary, no-pad one and leave the others as they were."""
    found = collations()
    assert set(found) >= EXACT_COLUMNS
    binary = binary_collation(connection)
    assert binary in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
    assert {column: found[column] for column in EXACT_COLUMNS} == dict.fromkeys(
        EXACT_COLUMNS, binary
    )
    others = {column: name for column, name in found.items() if column not in EXACT_COLUMNS}
    assert "durable_step.name" in others
    assert set(others.values()) == {database_default()}
    assert collation_errors(connection) == []


#: Columns made again below with the database's default collation, as tables created
#: otherwise than by the migrations could have them (no foreign key refers to them).
REMADE_COLUMNS = {"durable_run_tag.tag": "varchar(255)", "durable_signal.token": "varchar(255)"}


@mysql_only
@pytest.mark.django_db(transaction=True)
def test_the_migrations_reverse_and_columns_made_otherwise_are_an_error():
    app = "durable_django"
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes(app)
    default = database_default()
    try:
        executor.migrate([(app, None)])
        assert collations() == {}
        assert collation_errors(connection) == []  # no tables: ``migrate`` will make them
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
        found = collations()
        assert {column: found[column] for column in EXACT_COLUMNS} == dict.fromkeys(
            EXACT_COLUMNS, binary_collation(connection)
        )
        # No key to the run: a step's run and a tag's have its collation (above) but no
        # key in the database (a step's record holds the run's row lock; a tag row is
        # inserted with its run or under its row lock, and deleted with it by a trigger).
        assert foreign_keys() == set()
        assert collation_errors(connection) == []

        # As if these columns had been made by hand, or by another migration.
        with connection.cursor() as cursor:
            for column, kind in REMADE_COLUMNS.items():
                table, name = column.split(".")
                cursor.execute(
                    f"ALTER TABLE {table} MODIFY {name} {kind} NOT NULL COLLATE {default}"
                )
        errors = collation_errors(connection)
        assert [error.id for error in errors] == ["durable_django.E004"]
        for column in REMADE_COLUMNS:
            assert f"{column} ({default})" in errors[0].msg
        for column in EXACT_COLUMNS - REMADE_COLUMNS.keys():
            assert column not in errors[0].msg
        assert "migrate durable_django zero" in errors[0].hint
        # The store gives it with ``--database`` (and during ``migrate``) only.
        assert OrmStore().check(databases=["default"]) == errors
        assert OrmStore().check() == []
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate([(app, None)])
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    assert collation_errors(connection) == []
