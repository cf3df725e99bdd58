"""Replays: a body that reaches another durable call, bad durable call arguments."""

from __future__ import annotations

import pytest

from durable_django import (
    Engine,
    RunStatus,
)
from durable_django.testing import run_until_idle

from ..helpers import force_status


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
