"""Children in-process: a child suspends its parent, fails it, is refused."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from durable_django import (
    BaseWorkflow,
    ChildWorkflowError,
    ConcurrencyLimitError,
    Engine,
    RunNotFound,
    RunStatus,
    workflow,
)
from durable_django.testing import run_until_idle

from ..helpers import force_status


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
