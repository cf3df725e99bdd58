"""A rate limit key's window as ``engine.rate_usage`` shows it: the units its runs used in
the last ``per`` seconds whatever became of them, the limit and ``per`` its workflows
declare, and when a start of weight 1 next fits; on the ORM store (each test database)
and the memory store, with a driven clock. ``durable quota`` shows the same windows."""

from __future__ import annotations

import io
import json

from django.core.management import call_command

from durable_django import Engine, RateLimit, RunStatus
from durable_django import engine as default_engine

from ..helpers import echo, force_status


def register_chat(engine: Engine) -> None:
    """``chat``: 3 units per minute per tenant, a run's weight its ``n``."""
    engine.register(
        "chat",
        "1",
        echo,
        rate_limit=RateLimit(
            key=lambda i: f"tenant:{i['t']}", limit=3, per=60, weight=lambda i: i.get("n", 1)
        ),
    )


def test_a_busy_key_shows_its_window_and_when_the_next_unit_frees(engine, clock):
    register_chat(engine)
    clock.to(0)
    first = engine.start("chat", {"t": "acme", "n": 2})
    force_status(engine, first.run_id, RunStatus.COMPLETED)  # still counted
    clock.to(10)
    engine.start("chat", {"t": "acme"})
    engine.start("chat", {"t": "globex"})
    clock.to(25)
    acme, globex = engine.rate_usage()  # busiest first
    assert (acme.key, acme.used, acme.limit, acme.per) == ("tenant:acme", 3, 3, 60.0)
    assert (acme.workflows, acme.full, acme.tag) == (("chat",), True, "rate:tenant:acme")
    assert acme.retry_after == 35.0  # the run of second 0 leaves the window at second 60
    assert (acme.limit_computed, acme.limit_error) == (False, None)
    assert (globex.key, globex.used, globex.full, globex.retry_after) == (
        "tenant:globex",
        1,
        False,
        0.0,
    )
    assert [u.key for u in engine.rate_usage("tenant:globex")] == ["tenant:globex"]


def test_the_window_boundary(engine, clock):
    register_chat(engine)
    clock.to(0)
    engine.start("chat", {"t": "acme", "n": 3})
    clock.to(60 - 0.000001)
    (acme,) = engine.rate_usage()
    assert (acme.used, acme.full, acme.retry_after) == (3, True, 0.000001)
    clock.to(60)  # created at second 0: out of the window exactly a minute later
    assert engine.rate_usage() == []
    (idle,) = engine.rate_usage("tenant:acme")
    assert (idle.used, idle.limit, idle.per, idle.full, idle.retry_after) == (
        0,
        3,
        60.0,
        False,
        0.0,
    )
    assert idle.workflows == ("chat",)  # from the key's latest runs


def test_an_unknown_key_a_failing_limit_function_and_a_per_start_key(engine, clock):
    plans = {"tenant:acme": 5}
    engine.register(
        "planned",
        "1",
        echo,
        rate_limit=RateLimit(key=lambda i: i["key"], limit=lambda key: plans[key], per=30),
    )
    engine.start("planned", {"key": "tenant:acme"})
    plans["tenant:gone"] = 1
    engine.start("planned", {"key": "tenant:gone"})
    del plans["tenant:gone"]  # the tenant left: its limit function now raises
    by_key = {u.key: u for u in engine.rate_usage()}
    acme, gone = by_key["tenant:acme"], by_key["tenant:gone"]
    assert (acme.used, acme.limit, acme.per, acme.limit_computed) == (1, 5, 30.0, True)
    assert (gone.used, gone.limit, gone.per, gone.retry_after) == (1, None, None, None)
    assert gone.limit_error == "KeyError: 'tenant:gone'"
    # A key no run ever used: nothing tells which workflows use it.
    (nobody,) = engine.rate_usage("tenant:nobody")
    assert (nobody.used, nobody.limit, nobody.workflows, nobody.full) == (0, None, (), False)
    # A per-start rate limit's key is seen while the declared windows hold it; its limit
    # is not known here.
    adhoc = {"key": "adhoc", "limit": 9, "per": 5}
    engine.start("planned", {"key": "tenant:acme"}, rate_limit=adhoc)
    by_key = {u.key: u for u in engine.rate_usage()}
    assert set(by_key) == {"tenant:acme", "tenant:gone", "adhoc"}
    assert (by_key["adhoc"].used, by_key["adhoc"].limit, by_key["adhoc"].limit_error) == (
        1,
        None,
        None,
    )
    assert by_key["tenant:acme"].used == 1  # the per-start rate limit replaced the declared


# manage.py durable quota ---------------------------------------------------------------


def durable_quota(*args: str) -> str:
    out = io.StringIO()
    call_command("durable", "quota", *args, stdout=out)
    return out.getvalue()


def test_the_command_shows_the_rate_windows_after_the_quotas(db, clock):
    plans = {"tenant:acme": 3}
    definition = default_engine.register(
        "tests.rated",
        "1",
        echo,
        rate_limit=RateLimit(key=lambda i: i["key"], limit=lambda key: plans[key], per=60),
    )
    try:
        clock.to(0)
        default_engine.start("tests.rated", {"key": "tenant:acme"})
        default_engine.start("tests.echo", {"key": "tenant:acme"})  # a concurrency quota
        clock.to(10)
        default_engine.start("tests.rated", {"key": "tenant:acme"})
        default_engine.start("tests.rated", {"key": "tenant:acme"})
        plans["tenant:gone"] = 1
        default_engine.start("tests.rated", {"key": "tenant:gone"})
        del plans["tenant:gone"]
        clock.to(25)
        table = durable_quota()
        one = durable_quota("tenant:acme")
        as_json = json.loads(durable_quota("tenant:acme", "--json"))
        clock.to(65)  # the run of second 0 left the window: one unit free
        later = durable_quota("tenant:acme")
        clock.to(200)
        idle = durable_quota()
    finally:
        default_engine.registry.remove(definition.name)
    assert table == (
        "KEY          ACTIVE  LIMIT  USE                WORKFLOWS\n"
        "tenant:acme       1      3  [###-------]  33%  tests.echo\n"
        "\n"
        "RATE KEY     USED  LIMIT  PER  USE                NEXT UNIT  WORKFLOWS\n"
        "tenant:acme     3     3*  60s  [##########] full  in 35.0s   tests.rated\n"
        "tenant:gone     1      !    -  -                  -          tests.rated\n"
        "\n"
        "* computed per key (the workflow's limit function, called with the key)\n"
        "! rate tenant:gone: limit function failed: KeyError: 'tenant:gone'\n"
    )
    assert one.splitlines()[3:5] == [
        "RATE KEY     USED  LIMIT  PER  USE                NEXT UNIT  WORKFLOWS",
        "tenant:acme     3     3*  60s  [##########] full  in 35.0s   tests.rated",
    ]
    assert as_json[1] == {
        "kind": "rate",
        "key": "tenant:acme",
        "tag": "rate:tenant:acme",
        "used": 3,
        "limit": 3,
        "override": None,
        "limit_in_force": 3,
        "per": 60.0,
        "full": True,
        "retry_after": 35.0,
        "workflows": ["tests.rated"],
        "limit_computed": True,
        "limit_error": None,
    }
    assert as_json[0]["kind"] == "concurrency" and len(as_json) == 2
    assert "tenant:acme     2     3*  60s  [#######---]  67%  free       tests.rated" in later
    assert idle.splitlines()[-1] == "tenant:acme       1      3  [###-------]  33%  tests.echo"
