"""The limit quota usage shows for a key: declared by the workflows using it (their limit
function called with the key) or by a schedule, for busy and idle keys alike; a failing
limit function shown, not raised. ``engine.quota_usage`` and ``durable quota``."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from durable_django import Concurrency, Engine, RunStatus
from durable_django import engine as default_engine
from durable_django.models import Schedule

from ..helpers import echo, force_status


def usage_of(engine: Engine, key: str):
    (usage,) = engine.quota_usage(key)
    return usage


def test_an_idle_key_shows_the_limit_its_workflow_declares(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency={"key": lambda i: i["key"], "limit": 3})
    for status in (RunStatus.COMPLETED, RunStatus.FAILED):
        run = engine.start("chat.turn", {"key": "tenant:acme"})
        force_status(engine, run.run_id, status)
    acme = usage_of(engine, "tenant:acme")
    assert (acme.active, acme.limit, acme.workflows, acme.full) == (0, 3, ("chat.turn",), False)
    assert (acme.limit_computed, acme.limit_error) == (False, None)
    # A key no run ever used: nothing tells which workflows use it.
    nobody = usage_of(engine, "tenant:nobody")
    assert (nobody.limit, nobody.workflows) == (None, ())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_limit_function_is_called_with_the_key(engine: Engine, kind: str):
    plans = {"tenant:acme": 3, "tenant:globex": 1}

    def plan_limit(key):
        return plans[key]

    async def async_plan_limit(key):
        return plans[key]

    limit = plan_limit if kind == "sync" else async_plan_limit
    engine.register("chat.turn", "1", echo, concurrency={"key": lambda i: i["key"], "limit": limit})
    busy = engine.start("chat.turn", {"key": "tenant:acme"})
    idle = engine.start("chat.turn", {"key": "tenant:globex"})
    force_status(engine, idle.run_id, RunStatus.COMPLETED)

    (acme,) = engine.quota_usage()
    assert (acme.key, acme.active, acme.limit, acme.limit_computed) == ("tenant:acme", 1, 3, True)
    globex = usage_of(engine, "tenant:globex")
    assert (globex.active, globex.limit, globex.limit_computed) == (0, 1, True)
    assert busy.run_id


@pytest.mark.parametrize("kind", ["raises", "async raises", "not an int"])
def test_a_failing_limit_function_is_shown_not_raised(engine: Engine, kind: str):
    plans = {"tenant:acme": 2}

    def plan_limit(key):
        return plans[key] if kind != "not an int" or key in plans else "many"

    async def async_plan_limit(key):
        return plans[key]

    limit = async_plan_limit if kind == "async raises" else plan_limit
    engine.register("chat.turn", "1", echo, concurrency={"key": lambda i: i["key"], "limit": limit})
    engine.start("chat.turn", {"key": "tenant:acme"})
    del plans["tenant:acme"]  # the tenant's plan is gone

    (acme,) = engine.quota_usage()
    assert (acme.active, acme.limit, acme.limit_computed, acme.full) == (1, None, False, False)
    assert (
        acme.limit_error
        == {
            "raises": "KeyError: 'tenant:acme'",
            "async raises": "KeyError: 'tenant:acme'",
            "not an int": "TypeError: workflow 'chat.turn': the concurrency limit for key "
            "'tenant:acme' must be an int, not str 'many'",
        }[kind]
    )


def test_of_several_workflows_the_smallest_limit_and_any_failure(engine: Engine):
    plans = {"shared": 9}

    def failing(key):
        if key not in plans:
            raise LookupError("no plan")
        return plans[key]

    engine.register("a", "1", echo, concurrency={"key": lambda i: i["key"], "limit": 4})
    engine.register("b", "1", echo, concurrency={"key": lambda i: i["key"], "limit": lambda k: 2})
    engine.register("c", "1", echo, concurrency={"key": lambda i: i["key"], "limit": failing})
    for name in ("a", "b", "c"):
        engine.start(name, {"key": "shared"})
    plans.clear()
    (shared,) = engine.quota_usage()
    assert (shared.active, shared.limit, shared.limit_computed) == (3, 2, True)
    assert shared.full
    assert shared.limit_error == "LookupError: no plan"


def test_a_schedule_declares_the_limit_of_its_own_key(orm_engine: Engine):
    def digest_limit(key):
        raise LookupError(f"not a tenant key: {key}")

    orm_engine.register(
        "digest",
        "1",
        echo,
        concurrency={"key": lambda i: i["tenant"], "limit": digest_limit},
        schedule={
            "key": "acme-digest",
            "interval": 3600,
            "concurrency": {"key": "digest:acme", "limit": 1},
        },
    )
    # Declared in code, not yet synced to the table: never used, yet its limit is known.
    digest = usage_of(orm_engine, "digest:acme")
    assert (digest.active, digest.limit, digest.limit_error) == (0, 1, None)

    # A row of the schedule table (an edit in the admin) wins over the declaration.
    Schedule.objects.create(
        key="acme-digest",
        workflow="digest",
        interval_seconds=3600,
        concurrency_key="digest:acme",
        concurrency_limit=2,
        source=Schedule.Source.ADMIN,
    )
    Schedule.objects.create(
        key="globex-digest",
        workflow="digest",
        interval_seconds=3600,
        concurrency_key="digest:globex",
        concurrency_limit=5,
    )
    orm_engine.start("digest", {}, concurrency={"key": "digest:acme", "limit": 2})
    usage = {u.key: u for u in orm_engine.quota_usage()}
    # The schedule names its key literally: its limit, not the workflow's failing function.
    assert (usage["digest:acme"].active, usage["digest:acme"].limit) == (1, 2)
    assert usage["digest:acme"].limit_error is None
    assert usage_of(orm_engine, "digest:globex").limit == 5


# manage.py durable quota ---------------------------------------------------------------


def durable_quota(*args: str) -> str:
    out = io.StringIO()
    call_command("durable", "quota", *args, stdout=out)
    return out.getvalue()


def test_the_command_marks_computed_limits_and_names_failures(db):
    plans = {"tenant:acme": 2, "tenant:globex": 5}
    definition = default_engine.register(
        "tests.planned",
        "1",
        echo,
        concurrency=Concurrency(key=lambda input: input["key"], limit=lambda key: plans[key]),
    )
    try:
        default_engine.start("tests.planned", {"key": "tenant:acme"})
        default_engine.start("tests.planned", {"key": "tenant:acme"})
        done = default_engine.start("tests.echo", {"key": "tenant:idle"})
        force_status(default_engine, done.run_id, RunStatus.COMPLETED)
        default_engine.start("tests.planned", {"key": "tenant:globex"})
        del plans["tenant:globex"]
        table = durable_quota()
        idle = durable_quota("tenant:idle")
        as_json = json.loads(durable_quota("tenant:globex", "--json"))
    finally:
        default_engine.registry.remove(definition.name)
    assert table == (
        "KEY            ACTIVE  LIMIT  USE                WORKFLOWS\n"
        "tenant:acme         2     2*  [##########] full  tests.planned\n"
        "tenant:globex       1      !  -                  tests.planned\n"
        "\n"
        "* computed per key (the workflow's limit function, called with the key)\n"
        "! tenant:globex: limit function failed: KeyError: 'tenant:globex'\n"
    )
    assert idle == (
        "KEY          ACTIVE  LIMIT  USE                WORKFLOWS\n"
        "tenant:idle       0      3  [----------]   0%  tests.echo\n"
    )
    assert as_json == [
        {
            "kind": "concurrency",
            "key": "tenant:globex",
            "tag": "concurrency:tenant:globex",
            "active": 1,
            "limit": None,
            "override": None,
            "limit_in_force": None,
            "full": False,
            "workflows": ["tests.planned"],
            "limit_computed": False,
            "limit_error": "KeyError: 'tenant:globex'",
        }
    ]


def test_a_per_start_key_of_a_workflow_with_a_limit_function_shows_no_failure(engine: Engine):
    plans = {"tenant:acme": 2}
    engine.register(
        "chat.turn",
        "1",
        echo,
        concurrency={"key": lambda i: f"tenant:{i['tenant']}", "limit": lambda k: plans[k]},
    )
    # A campaign's turns under a quota of their own: the plan lookup is not for that key.
    engine.start(
        "chat.turn", {"tenant": "acme"}, concurrency={"key": "campaign:spring", "limit": 3}
    )
    engine.start("chat.turn", {"tenant": "acme"})
    del plans["tenant:acme"]
    usage = {u.key: u for u in engine.quota_usage()}
    assert (usage["campaign:spring"].limit, usage["campaign:spring"].limit_error) == (None, None)
    assert usage["tenant:acme"].limit_error == "KeyError: 'tenant:acme'"
    assert usage_of(engine, "campaign:spring").limit_error is None
