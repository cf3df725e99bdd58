"""``ctx.settle(key, units)``: a run's rate limit weight replaced by what it really used,
effective at once for the next start under the key, recorded once, refused with a clear
error for a key the run has no rate limit of or units no weight may have; through the
engine, on the ORM store (each test database) and the memory store, with a driven clock."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections

from durable_django import Engine, RateLimit, RateLimitError, RunStatus
from durable_django.models import Run
from durable_django.testing import run_until_idle

from ..helpers import force_status

LIMIT = 100


def tokens() -> RateLimit:
    """The tokens per minute of the run's tenant, each start reserving its ``max_tokens``."""
    return RateLimit(
        key=lambda i: f"tokens:{i['tenant']}", limit=LIMIT, per=60, weight=lambda i: i["max"]
    )


def chat_turn(ctx: Any, input: dict[str, Any]) -> int:
    """Reserve ``max`` tokens at the start, call the model, settle what it used, then
    sleep (``nap``) or go on to a step that may fail (``then_fail``)."""
    used = ctx.step("call the model", lambda: input["used"])
    ctx.settle(f"tokens:{input['tenant']}", used)
    if input.get("nap"):
        ctx.sleep(30)
    ctx.step("after", lambda: input.get("then_fail") and 1 / 0)
    return int(used)


@pytest.fixture
def chat(engine: Engine, clock: Any) -> Engine:
    engine.register("chat", "1", chat_turn, rate_limit=tokens())
    return engine


def turn(tenant: str = "acme", max: int = 80, used: int = 30, **more: Any) -> dict[str, Any]:
    return {"tenant": tenant, "max": max, "used": used, **more}


def refusal(engine: Engine, input: dict[str, Any]) -> RateLimitError:
    with pytest.raises(RateLimitError) as caught:
        engine.start("chat", input)
    return caught.value


def weight(engine: Engine, run_id: str, key: str = "tokens:acme") -> int:
    """The run's weight on rate limit ``key``, as the store reads it."""
    run = engine.get_run(run_id)
    assert f"rate:{key}" in run.tags
    return run.weights.get(f"rate:{key}", 1)


def settles(engine: Engine, run_id: str) -> list[Any]:
    return [s.result for s in engine.store.get_steps(run_id) if s.name == "durable.settle"]


def test_a_run_that_settles_lower_lets_the_next_start_in_at_once(chat, clock):
    first = chat.start("chat", turn(max=80, used=30, nap=True))
    assert refusal(chat, turn(max=80)).active == 80  # reserved: 80 + 80 > 100
    run_until_idle(chat)
    assert chat.get_run(first.run_id).status == RunStatus.SUSPENDED  # still in flight
    assert weight(chat, first.run_id) == 30
    assert settles(chat, first.run_id) == [{"key": "tokens:acme", "units": 30}]
    clock.advance(10)
    error = refusal(chat, turn(max=71))  # 30 settled + 71 > 100
    assert (error.active, error.retry_after) == (30, 50.0)  # the settled units leave at 60
    assert chat.start("chat", turn(max=70)).created  # 30 + 70 fit
    # Another tenant's window is its own.
    assert chat.start("chat", turn(tenant="globex", max=100)).created


def test_settling_zero_frees_the_units(chat, clock):
    first = chat.start("chat", turn(max=LIMIT, used=0))
    assert refusal(chat, turn(max=1)).active == LIMIT
    run_until_idle(chat)
    assert chat.get_run(first.run_id).status == RunStatus.COMPLETED
    assert weight(chat, first.run_id) == 0
    assert chat.start("chat", turn(max=LIMIT)).created


def test_settling_more_than_reserved_holds_the_window_over_its_limit(chat, clock):
    first = chat.start("chat", turn(max=20, used=130))
    run_until_idle(chat)
    assert chat.get_run(first.run_id).output == 130
    clock.advance(15)
    error = refusal(chat, turn(max=1))
    # The window holds what was used; the exact retry_after reads the settled weight.
    assert (error.active, error.limit, error.retry_after) == (130, LIMIT, 45.0)
    clock.advance(45)
    assert chat.start("chat", turn(max=LIMIT)).created


def test_a_replay_does_not_settle_again(chat, clock):
    first = chat.start("chat", turn(max=80, used=30, nap=True))
    run_until_idle(chat)
    # Moved between the turns: a settle made again on replay would put 30 back.
    assert chat.store.settle_units(first.run_id, "rate:tokens:acme", 7)
    clock.advance(30)
    force_status(chat, first.run_id, RunStatus.PENDING)
    run_until_idle(chat)
    run = chat.get_run(first.run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, 30)
    assert weight(chat, first.run_id) == 7
    assert settles(chat, first.run_id) == [{"key": "tokens:acme", "units": 30}]


def test_a_retried_run_reserves_again_and_does_not_settle_again(chat, clock):
    first = chat.start("chat", turn(max=60, used=30, then_fail=True))
    run_until_idle(chat)
    assert chat.get_run(first.run_id).status == RunStatus.FAILED
    assert weight(chat, first.run_id) == 30
    # A retry is a start: its rate limit reserves the weight again, on the run's tag.
    chat.retry(first.run_id)
    assert weight(chat, first.run_id) == 60
    run_until_idle(chat)
    # The settle's record was kept, as a step's result is: the replay settled nothing.
    assert chat.get_run(first.run_id).status == RunStatus.FAILED  # the last step, again
    assert weight(chat, first.run_id) == 60
    assert settles(chat, first.run_id) == [{"key": "tokens:acme", "units": 30}]


