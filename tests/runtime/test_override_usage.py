"""Quota and rate usage with operators' overrides: each key's record carries the override
in force and the limit in force (``full`` and a rate key's ``retry_after`` against it),
and a key with an override is listed even when nothing holds it. On the ORM store (each
test database) and the memory store, with a driven clock."""

from __future__ import annotations

import datetime

from django.utils import timezone

from durable_django import Concurrency, Engine, RateLimit, RunStatus

from ..helpers import echo, force_status


def register_chat(engine: Engine) -> None:
    """``chat``: 3 active runs per tenant, and 5 starts per minute per tenant."""
    engine.register(
        "chat",
        "1",
        echo,
        concurrency=Concurrency(key=lambda i: f"tenant:{i['t']}", limit=3),
        rate_limit=RateLimit(key=lambda i: f"calls:{i['t']}", limit=5, per=60),
    )


def test_a_busy_key_shows_its_override_and_is_full_under_it(engine: Engine, clock):
    register_chat(engine)
    engine.start("chat", {"t": "acme"})
    engine.start("chat", {"t": "acme"})
    (acme,) = engine.quota_usage()
    assert (acme.override, acme.limit_in_force, acme.full) == (None, 3, False)

    until = timezone.now() + datetime.timedelta(hours=1)
    engine.set_limit("tenant:acme", 2, until=until)
    (acme,) = engine.quota_usage()
    assert (acme.active, acme.limit, acme.limit_in_force, acme.full) == (2, 3, 2, True)
    assert acme.override is not None
    assert (acme.override.key, acme.override.limit) == ("tenant:acme", 2)
    assert acme.override.until == until
    assert engine.quota_usage("tenant:acme") == [acme]

    engine.set_limit("tenant:acme", 10)  # higher than declared: room again
    (acme,) = engine.quota_usage()
    assert (acme.limit, acme.limit_in_force, acme.full) == (3, 10, False)


def test_a_paused_key_with_nothing_active_is_listed(engine: Engine, clock):
    register_chat(engine)
    assert engine.quota_usage() == []
    engine.set_limit("tenant:quiet", 0)
    engine.set_limit("tenant:calm", 4)
    engine.start("chat", {"t": "acme"})
    usage = engine.quota_usage()
    assert [u.key for u in usage] == ["tenant:acme", "tenant:calm", "tenant:quiet"]
    quiet = usage[2]
    assert (quiet.active, quiet.limit, quiet.limit_in_force, quiet.full) == (0, None, 0, True)
    assert quiet.override is not None and quiet.override.paused
    assert (usage[1].limit_in_force, usage[1].full) == (4, False)
    assert usage[0].override is None
    # Cleared: an idle key without an override is not listed any more.
    engine.clear_limit("tenant:quiet")
    assert [u.key for u in engine.quota_usage()] == ["tenant:acme", "tenant:calm"]


def test_an_override_that_ended_is_not_shown(engine: Engine, clock):
    register_chat(engine)
    clock.to(0)
    engine.start("chat", {"t": "acme"})
    engine.set_limit("tenant:acme", 0, until=clock() + datetime.timedelta(seconds=30))
    engine.set_limit("tenant:idle", 0, until=clock() + datetime.timedelta(seconds=30))
    assert [(u.key, u.full) for u in engine.quota_usage()] == [
        ("tenant:acme", True),
        ("tenant:idle", True),
    ]
    clock.to(30)
    (acme,) = engine.quota_usage()
    assert (acme.key, acme.override, acme.limit_in_force, acme.full) == (
        "tenant:acme",
        None,
        3,
        False,
    )


def test_a_rate_key_is_full_and_waits_under_its_override(engine: Engine, clock):
    register_chat(engine)
    clock.to(0)
    first = engine.start("chat", {"t": "acme"})
    force_status(engine, first.run_id, RunStatus.COMPLETED)  # still in the window
    clock.to(10)
    engine.start("chat", {"t": "acme"})
    clock.to(20)
    (calls,) = engine.rate_usage()
    assert (calls.used, calls.limit, calls.limit_in_force, calls.full) == (2, 5, 5, False)
    assert (calls.override, calls.retry_after) == (None, 0.0)

    engine.set_rate_limit("calls:acme", 2)
    (calls,) = engine.rate_usage()
    assert (calls.used, calls.limit, calls.limit_in_force, calls.full) == (2, 5, 2, True)
    assert calls.override is not None and calls.override.kind == "rate"
    assert calls.retry_after == 40.0  # the run of second 0 leaves the window at second 60

    engine.set_rate_limit("calls:acme", 3)
    (calls,) = engine.rate_usage()
    assert (calls.full, calls.retry_after) == (False, 0.0)


def test_a_rate_key_with_an_override_and_an_empty_window_is_listed(engine: Engine, clock):
    register_chat(engine)
    assert engine.rate_usage() == []
    engine.set_rate_limit("calls:quiet", 0)
    (quiet,) = engine.rate_usage()
    assert (quiet.key, quiet.used, quiet.limit, quiet.per) == ("calls:quiet", 0, None, None)
    assert (quiet.limit_in_force, quiet.full, quiet.retry_after) == (0, True, None)
    # A concurrency key's override is not a rate key's, nor the other way round.
    assert engine.quota_usage() == []
    (one,) = engine.rate_usage("calls:quiet")
    assert one.override == quiet.override
    assert engine.rate_usage("calls:other")[0].override is None
