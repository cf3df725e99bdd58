"""Executing runs in-process: recorded steps, replay, failures, blocked versions."""

from __future__ import annotations

import pytest

from durable_django import Engine, RunFailed, RunStatus
from durable_django.errors import RunTimeout
from durable_django.testing import run_until_idle

from .conftest import force_status


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
    assert (
        "output of workflow 'out' must be JSON-serialisable"
        in engine.get_run(out.run_id).error["message"]
    )
    assert "result of step 's'" in engine.get_run(step.run_id).error["message"]


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
