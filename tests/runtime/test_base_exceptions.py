"""User code raising what is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``,
``GeneratorExit``, any ``BaseException``) fails its step or its run like any other error,
in-process; the engine's own control flow and a worker's shutdown pass on. The same with
real Celery workers is in tests/processes/test_base_exceptions_worker.py."""

from __future__ import annotations

import datetime
import sys
import uuid
from typing import Any

import pytest
from celery.exceptions import WorkerShutdown, WorkerTerminate

from durable_django import Concurrency, ConcurrencyLimitError, Engine, RunStatus
from durable_django.models import Schedule, Signal
from durable_django.testing import run_until_idle


class Unusual(BaseException):
    """A ``BaseException`` of the user's own."""


def one_slot() -> Concurrency:
    return Concurrency(key=lambda input: "the-key", limit=1)


def assert_failed_and_slot_freed(engine: Engine, run_id: str, kind: str) -> dict[str, Any]:
    """The run ended ``failed`` with ``kind`` as its error's type, and a second start on
    its key is admitted (the key's one slot is free again)."""
    run = engine.get_run(run_id)
    assert run.status == RunStatus.FAILED, run.error
    assert run.error["type"] == kind
    assert not run.lease_owner
    engine.start(run.workflow, {})
    with pytest.raises(ConcurrencyLimitError):
        engine.start(run.workflow, {})  # the slot the second start took is held
    return run.error


@pytest.mark.parametrize(
    ("raised", "kind", "message"),
    [
        (SystemExit(3), "builtins.SystemExit", "3"),
        (KeyboardInterrupt(), "builtins.KeyboardInterrupt", ""),
        (GeneratorExit("closed"), "builtins.GeneratorExit", "closed"),
        (Unusual("odd"), f"{__name__}.Unusual", "odd"),
    ],
)
def test_a_body_raising_a_base_exception_fails_the_run(
    engine: Engine, raised: BaseException, kind: str, message: str
):
    def body(ctx, input):
        raise raised

    engine.register("wf", "1", body, concurrency=one_slot())
    handle = engine.start("wf", {})
    assert run_until_idle(engine) == 1
    error = assert_failed_and_slot_freed(engine, handle.run_id, kind)
    assert error["message"] == message
    assert f"{kind.rsplit('.', 1)[-1]}" in error["traceback"]


def test_a_body_calling_sys_exit_fails_the_run(engine: Engine):
    def body(ctx, input):
        sys.exit(3)

    engine.register("wf", "1", body, concurrency=one_slot())
    handle = engine.start("wf", {})
    assert run_until_idle(engine) == 1
    error = assert_failed_and_slot_freed(engine, handle.run_id, "builtins.SystemExit")
    assert error["message"] == "3"


def test_a_step_calling_sys_exit_fails_the_step_and_the_run(engine: Engine):
    def body(ctx, input):
        ctx.step("exit", sys.exit)
        return "not reached"

    engine.register("wf", "1", body, concurrency=one_slot())
    handle = engine.start("wf", {})
    assert run_until_idle(engine) == 1
    error = assert_failed_and_slot_freed(engine, handle.run_id, "builtins.SystemExit")
    assert error["step"] == "exit"
    [step] = engine.store.get_steps(handle.run_id)
    assert step.error["type"] == "builtins.SystemExit" and step.result is None


def test_a_body_may_catch_the_step_error_of_a_step_that_exited(engine: Engine):
    from durable_django import StepError

    def body(ctx, input):
        try:
            ctx.step("exit", sys.exit, "bye")
        except StepError as error:
            return error.error["type"]

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    assert handle.result() == "builtins.SystemExit"


def test_a_step_raising_system_exit_is_retried_then_fails(engine: Engine):
    calls = []

    def leave() -> None:
        calls.append(1)
        sys.exit(f"attempt {len(calls)}")

    def body(ctx, input):
        return ctx.step("leave", leave, retries=1, backoff=0)

    engine.register("wf", "1", body, concurrency=one_slot())
    handle = engine.start("wf", {})
    assert run_until_idle(engine) == 1
    run = engine.get_run(handle.run_id)
    assert (run.status, run.wait) == (RunStatus.SUSPENDED, {"retry": "leave"})
    [step] = engine.store.get_steps(handle.run_id)
    assert step.error["type"] == "builtins.SystemExit" and step.error["attempts"] == 1

    assert engine.wake(handle.run_id)
    assert run_until_idle(engine) == 1
    error = assert_failed_and_slot_freed(engine, handle.run_id, "builtins.SystemExit")
    assert (error["message"], error["attempts"]) == ("attempt 2", 2)
    assert len(calls) == 2


