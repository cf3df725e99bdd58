"""Durable execution in-process: timers, signals, children, retries, cancel, the tick."""

from __future__ import annotations

import datetime
import time

import pytest
from django.utils import timezone

from durable_django import (
    BaseWorkflow,
    ChildWorkflowError,
    ConcurrencyLimitError,
    DurableError,
    Engine,
    RunNotFound,
    RunStatus,
    workflow,
)
from durable_django._runtime.execution import SignalTimeout, StepError
from durable_django.testing import run_until_idle

from .helpers import force_status


def later(seconds: float) -> datetime.datetime:
    return timezone.now() + datetime.timedelta(seconds=seconds)


def wait_and_tick(engine: Engine, seconds: float = 0.06) -> None:
    time.sleep(seconds)
    engine.tick()
    run_until_idle(engine)


def tick_until_settled(engine: Engine, run_id: str, attempts: int = 200) -> None:
    """Tick and execute until the run ends: timers are due after real time passes, and a
    loaded machine may need more than one round."""
    for _ in range(attempts):
        if engine.get_run(run_id).status in ("completed", "failed", "cancelled"):
            return
        wait_and_tick(engine, 0.03)
    raise AssertionError(f"run {run_id} did not settle")


def test_sleep_suspends_without_a_worker_and_the_tick_wakes_it(engine: Engine):
    engine.register(
        "wf",
        "1",
        lambda ctx, i: ctx.sleep(0.05) or "slept",
        concurrency={"key": lambda i: "k", "limit": 1},
    )
    handle = engine.start("wf", {})
    assert run_until_idle(engine) == 1
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.SUSPENDED and run.wake_at is not None
    assert run.wait == {"sleep": run.wake_at.isoformat()}
    # A suspended run holds its slot.
    with pytest.raises(ConcurrencyLimitError):
        engine.start("wf", {})
    tick_until_settled(engine, handle.run_id)
    assert handle.result() == "slept"
    assert engine.tick().total == 0


def test_a_signal_wakes_its_waiter(engine: Engine):
    engine.register("wf", "1", lambda ctx, i: {"got": ctx.wait_for_signal(f"approve:{i}")})
    handle = engine.start("wf", 7)
    run_until_idle(engine)
    assert engine.get_run(handle.run_id).wait == {"signal": "approve:7"}
    engine.signal("approve:7", {"by": "ada"})
    assert engine.get_run(handle.run_id).status == RunStatus.PENDING
    run_until_idle(engine)
    assert handle.result() == {"got": {"by": "ada"}}


def test_a_signal_sent_first_is_kept_for_the_waiter(engine: Engine):
    engine.signal("early", [1, 2])
    engine.register("wf", "1", lambda ctx, i: ctx.wait_for_signal("early"))
    handle = engine.start("wf", {})
    run_until_idle(engine)
    assert handle.result() == [1, 2]


def test_one_signal_is_taken_by_one_wait(engine: Engine):
    engine.register("wf", "1", lambda ctx, i: ctx.wait_for_signal("shared"))
    first, second = engine.start("wf", 1), engine.start("wf", 2)
    run_until_idle(engine)
    engine.signal("shared", "a")
    run_until_idle(engine)
    statuses = sorted(engine.get_run(h.run_id).status for h in (first, second))
    assert statuses == ["completed", "suspended"]
    engine.signal("shared", "b")
    run_until_idle(engine)
    assert sorted([first.result(), second.result()]) == ["a", "b"]


def test_a_signal_wait_times_out(engine: Engine):
    def body(ctx, input):
        try:
            return ctx.wait_for_signal("never", timeout=0.05)
        except SignalTimeout as error:
            return f"timeout: {error}"

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    assert engine.get_run(handle.run_id).wake_at is not None
    tick_until_settled(engine, handle.run_id)
    assert handle.result().startswith("timeout: no signal 'never'")
    # A signal that comes later is kept, not lost.
    engine.signal("never", 1)
    assert engine.store.has_signal("never")


def test_a_child_suspends_its_parent_until_it_ends(engine: Engine):
    engine.register("child", "1", lambda ctx, i: {"double": i * 2})
    engine.register("parent", "1", lambda ctx, i: ctx.child("child", i)["double"] + 1)
    handle = engine.start("parent", 20)
    assert run_until_idle(engine) == 3  # parent, child, parent again
    assert handle.result() == 41
    child = engine.get_run(f"{handle.run_id}/0")
    assert child.parent_id == handle.run_id and child.output == {"double": 40}


