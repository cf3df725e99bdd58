"""Operator overrides: ``engine.set_limit`` / ``set_rate_limit`` (0 pauses), ``clear_limit``
/ ``clear_rate_limit``, stored and read under the key's lock by the next start of every
engine on the store, in place of the declared or per-start limit, on every start path,
ended by ``until`` on their own, never changing a run already admitted; bad input refused
with a clear error, storing nothing. Through the engine, on the ORM store (each test
database: every path it has) and the memory store."""

from __future__ import annotations

import datetime
import time

import pytest
from django.db import DatabaseError
from django.utils import timezone

from durable_django import (
    Concurrency,
    ConcurrencyLimitError,
    Engine,
    RateLimit,
    RateLimitError,
    RunStatus,
)
from durable_django.stores import OrmStore
from durable_django.testing import run_until_idle

from ..database_refusal import MESSAGE, refusing
from ..helpers import echo, force_status


def tenant(limit: int = 3) -> Concurrency:
    return Concurrency(key=lambda i: f"tenant:{i['tenant']}", limit=limit)


def per_minute(limit: int = 3) -> RateLimit:
    return RateLimit(key=lambda i: f"calls:{i['tenant']}", limit=limit, per=60)


@pytest.fixture
def chat(engine: Engine) -> Engine:
    engine.register("chat", "1", echo, concurrency=tenant(3), rate_limit=per_minute(100))
    return engine


def acme(n: int = 0) -> dict[str, object]:
    return {"tenant": "acme", "n": n}


def refused(engine: Engine, input: dict[str, object], **options: object) -> ConcurrencyLimitError:
    """The refusal of a start of ``chat``, which created nothing."""
    before = engine.count_runs()
    with pytest.raises(ConcurrencyLimitError) as caught:
        engine.start("chat", input, **options)  # type: ignore[arg-type]
    assert engine.count_runs() == before
    return caught.value


def test_a_lower_limit_refuses_the_next_start_and_keeps_the_admitted_runs(chat):
    first, second = chat.start("chat", acme(1)), chat.start("chat", acme(2))
    override = chat.set_limit("tenant:acme", 1)
    assert (override.key, override.kind, override.limit, override.until) == (
        "tenant:acme",
        "concurrency",
        1,
        None,
    )
    error = refused(chat, acme(3))
    assert (error.key, error.limit, error.active) == ("tenant:acme", 1, 2)
    # The runs admitted before keep their place, and run.
    run_until_idle(chat)
    assert {chat.get_run(r.run_id).status for r in (first, second)} == {RunStatus.COMPLETED}
    assert chat.start("chat", acme(4)).created  # 0 active: 1 fits under the override
    assert refused(chat, acme(5)).limit == 1
    assert chat.clear_limit("tenant:acme") is True
    assert chat.clear_limit("tenant:acme") is False
    assert chat.start("chat", acme(6)).created  # the declared limit, 3, again
    assert chat.start("chat", acme(7)).created
    assert refused(chat, acme(8)).limit == 3


def test_a_higher_limit_admits_more_than_declared_and_other_keys_keep_theirs(chat):
    chat.set_limit("tenant:acme", 5)
    for n in range(5):
        chat.start("chat", acme(n))
    assert refused(chat, acme(5)).limit == 5
    globex = {"tenant": "globex"}
    for n in range(3):
        chat.start("chat", {**globex, "n": n})
    assert refused(chat, {**globex, "n": 3}).limit == 3


def test_a_pause_refuses_every_start_of_the_key(chat):
    chat.set_limit("tenant:acme", 0)
    assert refused(chat, acme()).limit == 0
    chat.set_limit("tenant:acme", 2)  # set again: replaces the pause
    assert chat.start("chat", acme(1)).created
    assert [(o.key, o.limit) for o in chat.overrides()] == [("tenant:acme", 2)]


def test_a_rate_override_replaces_the_window_limit_and_zero_pauses_it(chat):
    for n in range(3):
        chat.start("chat", acme(n))
    for run in chat.list_runs():  # the concurrency quota is free; the window is not
        force_status(chat, run.run_id, RunStatus.COMPLETED)
    chat.set_rate_limit("calls:acme", 3)
    error = refused(chat, acme(3))
    assert isinstance(error, RateLimitError)
    assert (error.key, error.limit, error.active, error.per) == ("calls:acme", 3, 3, 60.0)
    assert 0 < error.retry_after <= 60
    chat.set_rate_limit("calls:acme", 0)
    assert refused(chat, {"tenant": "acme", "n": 9}).limit == 0
    assert chat.clear_rate_limit("calls:acme")
    assert chat.start("chat", acme(4)).created