@pytest.mark.django_db(transaction=True)
def test_a_transactional_step_raising_keyboard_interrupt_rolls_back_and_fails(
    orm_engine: Engine,
):
    token = f"tx:{uuid.uuid4().hex}"

    def charge() -> None:
        Signal.objects.create(token=token)
        raise KeyboardInterrupt

    def body(ctx, input):
        return ctx.transaction("charge", charge)

    orm_engine.register("wf", "1", body, concurrency=one_slot())
    handle = orm_engine.start("wf", {})
    assert run_until_idle(orm_engine) == 1
    error = assert_failed_and_slot_freed(orm_engine, handle.run_id, "builtins.KeyboardInterrupt")
    assert error["step"] == "charge"
    assert not Signal.objects.filter(token=token).exists()
    [step] = orm_engine.store.get_steps(handle.run_id)
    assert step.error["type"] == "builtins.KeyboardInterrupt"


@pytest.mark.parametrize("shutdown", [WorkerShutdown(0), WorkerTerminate(1)])
def test_a_workers_shutdown_passes_the_step_and_leaves_the_run_to_its_lease(
    engine: Engine, shutdown: SystemExit
):
    """Celery raises these where its worker is stopping (a remote ``shutdown``, a hard
    shutdown of a solo worker): not the step's failure; the run keeps its lease, which
    lapses for the tick to hand it on."""

    def stop() -> None:
        raise shutdown

    def body(ctx, input):
        return ctx.step("stop", stop)

    engine.register("wf", "1", body)
    handle = engine.start("wf", {})
    with pytest.raises(type(shutdown)):
        run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.RUNNING and run.error is None
    assert engine.store.get_steps(handle.run_id) == []


def exit_two(input: Any) -> str:
    sys.exit(2)


def test_a_key_function_calling_sys_exit_refuses_the_start_and_creates_nothing(engine: Engine):
    engine.register("wf", "1", lambda ctx, input: input, concurrency=Concurrency(exit_two, 1))
    with pytest.raises(ValueError, match="the concurrency key function raised SystemExit: 2"):
        engine.start("wf", {})
    assert engine.list_runs() == []


def test_a_scheduled_start_whose_key_function_exits_is_skipped_and_the_tick_goes_on(
    orm_engine: Engine,
):
    orm_engine.register("exits", "1", lambda ctx, i: i, concurrency=Concurrency(exit_two, 1))
    orm_engine.register("wf", "1", lambda ctx, i: i)
    due = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
    exiting, good = (
        Schedule.objects.create(key=key, workflow=workflow, interval_seconds=60, next_due_at=due)
        for key, workflow in (("a-exits", "exits"), ("b-good", "wf"))
    )
    result = orm_engine.tick(now=due + datetime.timedelta(seconds=30))
    assert (result.fired, result.skipped_windows) == (1, 1)
    exiting.refresh_from_db()
    assert "the concurrency key function raised SystemExit: 2" in exiting.last_error
    good.refresh_from_db()
    assert orm_engine.get_run(good.last_run_id).workflow == "wf"


def test_an_event_subscriber_whose_key_function_exits_is_skipped_and_the_others_start(
    engine: Engine,
):
    engine.register("a-starts", "1", lambda ctx, i: i, on_event=["paid"])
    engine.register(
        "b-exits",
        "1",
        lambda ctx, i: i,
        on_event=["paid"],
        concurrency=[{"key": exit_two, "limit": 1}],
    )
    result = engine.publish_event("paid", {})
    [(workflow, error)] = result.skipped
    assert workflow == "b-exits" and "the concurrency key function raised SystemExit: 2" in str(
        error
    )
    assert [run.workflow for run in engine.list_runs()] == ["a-starts"]


def test_a_run_finished_receiver_calling_sys_exit_is_logged_and_the_turn_ends(
    memory_engine: Engine, caplog: pytest.LogCaptureFixture
):
    from durable_django.signals import run_finished

    received = []

    def leaves(sender: Any, **kwargs: Any) -> None:
        sys.exit(6)

    def after(sender: Any, run_id: str, **kwargs: Any) -> None:
        received.append(run_id)

    memory_engine.register("wf", "1", lambda ctx, input: "done")
    run_finished.connect(leaves)
    run_finished.connect(after)
    try:
        handle = memory_engine.start("wf", {})
        assert run_until_idle(memory_engine) == 1
    finally:
        run_finished.disconnect(leaves)
        run_finished.disconnect(after)
    assert handle.result() == "done"
    assert "raised SystemExit; the receivers after it were not called" in caplog.text
    assert received == []