def test_a_failed_child_raises_child_workflow_error_in_the_parent(engine: Engine):
    def fail(ctx, input):
        raise ValueError("bad input")

    def parent(ctx, input):
        try:
            ctx.child("child", {}, child_id="the-child")
        except ChildWorkflowError as error:
            return {"child": error.child_id, "cause": error.cause["message"]}

    engine.register("child", "1", fail)
    engine.register("parent", "1", parent)
    handle = engine.start("parent", {})
    run_until_idle(engine)
    assert handle.result() == {"child": "the-child", "cause": "bad input"}


def test_start_child_goes_on_without_waiting(engine: Engine):
    engine.register("child", "1", lambda ctx, i: ctx.sleep(60))
    engine.register("parent", "1", lambda ctx, i: [ctx.start_child("child", n) for n in (1, 2)])
    handle = engine.start("parent", {})
    run_until_idle(engine)
    ids = handle.result()
    assert ids == [f"{handle.run_id}/0", f"{handle.run_id}/1"]
    assert {engine.get_run(i).status for i in ids} == {"suspended"}


def test_start_and_dispatch_inside_a_body_are_child_starts(engine: Engine):
    @workflow(name="leaf", engine=engine)
    def leaf(ctx, input):
        return input + 1

    @workflow(name="tree", engine=engine)
    class Tree(BaseWorkflow):
        def run(self, ctx, input):
            waited = leaf.start(1)
            handle = leaf.dispatch(10, run_id=f"{ctx.run_id}:leaf")
            return {"waited": waited, "dispatched": handle.run_id, "created": handle.created}

    handle = Tree.dispatch({})
    run_until_idle(engine)
    assert handle.result() == {
        "waited": 2,
        "dispatched": f"{handle.run_id}:leaf",
        "created": True,
    }
    assert engine.get_run(f"{handle.run_id}:leaf").output == 11


def test_a_refused_child_is_a_failed_child_and_replays_the_same(engine: Engine):
    engine.register(
        "child", "1", lambda ctx, i: "ran", concurrency={"key": lambda i: "k", "limit": 1}
    )
    seen = []

    def parent(ctx, input):
        try:
            return ctx.child("child", {})
        except ChildWorkflowError as error:
            seen.append(error.cause)
            return {
                "refused": error.cause.key,
                "active": error.cause.active,
                "retry_after": error.cause.retry_after,
            }

    engine.register("parent", "1", parent)
    blocker = engine.start("child", {}, concurrency={"key": "k", "limit": 5})
    # The key has a history: the blocker is 5 s into runs that last 8 s.
    done = engine.start("child", {}, concurrency={"key": "k", "limit": 5})
    now = timezone.now()
    force_status(
        engine,
        done.run_id,
        RunStatus.COMPLETED,
        created_at=now - datetime.timedelta(seconds=10),
        finished_at=now - datetime.timedelta(seconds=2),
    )
    force_status(
        engine, blocker.run_id, RunStatus.PENDING, created_at=now - datetime.timedelta(seconds=5)
    )
    handle = engine.start("parent", {})
    engine.execute(handle.run_id)
    result = handle.result()
    assert (result["refused"], result["active"]) == ("k", 1)
    assert 2 < result["retry_after"] <= 3
    assert isinstance(seen[0], ConcurrencyLimitError)
    assert [holder.run_id for holder in seen[0].holders()] == [blocker.run_id]
    with pytest.raises(RunNotFound):
        engine.get_run(f"{handle.run_id}/0")  # nothing created
    # With the slot free, a replay still sees the recorded refusal.
    engine.cancel(blocker.run_id)
    force_status(engine, handle.run_id, RunStatus.PENDING)
    engine.execute(handle.run_id)
    assert handle.result() == result  # retry_after included: it was recorded


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


