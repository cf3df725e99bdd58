"""Starting runs under a quota, on the ORM store (each test database) and the memory store."""

from __future__ import annotations

import pytest
from django.db import transaction

from durable_django import (
    ConcurrencyLimitError,
    DurableError,
    Engine,
    RunNotFound,
    RunStatus,
)
from durable_django.errors import WorkflowNotFound
from durable_django.stores import MemoryStore
from durable_django.testing import run_until_idle

from ..helpers import echo, force_status

TENANT_KEY = {"key": lambda input: f"tenant:{input['tenant']}", "limit": 2}


def rows(engine: Engine, key: str) -> int:
    return len(engine.list_runs(tag=f"concurrency:{key}"))


def test_starts_up_to_the_limit_then_refuses(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT_KEY)
    first = engine.start("chat.turn", {"tenant": "acme"})
    second = engine.start("chat.turn", {"tenant": "acme"})
    assert first.created and second.created and first.run_id != second.run_id
    with pytest.raises(ConcurrencyLimitError) as refused:
        engine.start("chat.turn", {"tenant": "acme"}, "turn:3")
    error = refused.value
    assert (error.workflow, error.key, error.limit, error.active) == (
        "chat.turn",
        "tenant:acme",
        2,
        2,
    )
    assert "tenant:acme" in str(error) and "limit is 2" in str(error)
    # Nothing was created by the refusal.
    with pytest.raises(RunNotFound):
        engine.get_run("turn:3")
    assert rows(engine, "tenant:acme") == 2
    # Another tenant has its own slots.
    assert engine.start("chat.turn", {"tenant": "globex"}).created


def test_the_run_carries_the_quota_tag_and_pending_status(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT_KEY, tags=["chat"])
    handle = engine.start("chat.turn", {"tenant": "acme"}, tags=["vip"])
    run = engine.get_run(handle.run_id)
    assert run.tags == sorted(["chat", "vip", "concurrency:tenant:acme"])
    assert run.status == RunStatus.PENDING == handle.status
    assert run.workflow == handle.workflow == "chat.turn"
    assert run.input == {"tenant": "acme"}
    assert run.namespace == "default"


def test_refusal_on_the_orm_store_leaves_no_row(orm_engine: Engine):
    from durable_django.models import Run, RunTag

    orm_engine.register("wf", "1", echo, concurrency={"key": lambda i: "k", "limit": 1})
    orm_engine.start("wf", {})
    with pytest.raises(ConcurrencyLimitError):
        orm_engine.start("wf", {}, "refused-id")
    assert not Run.objects.filter(pk="refused-id").exists()
    assert not RunTag.objects.filter(run_id="refused-id").exists()
    assert Run.objects.count() == 1 and RunTag.objects.count() == 1


def test_a_slot_frees_when_its_run_ends(engine: Engine):
    engine.register("wf", "1", echo, concurrency={"key": lambda i: "k", "limit": 1})
    engine.start("wf", {})
    with pytest.raises(ConcurrencyLimitError):
        engine.start("wf", {})
    assert run_until_idle(engine) == 1
    assert engine.start("wf", {}).created


def test_limit_zero_or_less_refuses_every_start(engine: Engine):
    for limit in (0, -1):
        with pytest.raises(ConcurrencyLimitError) as refused:
            engine.register(
                f"wf{limit}", "1", echo, concurrency={"key": lambda i: "k", "limit": limit}
            )
            engine.start(f"wf{limit}", {})
        assert refused.value.limit == limit and refused.value.active == 0
    assert engine.list_runs() == []


def test_count_statuses_narrow_what_holds_a_slot(engine: Engine):
    engine.register(
        "wf",
        "1",
        echo,
        concurrency={"key": lambda i: "k", "limit": 1, "count_statuses": ["pending", "running"]},
    )
    first = engine.start("wf", {})
    with pytest.raises(ConcurrencyLimitError):
        engine.start("wf", {})
    force_status(engine, first.run_id, RunStatus.SUSPENDED)
    assert engine.start("wf", {}).created


def test_every_active_status_holds_a_slot_by_default(engine: Engine):
    engine.register("wf", "1", echo, concurrency={"key": lambda i: "k", "limit": 1})
    first = engine.start("wf", {})
    for status in ("running", "suspended", "blocked"):
        force_status(engine, first.run_id, status)
        with pytest.raises(ConcurrencyLimitError):
            engine.start("wf", {})
    for status in ("completed", "failed", "cancelled"):
        force_status(engine, first.run_id, status)
        second = engine.start("wf", {})
        force_status(engine, second.run_id, "cancelled")


