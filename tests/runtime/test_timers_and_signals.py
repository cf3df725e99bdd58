"""Timers and signals in-process: sleep, wait_for_signal, their timeouts."""

from __future__ import annotations

import datetime

import pytest

from durable_django import (
    ConcurrencyLimitError,
    Engine,
    RunStatus,
)
from durable_django._runtime.execution import SignalTimeout
from durable_django.testing import run_until_idle

from ..ticking import tick_until_settled


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
