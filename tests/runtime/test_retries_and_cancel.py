"""Step retries, failing for good, cancel and retry of a run, in-process."""

from __future__ import annotations

import pytest

from durable_django import (
    ConcurrencyLimitError,
    DurableError,
    Engine,
    RunNotFound,
    RunStatus,
)
from durable_django._runtime.execution import StepError
from durable_django.testing import run_until_idle

from ..ticking import tick_until_settled


def test_step_retries_wait_on_durable_timers(engine: Engine):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError(f"attempt {len(attempts)}")
        return "ok"

    engine.register("wf", "1", lambda ctx, i: ctx.step("call", flaky, retries=3, backoff=0.02))
    handle = engine.start("wf", {})
    run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.SUSPENDED and run.wait == {"retry": "call"}
    tick_until_settled(engine, handle.run_id)
    assert handle.result() == "ok" and len(attempts) == 3
    assert engine.store.get_steps(handle.run_id)[0].result == "ok"


def test_a_step_failing_for_good_fails_the_run_naming_the_step(engine: Engine):
    def body(ctx, input):
        try:
            ctx.step("charge", lambda: 1 / 0)
        except StepError as error:
            assert error.error["type"] == "builtins.ZeroDivisionError"
            raise

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    error = engine.get_run(handle.run_id).error
    assert (error["type"], error["step"], error["attempts"]) == (
        "builtins.ZeroDivisionError",
        "charge",
        1,
    )


def test_cancel_frees_the_slot_at_once(engine: Engine):
    engine.register(
        "wf", "1", lambda ctx, i: ctx.sleep(60), concurrency={"key": lambda i: "k", "limit": 1}
    )
    handle = engine.start("wf", {})
    run_until_idle(engine)
    assert engine.cancel(handle.run_id)
    assert handle.status == RunStatus.CANCELLED
    assert engine.start("wf", {}).created
    assert not engine.cancel(handle.run_id)
    with pytest.raises(RunNotFound):
        engine.cancel("no-such-run")


def test_a_run_cancelled_while_it_executes_stays_cancelled(engine: Engine):
    def body(ctx, input):
        ctx.engine.cancel(ctx.run_id)
        return "finished anyway"

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.CANCELLED and run.output is None


def test_retry_replays_completed_steps_and_goes_through_the_quota(engine: Engine):
    calls = {"first": 0, "second": 0}

    def first():
        calls["first"] += 1
        return 1

    def second():
        calls["second"] += 1
        if calls["second"] == 1:
            raise RuntimeError("flaky")
        return 2

    engine.register(
        "wf",
        "1",
        lambda ctx, i: ctx.step("first", first) + ctx.step("second", second),
        concurrency={"key": lambda i: "k", "limit": 1},
    )
    handle = engine.start("wf", {})
    run_until_idle(engine)
    assert handle.status == RunStatus.FAILED
    # The key is full: the retry is refused and the run stays failed.
    other = engine.start("wf", {})
    with pytest.raises(ConcurrencyLimitError):
        engine.retry(handle.run_id)
    assert handle.status == RunStatus.FAILED
    engine.cancel(other.run_id)
    retried = engine.retry(handle.run_id)
    assert retried.run_id == handle.run_id
    run = engine.get_run(handle.run_id)
    assert (run.status, run.attempt, run.error) == ("pending", 2, None)
    run_until_idle(engine)
    assert handle.result() == 3 and calls == {"first": 1, "second": 2}
    with pytest.raises(DurableError, match="only a failed run can be retried"):
        engine.retry(handle.run_id)


def test_retry_under_a_new_quota_moves_the_tag(engine: Engine):
    engine.register(
        "wf", "1", lambda ctx, i: 1 / 0, concurrency={"key": lambda i: "old", "limit": 5}
    )
    handle = engine.start("wf", {})
    run_until_idle(engine)
    engine.retry(handle.run_id, concurrency={"key": "new", "limit": 1})
    assert engine.get_run(handle.run_id).tags == ["concurrency:new"]
    assert engine.count_runs(tag="concurrency:new", statuses=["pending"]) == 1


def test_a_step_result_that_is_not_json_fails_the_step_under_its_retries(engine: Engine):
    calls = []

    def body(ctx, input):
        return ctx.step("bad", lambda: calls.append(1) or {1, 2}, retries=2, backoff=0)

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    tick_until_settled(engine, handle.run_id)
    assert handle.status == RunStatus.FAILED and calls == [1, 1, 1]
    error = engine.get_run(handle.run_id).error
    assert error["step"] == "bad" and error["attempts"] == 3
    assert (
        error["message"]
        == "the result of step 'bad' cannot be stored: set is not JSON-serialisable"
    )