def test_the_tick_recovers_a_run_whose_worker_died(engine: Engine):
    engine.register("wf", "1", lambda ctx, i: "done")
    handle = engine.start("wf", {})
    # A worker took it and died: its lease lapses.
    force_status(
        engine, handle.run_id, RunStatus.RUNNING, lease_owner="dead", lease_expires_at=later(-1)
    )
    assert run_until_idle(engine) == 0
    result = engine.tick()
    assert result.recovered == 1 and engine.tick().recovered == 0
    run_until_idle(engine)
    assert handle.result() == "done"


def test_a_live_lease_is_not_taken(engine: Engine):
    engine.register("wf", "1", lambda ctx, i: "done")
    handle = engine.start("wf", {})
    force_status(
        engine, handle.run_id, RunStatus.RUNNING, lease_owner="alive", lease_expires_at=later(60)
    )
    assert engine.tick().total == 0
    assert engine.get_run(handle.run_id).lease_owner == "alive"


def test_a_blocked_run_is_handed_on_once_its_version_is_here(engine: Engine):
    engine.register("wf", "1", lambda ctx, i: "v1")
    handle = engine.start("wf", {})
    engine.registry.remove("wf")
    run_until_idle(engine)  # not executable here: left pending
    engine.execute(handle.run_id)
    assert handle.status == RunStatus.BLOCKED
    engine.register("wf", "1", lambda ctx, i: "v1 again")
    assert engine.tick().unblocked == 0  # not due yet
    assert engine.tick(now=later(3600)).unblocked == 1
    run_until_idle(engine)
    assert handle.result() == "v1 again"


def test_the_tick_sends_again_runs_whose_message_seems_lost(engine: Engine):
    engine.register("wf", "1", lambda ctx, i: "done")
    handle = engine.start("wf", {})
    assert engine.tick().resent == 0
    assert engine.tick(now=later(3600)).resent == 1
    assert handle.status == RunStatus.PENDING


def test_a_replay_reaching_another_durable_call_fails(engine: Engine):
    calls = iter(["sleep", "step"])

    def body(ctx, input):
        if next(calls) == "sleep":
            ctx.sleep(0)
        else:
            ctx.step("s", lambda: 1)
        return "ok"

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    force_status(engine, handle.run_id, RunStatus.PENDING)
    run_until_idle(engine)
    assert "recorded as 'durable.sleep'" in engine.get_run(handle.run_id).error["message"]


def test_bad_durable_call_arguments(engine: Engine):
    engine.register("sleep", "1", lambda ctx, i: ctx.sleep("soon"))
    engine.register("signal", "1", lambda ctx, i: ctx.wait_for_signal(""))
    handles = [engine.start("sleep", {}), engine.start("signal", {})]
    run_until_idle(engine)
    errors = [engine.get_run(h.run_id).error["message"] for h in handles]
    assert "ctx.sleep takes seconds or a timedelta" in errors[0]
    assert "signal token must not be empty" in errors[1]
    with pytest.raises(TypeError, match="JSON-serialisable"):
        engine.signal("t", object())


def test_a_start_inside_a_step_function_is_a_plain_start(engine: Engine):
    engine.register("leaf", "1", lambda ctx, i: i)

    def body(ctx, input):
        run_id = ctx.step("start", lambda: engine.start("leaf", 1).run_id)
        return ctx.step("after", lambda: run_id)

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    leaf = engine.get_run(handle.result())
    assert leaf.parent_id is None and leaf.output == 1
    force_status(engine, handle.run_id, RunStatus.PENDING)  # a replay reaches the same calls
    run_until_idle(engine)
    assert handle.status == RunStatus.COMPLETED


def test_a_child_id_taken_by_a_run_of_another_parent_fails_the_run(engine: Engine):
    engine.register("leaf", "1", lambda ctx, i: i)
    engine.register("wf", "1", lambda ctx, i: ctx.child("leaf", 1, child_id="not-mine"))
    engine.start("leaf", 1, "not-mine")
    handle = engine.start("wf", {})
    engine.execute(handle.run_id)
    assert "is not a child of" in engine.get_run(handle.run_id).error["message"]


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


def test_a_signal_timeout_may_be_a_timedelta(engine: Engine):
    def body(ctx, input):
        try:
            return ctx.wait_for_signal("t", timeout=datetime.timedelta(milliseconds=50))
        except SignalTimeout:
            return "timeout"

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    tick_until_settled(engine, handle.run_id)
    assert handle.result() == "timeout"
    assert engine.get_run(handle.run_id).wait is None