def test_a_per_start_quota_replaces_the_workflows_entirely(engine: Engine):
    engine.register("wf", "1", echo, concurrency={"key": lambda i: "declared", "limit": 1})
    engine.start("wf", {})
    # The declared key is full, but this start uses its own key and limit.
    engine.start("wf", {}, concurrency={"key": "override", "limit": 2})
    engine.start("wf", {}, concurrency={"key": "override", "limit": 2})
    with pytest.raises(ConcurrencyLimitError) as refused:
        engine.start("wf", {}, concurrency={"key": "override", "limit": 2})
    assert refused.value.key == "override"
    # Its count_statuses too: the default is not merged in.
    run = engine.list_runs(tag="concurrency:override")[0]
    force_status(engine, run.run_id, RunStatus.SUSPENDED)
    engine.start(
        "wf", {}, concurrency={"key": "override", "limit": 2, "count_statuses": ["pending"]}
    )
    assert rows(engine, "declared") == 1


def test_a_workflow_without_a_quota_can_be_started_under_one(engine: Engine):
    engine.register("wf", "1", echo)
    engine.start("wf", {}, concurrency={"key": "k", "limit": 1})
    with pytest.raises(ConcurrencyLimitError):
        engine.start("wf", {}, concurrency={"key": "k", "limit": 1})
    assert engine.start("wf", {}).created


def test_a_key_of_none_is_unlimited_and_untagged(engine: Engine):
    engine.register("wf", "1", echo, concurrency={"key": lambda i: i.get("k"), "limit": 0})
    handle = engine.start("wf", {})
    assert engine.get_run(handle.run_id).tags == []
    with pytest.raises(ConcurrencyLimitError):
        engine.start("wf", {"k": "x"})


def test_an_idempotent_restart_returns_the_run_and_is_never_refused(engine: Engine):
    engine.register("wf", "1", echo, concurrency={"key": lambda i: "k", "limit": 1})
    first = engine.start("wf", {"n": 1}, "order:1")
    again = engine.start("wf", {"n": 2}, "order:1")
    assert first.created and not again.created and again.run_id == "order:1"
    assert engine.get_run("order:1").input == {"n": 1}
    assert rows(engine, "k") == 1
    # Still returned after it finished and its slot is free or taken by another run.
    run_until_idle(engine)
    engine.start("wf", {})
    assert not engine.start("wf", {}, "order:1").created


def test_namespaces_are_stamped_and_the_count_spans_them(registry):
    store = MemoryStore()
    blue = Engine(store=store, namespace="blue", registry=registry, enqueue=False)
    green = Engine(store=store, namespace="green", registry=registry, enqueue=False)
    blue.register("wf", "1", echo, concurrency={"key": lambda i: "k", "limit": 2})
    assert blue.get_run(blue.start("wf", {}).run_id).namespace == "blue"
    green.start("wf", {})
    with pytest.raises(ConcurrencyLimitError):
        blue.start("wf", {})
    assert blue.start("wf", {}, namespace="x", concurrency={"key": "other", "limit": 1})


@pytest.mark.parametrize("store_kind", ["orm", "memory"])
def test_scope_reads_fences_reads_and_the_count(registry, store_kind, db):
    from durable_django.stores import OrmStore

    store = OrmStore() if store_kind == "orm" else MemoryStore()
    blue = Engine(store=store, namespace="blue", scope_reads=True, registry=registry, enqueue=False)
    green = Engine(
        store=store, namespace="green", scope_reads=True, registry=registry, enqueue=False
    )
    blue.register("wf", "1", echo, concurrency={"key": lambda i: "k", "limit": 1})
    blue_run = blue.start("wf", {}).run_id
    green_run = green.start("wf", {}).run_id  # green counts only its own runs
    with pytest.raises(ConcurrencyLimitError):
        green.start("wf", {})
    assert green.count_runs(tag="concurrency:k") == 1
    assert [r.run_id for r in blue.list_runs()] == [blue_run]
    with pytest.raises(RunNotFound):
        blue.get_run(green_run)
    with pytest.raises(ValueError, match="reads only namespace 'blue'"):
        blue.list_runs(namespace="green")
    # A run id held in another namespace is a clash, not a re-start.
    with pytest.raises(DurableError, match="namespace 'green'"):
        blue.start("wf", {}, green_run)