def test_an_override_replaces_a_per_start_limit_too(chat):
    chat.set_limit("tenant:acme", 1)
    options = {"concurrency": Concurrency(key="tenant:acme", limit=10)}
    assert chat.start("chat", acme(1), **options).created
    assert refused(chat, acme(2), **options).limit == 1


def test_a_batch_obeys_the_override_in_order(chat):
    chat.set_limit("tenant:acme", 2)
    batch = chat.start_many("chat", [acme(n) for n in range(4)])
    assert len(batch.started) == 2
    assert [(i, e.limit, e.active) for i, e in batch.refused] == [(2, 2, 2), (3, 2, 2)]


def test_a_retry_obeys_the_override(chat):
    handle = chat.start("chat", acme(1))
    force_status(chat, handle.run_id, RunStatus.FAILED)
    chat.start("chat", acme(2))
    chat.set_limit("tenant:acme", 1)
    with pytest.raises(ConcurrencyLimitError) as caught:
        chat.retry(handle.run_id)
    assert caught.value.limit == 1
    assert chat.get_run(handle.run_id).status == RunStatus.FAILED


def test_until_ends_the_override_by_itself(chat):
    until = timezone.now() + datetime.timedelta(seconds=1)
    override = chat.set_limit("tenant:acme", 0, until=until)
    assert override.until == until
    assert refused(chat, acme()).limit == 0
    assert [o.until for o in chat.overrides("tenant:acme")] == [until]
    time.sleep(max((until - timezone.now()).total_seconds(), 0) + 0.05)
    assert chat.start("chat", acme()).created  # the declared limit again
    assert chat.overrides() == []


def test_every_engine_on_the_store_obeys_it(orm_engine, registry):
    orm_engine.register("chat", "1", echo, concurrency=tenant(3))
    other = Engine(store=OrmStore(), registry=registry, enqueue=False)
    other.set_limit("tenant:acme", 0)
    assert refused(orm_engine, acme()).limit == 0
    assert [o.key for o in orm_engine.overrides()] == ["tenant:acme"]
    assert orm_engine.clear_limit("tenant:acme")
    assert other.overrides() == []


@pytest.mark.parametrize(
    ("key", "limit", "until", "error", "message"),
    [
        ("", 1, None, ValueError, "key must not be empty"),
        ("k", -1, None, ValueError, "between 0 and"),
        ("k", True, None, TypeError, "must be an int"),
        ("k", "3", None, TypeError, "must be an int"),
        ("k", 1, "tomorrow", TypeError, "until must be a datetime"),
        ("k", 1, datetime.datetime(2999, 1, 1), ValueError, "aware datetime"),
        ("k", 1, datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC), ValueError, "future"),
    ],
)
def test_bad_input_is_refused_and_stores_nothing(chat, key, limit, until, error, message):
    for setter in (chat.set_limit, chat.set_rate_limit):
        with pytest.raises(error, match=message):
            setter(key, limit, until=until)
    assert chat.overrides() == []


def test_a_paused_keys_refusal_says_when_the_pause_ends(chat, clock):
    chat.start("chat", acme(1))
    chat.set_limit("tenant:acme", 0, until=timezone.now() + datetime.timedelta(minutes=10))
    error = refused(chat, acme(2))
    assert (error.estimate.basis, error.retry_after) == ("paused", 600.0)
    clock.advance(240)
    assert refused(chat, acme(3)).retry_after == 360.0
    chat.set_limit("tenant:acme", 0)  # for good: nothing says when
    error = refused(chat, acme(4))
    assert (error.estimate.basis, error.retry_after) == ("paused", 1.0)


def test_an_override_the_database_refuses_changes_nothing(orm_engine, transactional_db):
    """A refused write of an override raises the database's error to the operator, and
    the limit in force stays what it was: the stored override, then the declared one."""
    orm_engine.register("chat", "1", echo, concurrency=tenant(3))
    orm_engine.set_limit("tenant:acme", 1)
    # A new override is an INSERT; a changed one an UPDATE of its row.
    for event, key, limit in (("INSERT", "tenant:globex", 0), ("UPDATE", "tenant:acme", 5)):
        with (
            refusing("durable_quota_override", event, "1 = 1"),
            pytest.raises(DatabaseError, match=MESSAGE),
        ):
            orm_engine.set_limit(key, limit)
    assert [(o.key, o.limit) for o in orm_engine.overrides()] == [("tenant:acme", 1)]
    assert orm_engine.start("chat", acme(1)).created
    assert refused(orm_engine, acme(2)).limit == 1
    assert orm_engine.start("chat", {"tenant": "globex"}).created  # its pause never stored
