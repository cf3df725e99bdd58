"""Executing runs in-process: recorded steps, replay, failures, blocked versions."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from durable_django import Engine, RunFailed, RunStatus
from durable_django._rules.registry import Registry
from durable_django.errors import RunTimeout
from durable_django.stores import OrmStore
from durable_django.testing import run_until_idle

from ..helpers import force_status


def test_steps_are_recorded_and_replayed(engine: Engine):
    calls = []

    def fetch(n):
        calls.append(n)
        return {"n": n}

    def body(ctx, input):
        a = ctx.step("fetch", fetch, 1)
        b = ctx.step("fetch", fetch, 2)
        return [a, b]

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    assert run_until_idle(engine) == 1
    assert handle.result() == [{"n": 1}, {"n": 2}]
    assert [(s.position, s.name, s.result) for s in engine.store.get_steps(handle.run_id)] == [
        (0, "fetch", {"n": 1}),
        (1, "fetch", {"n": 2}),
    ]
    # Replaying the run returns the recordings without calling fetch again.
    force_status(engine, handle.run_id, RunStatus.PENDING)
    assert run_until_idle(engine) == 1
    assert calls == [1, 2]
    assert handle.result() == [{"n": 1}, {"n": 2}]


def test_a_replay_reaching_another_step_fails_the_run(engine: Engine):
    names = iter(["first", "second"])

    def body(ctx, input):
        return ctx.step(next(names), lambda: 1)

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    force_status(engine, handle.run_id, RunStatus.PENDING)
    run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == "failed"
    assert run.error["type"].endswith("NonDeterminismError")
    assert "recorded as 'first'" in run.error["message"]


def test_a_failing_body_ends_failed_with_a_structured_error(engine: Engine):
    def body(ctx, input):
        ctx.step("explode", lambda: 1 / 0)

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == "failed" and run.finished_at is not None
    assert run.error["type"] == "builtins.ZeroDivisionError"
    assert run.error["message"] == "division by zero"
    assert "Traceback" in run.error["traceback"]
    assert engine.store.get_steps(handle.run_id)[0].error["message"] == "division by zero"
    with pytest.raises(RunFailed, match="ended failed: division by zero"):
        handle.result()


def test_a_non_json_output_or_step_result_fails_the_run(engine: Engine):
    engine.register("out", "1", lambda ctx, input: {1, 2})
    engine.register("step", "1", lambda ctx, input: ctx.step("s", object))
    out = engine.start("out", {})
    step = engine.start("step", {})
    run_until_idle(engine)
    assert engine.get_run(out.run_id).error["message"] == (
        "the output of workflow 'out' cannot be stored: set is not JSON-serialisable"
    )
    assert engine.get_run(step.run_id).error["message"] == (
        "the result of step 's' cannot be stored: object is not JSON-serialisable"
    )


def test_ctx_now_is_recorded_once(engine: Engine):
    engine.register("wf", "1", lambda ctx, input: ctx.now().isoformat())
    handle = engine.start("wf", {})
    run_until_idle(engine)
    first = handle.result()
    force_status(engine, handle.run_id, RunStatus.PENDING)
    run_until_idle(engine)
    assert handle.result() == first


def test_an_unregistered_version_blocks_the_run(engine: Engine):
    engine.register("wf", "1", lambda ctx, input: "v1")
    handle = engine.start("wf", {})
    engine.registry.remove("wf")
    engine.register("wf", "2", lambda ctx, input: "v2")
    assert engine.execute(handle.run_id)
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.BLOCKED
    assert "version '1' is not registered" in run.blocked_reason


def test_only_pending_runs_are_executed(engine: Engine):
    engine.register("wf", "1", lambda ctx, input: 1)
    handle = engine.start("wf", {})
    assert engine.execute(handle.run_id)
    assert not engine.execute(handle.run_id)  # already completed
    assert not engine.execute("no-such-run")


def test_run_until_idle_counts_turns_and_leaves_nothing_ready(engine: Engine):
    engine.register("wf", "1", lambda ctx, input: input)
    handles = [engine.start("wf", n) for n in range(5)]
    assert run_until_idle(engine) == 5
    assert [h.result() for h in handles] == list(range(5))
    assert run_until_idle(engine) == 0


def test_waiting_on_an_unfinished_run_times_out(engine: Engine):
    engine.register("wf", "1", lambda ctx, input: 1)
    handle = engine.start("wf", {})
    with pytest.raises(RunTimeout, match="still pending"):
        handle.result(timeout=0.05)


def test_a_step_is_recorded_before_the_next_durable_call_runs(engine: Engine):
    def recorded_names(run_id):
        return [s.name for s in engine.store.get_steps(run_id)]

    def body(ctx, input):
        ctx.step("first", lambda: 1)
        seen = ctx.step("second", recorded_names, ctx.run_id)
        return seen

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    # The second step's function saw the first step's record already written ...
    assert handle.result() == ["first"]
    # ... and the last record was written with the end of the turn.
    assert [s.name for s in engine.store.get_steps(handle.run_id)] == ["first", "second"]


@pytest.mark.parametrize(
    ("ending", "status", "names"),
    [
        ("fail", "failed", ["first"]),
        ("sleep", "suspended", ["first", "durable.sleep"]),
        ("now", "completed", ["first", "durable.now"]),
    ],
)
def test_the_last_record_is_written_with_any_end_of_the_turn(
    engine: Engine, ending: str, status: str, names: list[str]
):
    def body(ctx, input):
        ctx.step("first", lambda: 1)
        if ending == "fail":
            raise ValueError("after the step")
        if ending == "sleep":
            ctx.sleep(3600)
        return ctx.now().isoformat()

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    assert engine.get_run(handle.run_id).status == status
    assert [s.name for s in engine.store.get_steps(handle.run_id)] == names


def test_a_turn_whose_run_was_cancelled_records_nothing_at_its_end(engine: Engine):
    def body(ctx, input):
        # Cancelled while its only step runs: the end of the turn finds the run no
        # longer held, and the step's record, which would go with it, is not written.
        return ctx.step("cancel", lambda: engine.cancel(ctx.run_id))

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    assert engine.get_run(handle.run_id).status == "cancelled"
    assert engine.store.get_steps(handle.run_id) == []


def show_synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's claim function")
@pytest.mark.django_db(transaction=True)
def test_the_claims_asynchronous_commit_stays_with_the_claim(registry: Registry):
    engine = Engine(store=OrmStore(), registry=registry, enqueue=False)

    def body(ctx, input):
        # The body's own writes, on the worker's connection, commit as configured.
        return ctx.step("mode", show_synchronous_commit)

    engine.register("wf", "1", body)
    assert show_synchronous_commit() == "on"
    handle = engine.start("wf", {})
    assert engine.execute(handle.run_id)
    assert handle.result() == "on"
    assert show_synchronous_commit() == "on"

    # The function sets it for the claim's own transaction only, and only when asked:
    # a claim inside a transaction of the caller's leaves the caller's commit alone.
    for async_commit, inside in ((True, "off"), (False, "on")):
        run_id = engine.start("wf", {}).run_id
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT r_workflow FROM durable_claim_run_v1(%s, 'me', now(), now(), now(), %s)",
                [run_id, async_commit],
            )
            assert cursor.fetchone()[0] == "wf"
            assert show_synchronous_commit() == inside
        assert show_synchronous_commit() == "on"
