"""Several quotas on one start, all or nothing, and weighted slots: through the engine, on
the ORM store (each test database) and the memory store."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from durable_django import (
    ChildWorkflowError,
    Concurrency,
    ConcurrencyLimitError,
    Engine,
    RunNotFound,
    RunStatus,
)
from durable_django._rules.concurrency import Quota, coerce_all, for_workflow, merge, resolve
from durable_django.signals import run_refused
from durable_django.testing import run_until_idle

from ..helpers import echo, force_status

CHAT = [
    Concurrency(key=lambda i: f"tenant:{i['tenant']}", limit=3),
    Concurrency(key=lambda i: f"user:{i['user']}", limit=2),
    Concurrency(
        key=lambda i: "gpu" if i.get("gpus") else None, limit=10, weight=lambda i: i["gpus"]
    ),
]


def turn(tenant: str = "acme", user: str = "ann", gpus: int = 0) -> dict[str, object]:
    return {"tenant": tenant, "user": user, "gpus": gpus}


def units(engine: Engine, key: str) -> int:
    return engine.store.quota_units(
        [Quota(key, 1, ("pending", "running", "suspended", "blocked"))], None
    )[0]


def refusal(engine: Engine, *args: object, **kwargs: object) -> ConcurrencyLimitError:
    """The refusal of ``engine.start(*args, **kwargs)``, checked to have created nothing."""
    before = {run.run_id for run in engine.list_runs()}
    refused: list[ConcurrencyLimitError] = []

    def receiver(sender: object, **signal: object) -> None:
        refused.append(signal["error"])  # type: ignore[arg-type]

    run_refused.connect(receiver)
    try:
        with pytest.raises(ConcurrencyLimitError) as caught:
            engine.start(*args, **kwargs)  # type: ignore[arg-type]
    finally:
        run_refused.disconnect(receiver)
    assert {run.run_id for run in engine.list_runs()} == before
    assert refused == [caught.value]
    return caught.value


# several quotas --------------------------------------------------------------------


def test_a_start_is_admitted_only_when_every_quota_admits_it(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=CHAT)
    first = engine.start("chat.turn", turn(gpus=4))
    assert engine.get_run(first.run_id).tags == sorted(
        ["concurrency:tenant:acme", "concurrency:user:ann", "concurrency:gpu"]
    )
    engine.start("chat.turn", turn())  # the gpu quota dropped: its key function says None
    assert engine.get_run(engine.list_runs()[0].run_id).tags == [
        "concurrency:tenant:acme",
        "concurrency:user:ann",
    ]
    # ann holds 2 of 2: refused by the user quota though the tenant has room.
    error = refusal(engine, "chat.turn", turn(), "turn:3")
    assert (error.workflow, error.key, error.limit, error.active) == ("chat.turn", "user:ann", 2, 2)
    with pytest.raises(RunNotFound):
        engine.get_run("turn:3")
    # bob gets the tenant's last slot; then the tenant refuses, named before the user.
    engine.start("chat.turn", turn(user="bob"))
    error = refusal(engine, "chat.turn", turn(user="bob"))
    assert (error.key, error.limit, error.active) == ("tenant:acme", 3, 3)
    # Another tenant and user are free; the gpu key holds 4 units of 10.
    engine.start("chat.turn", turn("globex", "cy", gpus=6))
    assert units(engine, "gpu") == 10
    error = refusal(engine, "chat.turn", turn("initech", "dee", gpus=1))
    assert (error.key, error.limit, error.active) == ("gpu", 10, 10)
    # A run ending frees a slot on each of its keys.
    engine.cancel(first.run_id)
    assert units(engine, "gpu") == 6
    assert engine.start("chat.turn", turn("initech", "dee", gpus=4)).created


def test_the_first_refusing_quota_in_declared_order_is_named(engine: Engine):
    engine.register(
        "wf",
        "1",
        echo,
        concurrency=[
            Concurrency(key=lambda i: "z-first", limit=1),
            Concurrency(key=lambda i: "a-second", limit=1),
        ],
    )
    engine.start("wf", {})
    assert refusal(engine, "wf", {}).key == "z-first"
    engine.register(
        "wf2",
        "1",
        echo,
        concurrency=[
            Concurrency(key=lambda i: "a-second", limit=1),
            Concurrency(key=lambda i: "z-first", limit=1),
        ],
    )
    assert refusal(engine, "wf2", {}).key == "a-second"


def test_a_per_start_list_replaces_the_whole_list(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=CHAT)
    engine.start("chat.turn", turn())
    engine.start("chat.turn", turn())
    # ann is full under the declared list; a per-start list replaces it whole.
    handle = engine.start(
        "chat.turn",
        turn(),
        concurrency=[{"key": "batch", "limit": 5}, Concurrency("night", 4, weight=2)],
    )
    assert engine.get_run(handle.run_id).tags == ["concurrency:batch", "concurrency:night"]
    assert units(engine, "night") == 2
    # One per-start quota replaces the list too.
    handle = engine.start("chat.turn", turn(), concurrency={"key": "batch", "limit": 5})
    assert engine.get_run(handle.run_id).tags == ["concurrency:batch"]
    error = refusal(
        engine,
        "chat.turn",
        turn(),
        concurrency=[{"key": "batch", "limit": 5}, {"key": "night", "limit": 2}],
    )
    assert (error.key, error.active) == ("night", 2)
    with pytest.raises(ValueError, match="at least one quota"):
        engine.start("chat.turn", turn(), concurrency=[])
    with pytest.raises(TypeError, match=r"concurrency\[1\] must be a Concurrency or a dict"):
        engine.start("chat.turn", turn(), concurrency=[{"key": "a", "limit": 1}, "b"])


def test_duplicate_keys_merge_into_the_strictest_quota(engine: Engine):
    engine.register(
        "wf",
        "1",
        echo,
        concurrency=[
            Concurrency(key=lambda i: i["a"], limit=5, weight=2),
            Concurrency(key=lambda i: "other", limit=9),
            Concurrency(key=lambda i: i["b"], limit=4, count_statuses=["pending"]),
        ],
    )
    handle = engine.start("wf", {"a": "same", "b": "same"})
    run = engine.get_run(handle.run_id)
    assert run.tags == ["concurrency:other", "concurrency:same"]
    assert units(engine, "same") == 3  # the weights summed on the one tag
    # limit 4 (the smaller): 3 held + 3 more is over.
    error = refusal(engine, "wf", {"a": "same", "b": "same"})
    assert (error.key, error.limit, error.active) == ("same", 4, 3)
    assert merge([Quota("k", 5, ("pending",), 2), Quota("k", 4, ("running",), 1)]) == (
        Quota("k", 4, ("pending", "running"), 3),
    )


def test_async_starts_resolve_every_quota(engine: Engine):
    async def plan(key: str) -> int:
        return 1

    engine.register(
        "wf",
        "1",
        echo,
        concurrency=[
            Concurrency(key=lambda i: "t", limit=plan),
            Concurrency(key=lambda i: "u", limit=5, weight=3),
        ],
    )
    handle = async_to_sync(engine.astart)("wf", {})
    assert engine.get_run(handle.run_id).tags == ["concurrency:t", "concurrency:u"]
    assert units(engine, "u") == 3
    with pytest.raises(ConcurrencyLimitError) as refused:
        async_to_sync(engine.astart)("wf", {})
    assert refused.value.key == "t"


# weights ---------------------------------------------------------------------------


def test_a_weighted_run_occupies_its_units_and_the_error_is_in_units(engine: Engine):
    engine.register(
        "render",
        "1",
        echo,
        concurrency=Concurrency(key=lambda i: "gpu", limit=10, weight=lambda i: i["gpus"]),
    )
    engine.start("render", {"gpus": 3})
    engine.start("render", {"gpus": 5})
    error = refusal(engine, "render", {"gpus": 3})
    assert (error.key, error.limit, error.active) == ("gpu", 10, 8)
    assert "has 8 active run(s), limit is 10" in str(error)
    assert engine.start("render", {"gpus": 2}).created
    assert refusal(engine, "render", {"gpus": 1}).active == 10
    # A weight larger than the limit is refused, whatever the key holds.
    engine.register(
        "big",
        "1",
        echo,
        concurrency=Concurrency(key=lambda i: "empty", limit=4, weight=lambda i: 5),
    )
    assert refusal(engine, "big", {}).active == 0
    # Units free as runs end; the quota usage counts units.
    run_until_idle(engine)
    assert units(engine, "gpu") == 0
    assert engine.start("render", {"gpus": 10}).created
    assert [(u.key, u.active, u.limit, u.full) for u in engine.quota_usage("gpu")] == [
        ("gpu", 10, 10, True)
    ]


def test_a_weight_counts_in_its_statuses_only(engine: Engine):
    engine.register(
        "wf",
        "1",
        echo,
        concurrency=Concurrency(key=lambda i: "k", limit=4, weight=3, count_statuses=["pending"]),
    )
    first = engine.start("wf", {})
    refusal(engine, "wf", {})
    force_status(engine, first.run_id, RunStatus.SUSPENDED)
    assert engine.start("wf", {}).created


@pytest.mark.parametrize(
    ("weight", "error", "message"),
    [
        (0, ValueError, "weight must be between 1 and 2147483647, not 0"),
        (-2, ValueError, "weight must be between 1"),
        (2**31, ValueError, "weight must be between 1"),
        (True, TypeError, "weight must be an int or a callable"),
        (1.5, TypeError, "weight must be an int or a callable"),
        ("2", TypeError, "weight must be an int or a callable"),
        (11, ValueError, "weight 11 is more than its limit 10"),
    ],
)
def test_bad_weights_are_refused_at_declaration(weight, error, message):
    with pytest.raises(error, match=message):
        Concurrency(key=lambda i: "k", limit=10, weight=weight)
    with pytest.raises(error, match=message):
        for_workflow([{"key": lambda i: "k", "limit": 10, "weight": weight}], "wf")


@pytest.mark.parametrize(
    ("weight", "error", "message"),
    [
        (lambda i: 1 / 0, ValueError, "weight function raised ZeroDivisionError for key 'k'"),
        (lambda i: 0, ValueError, "weight for key 'k' must be between 1"),
        (lambda i: "3", TypeError, "weight for key 'k' must be an int, not str"),
        (lambda i: True, TypeError, "weight for key 'k' must be an int, not bool"),
        (lambda i: 2.0, TypeError, "must be an int, not float"),
    ],
)
def test_bad_weights_are_refused_at_start_and_create_nothing(
    engine: Engine, weight, error, message
):
    engine.register(
        "wf", "1", echo, concurrency=[Concurrency(key=lambda i: "k", limit=5, weight=weight)]
    )
    with pytest.raises(error, match=message) as caught:
        engine.start("wf", {})
    assert "'wf'" in str(caught.value)
    assert engine.list_runs() == []


def test_a_limit_of_zero_still_refuses_every_weight():
    assert Concurrency("k", 0, weight=3).weight == 3
    assert resolve([Concurrency(key=lambda i: "k", limit=0, weight=2)], {}, "wf") == (
        Quota("k", 0, ("pending", "running", "suspended", "blocked"), 2),
    )
    with pytest.raises(TypeError, match="concurrency must be a Concurrency, a dict, a list"):
        coerce_all(3)  # type: ignore[arg-type]


# where the quotas apply -------------------------------------------------------------


def test_a_child_is_refused_by_any_of_its_quotas(engine: Engine):
    engine.register(
        "child",
        "1",
        lambda ctx, i: "ran",
        concurrency=[
            Concurrency(key=lambda i: "wide", limit=5),
            Concurrency(key=lambda i: "narrow", limit=4, weight=3),
        ],
    )

    def parent(ctx, input):
        try:
            return ctx.child("child", {})
        except ChildWorkflowError as error:
            return {"refused": error.cause.key, "active": error.cause.active}

    engine.register("parent", "1", parent)
    blocker = engine.start("child", {})
    handle = engine.start("parent", {})
    engine.execute(handle.run_id)
    assert handle.result() == {"refused": "narrow", "active": 3}
    engine.cancel(blocker.run_id)
    second = engine.start("parent", {})
    run_until_idle(engine)
    assert second.result() == "ran"


def test_an_event_skips_a_subscriber_refused_by_one_of_its_quotas(engine: Engine):
    engine.register(
        "a",
        "1",
        echo,
        on_event=["paid"],
        concurrency=[
            Concurrency(key=lambda i: "shared", limit=3),
            Concurrency(key=lambda i: "a", limit=1),
        ],
    )
    engine.register(
        "b",
        "1",
        echo,
        on_event=["paid"],
        concurrency=[
            Concurrency(key=lambda i: "b", limit=5),
            Concurrency(key=lambda i: "shared", limit=3, weight=2),
        ],
    )
    first = engine.publish_event("paid", {})
    assert sorted(h.workflow for h in first.started) == ["a", "b"]
    assert units(engine, "shared") == 3
    second = engine.publish_event("paid", {})
    assert second.started == []
    # a: the shared key (first in its list) holds 3 of 3; b: 3 + its weight 2 > 3.
    assert sorted((name, error.key, error.active) for name, error in second.skipped) == [
        ("a", "shared", 3),
        ("b", "shared", 3),
    ]
    assert len(engine.list_runs()) == 2


def test_a_retry_goes_through_every_quota_and_takes_their_tags(engine: Engine):
    engine.register(
        "wf",
        "1",
        lambda ctx, i: 1 / 0,
        concurrency=[
            Concurrency(key=lambda i: "t", limit=5),
            Concurrency(key=lambda i: "gpu", limit=4, weight=3),
        ],
    )
    handle = engine.start("wf", {})
    run_until_idle(engine)
    other = engine.start("wf", {}, concurrency=[{"key": "gpu", "limit": 4, "weight": 2}])
    with pytest.raises(ConcurrencyLimitError) as refused:
        engine.retry(handle.run_id)
    assert (refused.value.key, refused.value.active) == ("gpu", 2)
    assert handle.status == RunStatus.FAILED
    engine.cancel(other.run_id)
    engine.retry(handle.run_id)
    run = engine.get_run(handle.run_id)
    assert (run.status, run.tags) == ("pending", ["concurrency:gpu", "concurrency:t"])
    assert units(engine, "gpu") == 3
    # A per-start list replaces the declared one for the retry too.
    run_until_idle(engine)
    engine.retry(
        handle.run_id, concurrency=[{"key": "x", "limit": 1}, {"key": "y", "limit": 9, "weight": 4}]
    )
    run = engine.get_run(handle.run_id)
    assert run.tags == ["concurrency:x", "concurrency:y"]
    assert (units(engine, "gpu"), units(engine, "y")) == (0, 4)


def test_quota_usage_shows_a_run_under_each_of_its_keys(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=CHAT)
    engine.start("chat.turn", turn(gpus=4))
    engine.start("chat.turn", turn(user="bob", gpus=1))
    usage = {u.key: (u.active, u.limit, u.workflows) for u in engine.quota_usage()}
    assert usage == {
        "tenant:acme": (2, 3, ("chat.turn",)),
        "user:ann": (1, 2, ("chat.turn",)),
        "user:bob": (1, 2, ("chat.turn",)),
        "gpu": (5, 10, ("chat.turn",)),
    }
    assert engine.quota_usage()[0].key == "gpu"  # busiest first, in units


def test_a_schedule_without_a_quota_of_its_own_takes_the_workflows_list(orm_engine: Engine):
    from durable_django._runtime.schedules import fire_now
    from durable_django.models import Schedule

    orm_engine.register(
        "wf",
        "1",
        echo,
        concurrency=[
            Concurrency(key=lambda i: "s1", limit=2),
            Concurrency(key=lambda i: "s2", limit=3, weight=2),
        ],
    )
    row = Schedule.objects.create(key="nightly", workflow="wf", interval_seconds=60, input={})
    assert fire_now(orm_engine, row).run_id is not None
    firing = fire_now(orm_engine, row)
    assert firing.run_id is None and firing.refusal is not None
    assert (firing.refusal.key, firing.refusal.active) == ("s2", 2)
    row.refresh_from_db()
    assert "concurrency key 's2' has 2 active run(s), limit is 3" in row.last_error
    # A schedule's own quota replaces the whole list.
    own = Schedule.objects.create(
        key="own",
        workflow="wf",
        interval_seconds=60,
        input={},
        concurrency_key="mine",
        concurrency_limit=1,
    )
    run_id = fire_now(orm_engine, own).run_id
    assert run_id is not None
    assert orm_engine.get_run(run_id).tags == ["concurrency:mine"]


def test_the_command_and_the_quota_page_show_a_run_under_each_key(admin_client):
    from django.urls import reverse

    from durable_django import engine as default_engine

    from ..helpers import durable_json

    definition = default_engine.register(
        "tests.multikey",
        "1",
        echo,
        concurrency=[
            Concurrency(key=lambda i: f"team:{i['team']}", limit=4),
            Concurrency(key=lambda i: "pool", limit=10, weight=lambda i: i["gpus"]),
        ],
    )
    try:
        default_engine.start("tests.multikey", {"team": "red", "gpus": 6})
        default_engine.start("tests.multikey", {"team": "blue", "gpus": 4})
        listed = {
            row["key"]: (row["active"], row["limit"], row["full"]) for row in durable_json("quota")
        }
        assert listed == {
            "pool": (10, 10, True),
            "team:red": (1, 4, False),
            "team:blue": (1, 4, False),
        }
        page = admin_client.get(reverse("admin:durable_django_run_quotas"))
        rows = {
            row["key"]: (row["active"], row["limit"], row["percent"])
            for row in page.context["rows"]
        }
        assert rows == {"pool": (10, 10, 100), "team:red": (1, 4, 25), "team:blue": (1, 4, 25)}
    finally:
        default_engine.registry.remove(definition.name)
