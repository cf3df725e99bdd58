"""A run's tag rows go with it, on every database: the trigger of migration 0006
(``durable_django.stores.run_deletion``) deletes them when the run is deleted otherwise
than through Django, so its quota's slot is freed; no foreign key checks them on insert."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings

from durable_django.errors import ConcurrencyLimitError
from durable_django.models import Run, RunTag
from durable_django.stores import OrmStore
from durable_django.stores.contract import new_run, quota, start
from durable_django.stores.postgres import function_definitions
from durable_django.stores.run_deletion import RULE, TRIGGER, DeleteTagRowsWithRun, statement

#: The triggers of ``durable_run``, by name.
TRIGGERS = {
    "postgresql": "SELECT tgname FROM pg_trigger "
    "WHERE tgrelid = 'durable_run'::regclass AND NOT tgisinternal",
    "mysql": "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS "
    "WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = 'durable_run'",
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'durable_run'",
}

#: The foreign keys of ``durable_run_tag``.
FOREIGN_KEYS = {
    "postgresql": "SELECT conname FROM pg_constraint "
    "WHERE conrelid = 'durable_run_tag'::regclass AND contype = 'f'",
    "mysql": "SELECT CONSTRAINT_NAME FROM information_schema.REFERENTIAL_CONSTRAINTS "
    "WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = 'durable_run_tag'",
    "sqlite": "SELECT \"table\" FROM pragma_foreign_key_list('durable_run_tag')",
}


def _rows(sql: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [row[0] for row in cursor.fetchall()]


def _delete_by_hand(run_id: str) -> None:
    """A ``DELETE`` of the run alone, as an operator would write it."""
    table, column = connection.ops.quote_name("durable_run"), connection.ops.quote_name("id")
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {column} = %s", [run_id])


@pytest.mark.django_db
def test_the_run_table_has_the_trigger_and_the_tag_rows_no_foreign_key():
    assert TRIGGER in _rows(TRIGGERS[connection.vendor])
    assert _rows(FOREIGN_KEYS[connection.vendor]) == []


@pytest.mark.django_db(transaction=True)
def test_a_run_deleted_by_hand_takes_its_tag_rows_and_frees_its_slot():
    store = OrmStore()
    start(store, new_run("held", tags=("team:a",)), quota("k", 1))
    with pytest.raises(ConcurrencyLimitError):
        start(store, new_run("refused"), quota("k", 1))
    start(store, new_run("other"), quota("other-key", 1))

    _delete_by_hand("held")

    assert not Run.objects.filter(pk="held").exists()
    assert list(RunTag.objects.filter(run_id="held")) == []
    # The other run's rows stay.
    assert list(RunTag.objects.filter(run_id="other").values_list("tag", flat=True)) == [
        "concurrency:other-key"
    ]
    assert start(store, new_run("admitted"), quota("k", 1)).created


@pytest.mark.django_db(transaction=True)
def test_a_run_deleted_through_django_leaves_nothing_behind():
    store = OrmStore()
    start(store, new_run("gone", tags=("team:a",)), quota("k", 1))
    Run.objects.filter(pk="gone").delete()
    assert RunTag.objects.count() == 0
    assert start(store, new_run("next"), quota("k", 1)).created


APP = "durable_django"
BEFORE = (APP, "0005_batch_start_in_columns")


class RefuseDurable:
    """A database router keeping durable_django off every database."""

    def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool | None:
        return False if app_label == APP else None


def _migrate(target: list[tuple[str, str]]) -> None:
    MigrationExecutor(connection).migrate(target)


@pytest.mark.django_db(transaction=True)
def test_the_migration_reverses_to_the_foreign_key_and_back():
    app = APP
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes(app)
    try:
        executor.migrate([BEFORE])
        assert TRIGGER not in _rows(TRIGGERS[connection.vendor])
        assert len(_rows(FOREIGN_KEYS[connection.vendor])) == 1
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    assert TRIGGER in _rows(TRIGGERS[connection.vendor])
    assert _rows(FOREIGN_KEYS[connection.vendor]) == []


@pytest.mark.django_db(transaction=True)
def test_the_trigger_is_made_and_dropped_only_where_the_routers_allow():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes(APP)
    triggers = TRIGGERS[connection.vendor]
    try:
        with override_settings(DATABASE_ROUTERS=[RefuseDurable()]):
            _migrate([BEFORE])
            assert TRIGGER in _rows(triggers)  # refused: not dropped
            _migrate(latest)
        _migrate([BEFORE])
        assert TRIGGER not in _rows(triggers)
        with override_settings(DATABASE_ROUTERS=[RefuseDurable()]):
            _migrate(latest)
            assert TRIGGER not in _rows(triggers)  # refused: not made
            _migrate([BEFORE])
    finally:
        _migrate(latest)
    assert TRIGGER in _rows(triggers)


def test_postgresql_s_trigger_function_runs_the_rule_the_other_triggers_are_made_of():
    body = function_definitions()["durable_run_deleted_v1"]
    assert RULE.format(tags="durable_run_tag", run_id="run_id", id="id") + ";" in body
    # The function runs that statement and nothing else.
    assert body.count(";") == 3  # the rule's, RETURN's and the file's "$$;"


def test_a_database_of_another_kind_and_an_unknown_function_are_refused_by_name():
    with pytest.raises(ValueError, match="'oracle'"):
        statement("oracle", {})
    with pytest.raises(ValueError, match="'durable_nothing_v1'"):
        DeleteTagRowsWithRun(function="durable_nothing_v1")