def test_count_runs_is_the_stores_count_with_its_filters_checked(engine: Engine):
    """What the count means is the store contract's (``durable_django.testing.StoreContract``)."""
    engine.register("wf", "1", echo, concurrency={"key": lambda i: i["k"], "limit": 5})
    engine.start("wf", {"k": "a"})
    engine.start("wf", {"k": "b"})
    assert engine.count_runs(tag="concurrency:a", statuses=["pending"]) == 1
    assert engine.count_runs() == 2
    with pytest.raises(ValueError, match="unknown status"):
        engine.count_runs(statuses=["done"])


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda e: e.start("nope", {}), WorkflowNotFound, "'nope'"),
        (lambda e: e.start("wf", {"when": object()}), TypeError, "JSON-serialisable"),
        (lambda e: e.start("wf", {"x": float("nan")}), TypeError, "JSON-serialisable"),
        (lambda e: e.start("wf", {}, ""), ValueError, "run_id must not be empty"),
        (lambda e: e.start("wf", {}, "r" * 256), ValueError, "run_id is 256"),
        (lambda e: e.start("wf", {}, 42), TypeError, "run_id must be a str"),
        (lambda e: e.start("wf", {}, tags=["concurrency:x"]), ValueError, "reserved"),
        (lambda e: e.start("wf", {}, tags="one"), TypeError, "list of str"),
        (lambda e: e.start("wf", {}, namespace=""), ValueError, "namespace"),
        (lambda e: e.start("wf", {"k": 1}), TypeError, "must return a str or None"),
        (lambda e: e.start("wf", {}, concurrency={"key": "k", "limit": "2"}), TypeError, "int"),
        (lambda e: e.start("wf", {}, concurrency={"key": "", "limit": 2}), ValueError, "empty"),
        (
            lambda e: e.start(
                "wf", {}, concurrency={"key": "k", "limit": 1, "count_statuses": ["x"]}
            ),
            ValueError,
            "unknown status",
        ),
    ],
)
def test_bad_input_is_refused_and_creates_nothing(engine: Engine, call, error, message):
    engine.register("wf", "1", echo, concurrency={"key": lambda i: i.get("k"), "limit": 5})
    with pytest.raises(error, match=message):
        call(engine)
    assert engine.list_runs() == []


@pytest.mark.django_db(transaction=True)
def test_a_start_in_a_rolled_back_transaction_leaves_nothing(orm_engine: Engine):
    orm_engine.register("wf", "1", echo, concurrency={"key": lambda i: "k", "limit": 1})
    with pytest.raises(RuntimeError), transaction.atomic():
        orm_engine.start("wf", {}, "rolled-back")
        raise RuntimeError("roll back")
    with pytest.raises(RunNotFound):
        orm_engine.get_run("rolled-back")
    # Its slot was never taken.
    assert orm_engine.start("wf", {}).created


def test_quota_usage_lists_busy_keys_with_their_declared_limit(engine: Engine):
    async def plan_limit(key):
        return {"tenant:acme": 3}.get(key, 1)

    engine.register(
        "chat.turn",
        "1",
        echo,
        concurrency={"key": lambda i: f"tenant:{i['t']}", "limit": plan_limit},
    )
    engine.register("free", "1", echo)
    for _ in range(2):
        engine.start("chat.turn", {"t": "acme"})
    engine.start("chat.turn", {"t": "globex"})
    engine.start("free", {}, concurrency={"key": "adhoc", "limit": 9})
    done = engine.start("chat.turn", {"t": "initech"})
    force_status(engine, done.run_id, RunStatus.COMPLETED)
    usage = {u.key: u for u in engine.quota_usage()}
    assert set(usage) == {"tenant:acme", "tenant:globex", "adhoc"}
    acme = usage["tenant:acme"]
    assert (acme.active, acme.limit, acme.workflows, acme.full) == (2, 3, ("chat.turn",), False)
    assert usage["tenant:globex"].full
    assert usage["adhoc"].limit is None  # a per-start quota is not declared anywhere
    assert engine.quota_usage()[0].key == "tenant:acme"  # busiest first
    assert engine.quota_usage("nobody")[0].active == 0
