"""Transactional steps in-process: ``ctx.transaction``'s writes and its record commit
together or not at all.

The step functions write rows of the store's database (``Signal`` rows under a token of
the test's own, a table every database here has), so a test counts what committed.
Real commits (``transaction=True``): nothing runs inside a test's transaction.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.db import connection, connections, transaction

from durable_django import Engine, RunStatus
from durable_django.models import Run, Signal
from durable_django.testing import run_until_idle

from ..helpers import NUL, force_status, statements_sent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token() -> str:
    return f"tx:{uuid.uuid4().hex}"


def written(token: str) -> int:
    """How many rows the step functions committed under ``token``."""
    return Signal.objects.filter(token=token).count()


def steps(engine: Engine, run_id: str) -> list[tuple[int, str, Any, Any]]:
    return [
        (s.position, s.name, s.result, s.error and s.error["type"])
        for s in engine.store.get_steps(run_id)
    ]


def start_one_charge(engine: Engine, token: str) -> Any:
    """Start a run of a workflow of one transactional step writing a row under ``token``."""

    def body(ctx, input):
        return ctx.transaction("charge", lambda: Signal.objects.create(token=token).pk)

    engine.register("wf", "1", body)
    return engine.start("wf", {})


def take_the_lease(run_id: str) -> None:
    """Hand the run to another worker, from another connection, committed at once (as
    the tick does once a stalled worker's lease lapsed)."""

    def take() -> None:
        try:
            Run.objects.filter(pk=run_id).update(lease_owner="another worker")
        finally:
            connections.close_all()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()


def test_the_writes_and_the_record_commit_together_and_replay_does_not_call_fn(
    orm_engine: Engine, token: str
):
    calls = []

    def charge(amount: int) -> dict[str, int]:
        calls.append(amount)
        row = Signal.objects.create(token=token, payload={"amount": amount})
        return {"id": row.pk, "amount": amount}

    def body(ctx, input):
        first = ctx.transaction("charge", charge, 5)
        second = ctx.transaction("charge", charge, amount=7)
        return [first["amount"], second["amount"]]

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    assert run_until_idle(orm_engine) == 1
    assert handle.result() == [5, 7]
    assert written(token) == 2
    assert [(p, n, r["amount"], e) for p, n, r, e in steps(orm_engine, handle.run_id)] == [
        (0, "charge", 5, None),
        (1, "charge", 7, None),
    ]
    # Replaying the run returns the records without calling charge again.
    force_status(orm_engine, handle.run_id, RunStatus.PENDING)
    assert run_until_idle(orm_engine) == 1
    assert handle.result() == [5, 7]
    assert calls == [5, 7] and written(token) == 2


def test_a_function_that_raises_rolls_back_its_writes_and_is_retried(
    orm_engine: Engine, token: str
):
    calls = []

    def charge() -> str:
        calls.append(1)
        Signal.objects.create(token=token)
        if len(calls) == 1:
            raise ConnectionError("the payment service is down")
        return "charged"

    def body(ctx, input):
        return ctx.transaction("charge", charge, retries=1, backoff=0)

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    run_until_idle(orm_engine)
    # The first attempt's write is gone; its failure is recorded, with no result.
    assert written(token) == 0
    [failure] = orm_engine.store.get_steps(handle.run_id)
    assert failure.result is None and failure.error["type"] == "builtins.ConnectionError"
    assert failure.error["attempts"] == 1 and failure.error["retry_at"] is not None
    assert orm_engine.get_run(handle.run_id).wait == {"retry": "charge"}

    Run.objects.filter(pk=handle.run_id).update(wake_at=None)
    orm_engine.wake(handle.run_id)
    run_until_idle(orm_engine)
    assert handle.result() == "charged"
    assert len(calls) == 2 and written(token) == 1
    assert steps(orm_engine, handle.run_id) == [(0, "charge", "charged", None)]


def test_a_function_that_fails_for_good_fails_the_run_with_nothing_written(
    orm_engine: Engine, token: str
):
    def charge() -> None:
        Signal.objects.create(token=token)
        raise ValueError("card declined")

    def body(ctx, input):
        return ctx.transaction("charge", charge)

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    run_until_idle(orm_engine)
    run = orm_engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED
    assert (run.error["type"], run.error["step"]) == ("builtins.ValueError", "charge")
    assert written(token) == 0
    assert steps(orm_engine, handle.run_id) == [(0, "charge", None, "builtins.ValueError")]


def test_a_result_the_store_cannot_hold_rolls_back_the_writes_and_fails_the_step(
    orm_engine: Engine, token: str
):
    def charge() -> dict[str, str]:
        Signal.objects.create(token=token)
        return {"receipt": NUL}

    def body(ctx, input):
        return ctx.transaction("charge", charge)

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    run_until_idle(orm_engine)
    run = orm_engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED and run.error["step"] == "charge"
    assert run.error["type"] == "durable_django.errors.UnstorableValueError"
    assert run.error["path"] == "$.receipt"
    assert written(token) == 0
    assert steps(orm_engine, handle.run_id) == [
        (0, "charge", None, "durable_django.errors.UnstorableValueError")
    ]


def test_a_worker_that_lost_the_run_rolls_back_the_writes_the_record_and_the_earlier_record(
    orm_engine: Engine, token: str
):
    calls = []

    def charge() -> str:
        calls.append(1)
        Signal.objects.create(token=token)
        return "charged"

    def body(ctx, input):
        # The run is handed to another worker while this step runs (on SQLite, whose
        # transactions here take the write lock at once, it cannot be during the next
        # one); the step's record is to be written with the next durable call.
        ctx.step("price", take_the_lease, ctx.run_id)
        ctx.transaction("charge", charge)
        return "done"

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    assert orm_engine.execute(handle.run_id)
    # The turn stopped: nothing of it committed, not even the earlier step's record,
    # which was to commit in the transactional step's transaction.
    assert calls == [1]
    assert written(token) == 0
    assert steps(orm_engine, handle.run_id) == []
    run = orm_engine.get_run(handle.run_id)
    assert (run.status, run.lease_owner) == (RunStatus.RUNNING, "another worker")


def test_an_earlier_steps_record_commits_in_the_transaction(orm_engine: Engine, token: str):
    seen: list[list[tuple[int, str]]] = []

    def charge(run_id: str) -> str:
        # Inside the transaction, before its records: the earlier step is not recorded.
        seen.append([(s.position, s.name) for s in Run.objects.get(pk=run_id).steps.all()])
        Signal.objects.create(token=token)
        return "charged"

    def body(ctx, input):
        ctx.step("price", lambda: 5)
        return ctx.transaction("charge", charge, ctx.run_id)

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    run_until_idle(orm_engine)
    assert handle.result() == "charged"
    assert seen == [[]]
    assert steps(orm_engine, handle.run_id) == [
        (0, "price", 5, None),
        (1, "charge", "charged", None),
    ]


def test_a_transactional_step_leaves_no_record_for_the_turns_end(orm_engine: Engine, token: str):
    def body(ctx, input):
        return ctx.transaction("charge", lambda: Signal.objects.create(token=token).pk)

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    statements: list[tuple[str, Any]] = []

    def spy(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        assert orm_engine.execute(handle.run_id)
    assert orm_engine.get_run(handle.run_id).status == RunStatus.COMPLETED
    assert written(token) == 1
    if connection.vendor == "postgresql":
        # The claim; the step's write and record, in one transaction, the record sent
        # with its COMMIT; the end, which has no record left to write (the step's four
        # arguments are NULL).
        calls = [
            (sql.split("(")[0], params)
            for sql, params in statements
            if sql.startswith("SELECT") and "durable_" in sql.split("(")[0]
        ]
        assert [name for name, _ in calls] == [
            "SELECT * FROM durable_claim_run_v1",
            "SELECT durable_record_held_step_v2",
            "SELECT durable_transition_v1",
        ]
        assert calls[-1][1][-4:] == [None, None, None, None]
        assert next(sql for sql, _ in statements if "_v2" in sql).endswith("; COMMIT")


def test_on_commit_callbacks_of_the_function_run_once_its_transaction_committed(
    orm_engine: Engine, token: str
):
    """The transaction committed with the record (one round trip on PostgreSQL) still
    runs what ``fn`` registered with ``transaction.on_commit``, after the commit."""
    seen: list[int] = []

    def charge() -> str:
        Signal.objects.create(token=token)
        transaction.on_commit(lambda: seen.append(written(token)))
        return "charged"

    def body(ctx, input):
        first = ctx.transaction("charge", charge)
        seen.append(-1)
        return first

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    run_until_idle(orm_engine)
    assert handle.result() == "charged"
    # Run after the commit (the row visible), before the body went on.
    assert seen == [1, -1]


def test_inside_a_transaction_of_the_callers_the_step_commits_with_it(
    orm_engine: Engine, token: str
):
    """A turn executed inside the caller's ``atomic()``: the step's transaction is a
    savepoint of it, and its record does not commit the caller's transaction."""
    handle = start_one_charge(orm_engine, token)

    class Undone(Exception):
        pass

    with pytest.raises(Undone), statements_sent() as statements, transaction.atomic():
        assert orm_engine.execute(handle.run_id)
        assert orm_engine.get_run(handle.run_id).status == RunStatus.COMPLETED
        raise Undone
    # Everything was the caller's to commit, and it rolled back.
    assert written(token) == 0
    assert orm_engine.get_run(handle.run_id).status == RunStatus.PENDING
    assert not [sql for sql in statements if "COMMIT" in sql]


def test_a_store_without_a_database_runs_the_function_then_records_it(memory_engine: Engine):
    calls = []

    def body(ctx, input):
        return ctx.transaction("add", lambda a, b: calls.append(1) or a + b, 2, 3)

    memory_engine.register("wf", "1", body)
    handle = memory_engine.start("wf", {})
    run_until_idle(memory_engine)
    assert handle.result() == 5
    force_status(memory_engine, handle.run_id, RunStatus.PENDING)
    run_until_idle(memory_engine)
    assert handle.result() == 5 and calls == [1]


def test_a_transactional_step_name_is_checked_on_replay(orm_engine: Engine):
    names = iter(["first", "second"])

    def body(ctx, input):
        return ctx.transaction(next(names), lambda: 1)

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    run_until_idle(orm_engine)
    force_status(orm_engine, handle.run_id, RunStatus.PENDING)
    run_until_idle(orm_engine)
    run = orm_engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"].endswith("NonDeterminismError")


def test_a_record_the_database_refuses_rolls_back_the_writes_and_ends_the_run(
    orm_engine: Engine, token: str
):
    """The database refuses the step's record (a trigger): ``fn``'s writes are undone with
    it, the step fails as a raising ``fn`` would, and the run ends, its slot free."""
    from ..database_refusal import MESSAGE, refusing

    def charge() -> str:
        Signal.objects.create(token=token, payload={})
        return "charged"

    def body(ctx, input):
        return ctx.transaction("charge", charge)

    orm_engine.register("wf", "1", body, concurrency={"key": lambda i: "tx:refused", "limit": 1})
    handle = orm_engine.start("wf", {})
    with refusing("durable_step", "INSERT", "NEW.name = 'charge'"):
        assert run_until_idle(orm_engine) == 1
    run = orm_engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED
    assert MESSAGE in str(run.error)
    assert written(token) == 0
    assert all(usage.active == 0 for usage in orm_engine.quota_usage("tx:refused"))
    assert orm_engine.start("wf", {}).created


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's binding options")
def test_with_server_side_binding_the_record_still_carries_the_commit(
    orm_engine: Engine, token: str
):
    """Django's server-side binding sends one statement per query on Django's cursors:
    ``fn``'s first statement goes without the ``BEGIN``. The record's kept cursor binds
    client-side all the same, so the ``COMMIT`` travels with it."""
    handle = start_one_charge(orm_engine, token)
    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["server_side_binding"] = True
    try:
        with statements_sent() as statements:
            assert orm_engine.execute(handle.run_id)
    finally:
        del options["server_side_binding"]
        connection.close()
    assert orm_engine.get_run(handle.run_id).status == RunStatus.COMPLETED
    assert written(token) == 1
    records = [sql for sql in statements if "durable_record_held_step" in sql]
    assert len(records) == 1 and "_v2" in records[0] and records[0].endswith("; COMMIT")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's binding options")
def test_with_server_side_binding_and_the_query_log_the_commit_goes_apart(
    orm_engine: Engine, token: str
):
    """With the query log on, the record is sent on Django's cursor, which then binds on
    the server (one statement per query): the ``COMMIT`` goes apart, and the step is
    recorded once all the same."""
    handle = start_one_charge(orm_engine, token)
    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["server_side_binding"] = True
    connection.force_debug_cursor = True
    try:
        assert orm_engine.execute(handle.run_id)
        logged = [query["sql"] for query in connection.queries]
    finally:
        connection.force_debug_cursor = False
        del options["server_side_binding"]
        connection.close()
    assert orm_engine.get_run(handle.run_id).status == RunStatus.COMPLETED
    assert written(token) == 1
    records = [sql for sql in logged if "durable_record_held_step" in sql]
    assert len(records) == 1 and "COMMIT" not in records[0]