def test_a_replay_settling_other_units_is_a_non_determinism_error(engine, clock):
    units = iter([5, 6])

    def body(ctx, input):
        ctx.settle("k", next(units))
        ctx.sleep(30)

    engine.register("wf", "1", body, rate_limit=RateLimit(key=lambda i: "k", limit=9, per=60))
    handle = engine.start("wf", {})
    run_until_idle(engine)
    clock.advance(30)
    force_status(engine, handle.run_id, RunStatus.PENDING)
    run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "durable_django.errors.NonDeterminismError"
    assert (
        "recorded as ctx.settle('k', 5) but the body now calls ctx.settle('k', 6)"
        in (run.error["message"])
    )
    assert weight(engine, handle.run_id, "k") == 5


def failed_with(engine: Engine, body: Any, **options: Any) -> dict[str, Any]:
    """The error of a run of ``body`` (workflow ``wf``), which failed."""
    engine.register("wf", "1", body, **options)
    handle = engine.start("wf", {})
    run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED
    assert engine.store.get_steps(handle.run_id) == []  # nothing recorded
    return dict(run.error)


def test_settling_a_key_the_run_has_no_rate_limit_of_is_refused(engine):
    rate_limits = [
        RateLimit(key=lambda i: "b", limit=9, per=60),
        RateLimit(key=lambda i: "a", limit=9, per=60),
    ]
    error = failed_with(engine, lambda ctx, i: ctx.settle("tokens:x", 1), rate_limit=rate_limits)
    assert error["type"] == "builtins.ValueError"
    assert error["message"] == (
        f"ctx.settle: run {error_run(engine)!r} has no rate limit of key 'tokens:x'; "
        f"its rate limit keys are ['a', 'b']"
    )


def test_settling_in_a_run_of_no_rate_limit_is_refused(engine):
    error = failed_with(engine, lambda ctx, i: ctx.settle("k", 1))
    assert error["type"] == "builtins.ValueError"
    assert error["message"].endswith("has no rate limit of key 'k'; it started under no rate limit")


@pytest.mark.parametrize(
    ("key", "units", "kind", "message"),
    [
        ("k", -1, "builtins.ValueError", "units must be between 0 and 2147483647, not -1"),
        (
            "k",
            2**31,
            "builtins.ValueError",
            "units must be between 0 and 2147483647, not 2147483648",
        ),
        ("k", True, "builtins.TypeError", "units must be an int, not bool True"),
        ("k", 1.5, "builtins.TypeError", "units must be an int, not float 1.5"),
        ("k", "3", "builtins.TypeError", "units must be an int, not str '3'"),
        (3, 1, "builtins.TypeError", "key must be a str, not int 3"),
    ],
)
def test_bad_units_and_keys_are_refused(engine, key, units, kind, message):
    error = failed_with(
        engine,
        lambda ctx, i: ctx.settle(key, units),
        rate_limit=RateLimit(key=lambda i: "k", limit=9, per=60),
    )
    assert (error["type"], error["message"]) == (kind, f"ctx.settle {message}")
    assert weight(engine, error_run(engine), "k") == 1


def error_run(engine: Engine) -> str:
    """The id of the one run of ``engine``."""
    (run,) = engine.list_runs()
    return run.run_id


@pytest.mark.django_db(transaction=True)
def test_a_settle_after_the_lease_was_lost_settles_nothing(orm_engine):
    """The settle's update and its record commit together under the holder's check: a
    worker whose run was handed on meanwhile settles nothing and stops."""

    def take_the_lease(run_id: str) -> None:
        def take() -> None:
            try:
                Run.objects.filter(pk=run_id).update(lease_owner="another worker")
            finally:
                connections.close_all()

        thread = threading.Thread(target=take)
        thread.start()
        thread.join()

    def body(ctx, input):
        ctx.step("stall", take_the_lease, ctx.run_id)
        ctx.settle("k", 0)

    orm_engine.register("wf", "1", body, rate_limit=RateLimit(key=lambda i: "k", limit=9, per=60))
    handle = orm_engine.start("wf", {})
    orm_engine.execute(handle.run_id)
    run = orm_engine.get_run(handle.run_id)
    assert (run.status, run.lease_owner) == (RunStatus.RUNNING, "another worker")
    assert weight(orm_engine, handle.run_id, "k") == 1
    assert "durable.settle" not in [s.name for s in orm_engine.store.get_steps(handle.run_id)]


@pytest.mark.django_db(transaction=True)
def test_a_settle_commits_with_its_record(orm_engine):
    """Real commits (on PostgreSQL the record and the COMMIT go together): the weight and
    the record are both there once the turn ended."""

    def body(ctx, input):
        used = ctx.step("call the model", lambda: 3)
        ctx.settle("k", used)
        return used

    orm_engine.register("wf", "1", body, rate_limit=RateLimit(key=lambda i: "k", limit=9, per=60))
    handle = orm_engine.start("wf", {})
    assert orm_engine.execute(handle.run_id)
    assert orm_engine.get_run(handle.run_id).status == RunStatus.COMPLETED
    assert weight(orm_engine, handle.run_id, "k") == 3
    assert [(s.name, s.result) for s in orm_engine.store.get_steps(handle.run_id)] == [
        ("call the model", 3),
        ("durable.settle", {"key": "k", "units": 3}),
    ]
