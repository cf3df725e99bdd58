"""The tables: migrations in step with the models, and the quota count's query."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durable_django._core.lifecycle import ALL_STATUSES, TERMINAL_STATUSES
from durable_django.models import Run, RunTag
from durable_django.status import ACTIVE_STATUSES, RunStatus
from durable_django.stores import OrmStore
from durable_django.stores.base import NewRun, StepRecord

from ..factories import RunFactory, RunTagFactory


def test_migrations_are_in_step_with_the_models(db):
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    assert "No changes detected" in out.getvalue()


def test_the_status_choices_are_the_life_cycle_s_values():
    assert list(RunStatus.values) == [*ACTIVE_STATUSES, *TERMINAL_STATUSES]
    assert set(RunStatus.values) == ALL_STATUSES
    assert RunStatus.terminal_values() == TERMINAL_STATUSES


def test_the_count_is_one_count_query_on_the_tag_rows(db):
    RunTagFactory.create_batch(3, tag="concurrency:k", run__status="completed")
    RunTagFactory.create_batch(2, tag="concurrency:k", run__status="running")
    with CaptureQueriesContext(connection) as queries:
        assert RunTag.objects.count_runs(tag="concurrency:k", statuses=ACTIVE_STATUSES) == 2
    assert len(queries) == 1
    sql = queries[0]["sql"]
    assert "COUNT(*)" in sql and "durable_run_tag" in sql
    assert '"durable_run"' not in sql and "`durable_run`" not in sql  # no join to the runs


def test_the_count_can_be_fenced_to_a_namespace(db):
    RunTagFactory(tag="concurrency:k", run__status="pending", run__namespace="blue")
    RunTagFactory(tag="concurrency:k", run__status="pending", run__namespace="green")
    assert RunTag.objects.count_runs(tag="concurrency:k", statuses=["pending"]) == 2
    assert (
        RunTag.objects.count_runs(tag="concurrency:k", statuses=["pending"], namespace="blue") == 1
    )


def test_a_status_change_is_copied_to_the_tags_in_one_transaction(db):
    store = OrmStore()
    store.create_run(NewRun("r1", "wf", "1", "default", {}, tags=("a", "concurrency:k")))
    assert store.transition("r1", ["pending"], "suspended")
    assert set(RunTag.objects.filter(run_id="r1").values_list("status", flat=True)) == {"suspended"}
    # A transition from a status the run is not in changes nothing.
    assert not store.transition("r1", ["pending"], "running")
    assert store.get_run("r1").status == "suspended"
    assert store.transition("r1", ["suspended"], "pending")
    assert store.transition("r1", ["pending"], "running", lease_owner="w1")
    assert set(RunTag.objects.values_list("status", flat=True)) == {"running"}
    # Held by another worker: no change.
    assert not store.transition("r1", ["running"], "completed", owner="w2")
    assert store.transition("r1", ["running"], "completed", owner="w1")


def test_an_invalid_status_is_refused_by_the_database(db):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        RunFactory(status="done")


def test_steps_are_unique_by_position(db):
    from django.db import IntegrityError, transaction

    store = OrmStore()
    store.create_run(NewRun("r1", "wf", "1", "default", {}))
    store.record_step("r1", StepRecord(0, "a", result=1))
    with pytest.raises(IntegrityError), transaction.atomic():
        store.record_step("r1", StepRecord(0, "b", result=2))
    assert [s.name for s in store.get_steps("r1")] == ["a"]


def test_querysets(db):
    RunTagFactory(tag="t", run__status="completed")
    RunTagFactory(tag="t", run__status="pending")
    assert Run.objects.active().count() == 1
    assert Run.objects.tagged("t").count() == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="EXPLAIN output is PostgreSQL's")
def test_the_count_searches_the_index_on_tag_and_status_on_postgresql(db):
    RunTagFactory.create_batch(50, tag="concurrency:k", run__status="completed")
    RunTagFactory(tag="concurrency:k", run__status="pending")
    with CaptureQueriesContext(connection) as queries:
        assert RunTag.objects.count_runs(tag="concurrency:k", statuses=ACTIVE_STATUSES) == 1
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a 51-row table would be scanned
        cursor.execute("EXPLAIN " + queries[0]["sql"])
        plan = [row[0] for row in cursor.fetchall()]
    conditions = [line for line in plan if "Index Cond" in line]
    # One index search per counted status, each on (tag, status): finished runs unread.
    assert len(conditions) == len(ACTIVE_STATUSES)
    assert all("tag" in line and "status" in line for line in conditions)


def _run_indexes() -> set[str]:
    """The names of ``durable_run``'s indexes in the database, its primary key's left out."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, Run._meta.db_table)
    return {name for name, about in found.items() if about["index"] and not about["primary_key"]}


@pytest.mark.django_db(transaction=True)
def test_migration_0004_drops_the_namespace_index_and_reverses():
    from django.db.migrations.executor import MigrationExecutor

    app = "durable_django"
    model = {index.name for index in Run._meta.indexes}
    assert "durable_run_namespace_idx" not in model
    assert model <= _run_indexes()
    assert "durable_run_namespace_idx" not in _run_indexes()
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes(app)
    try:
        MigrationExecutor(connection).migrate([(app, "0003_quota_overrides")])
        assert "durable_run_namespace_idx" in _run_indexes()
    finally:
        MigrationExecutor(connection).migrate(latest)
    assert "durable_run_namespace_idx" not in _run_indexes()
