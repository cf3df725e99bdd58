"""What the tick hands on: dead workers' runs, blocked runs, lost messages."""

from __future__ import annotations

from durable_django import (
    Engine,
    RunStatus,
)
from durable_django.testing import run_until_idle

from ..helpers import force_status
from ..ticking import later


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
