"""Batches of starts (``Wf.dispatch_many``, ``engine.start_many``): each element under its
own quota, in order, in one transaction; on the ORM store (each test database) and the
memory store."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction

from durable_django import (
    BatchStart,
    ConcurrencyLimitError,
    DurableError,
    Engine,
    RunHandle,
    UnstorableValueError,
    workflow,
)
from durable_django._rules.registry import Registry
from durable_django.models import QuotaLock, Run, RunTag
from durable_django.signals import run_refused, run_started
from durable_django.testing import run_until_idle

from ..helpers import echo

TENANT = {"key": lambda input: f"tenant:{input['tenant']}", "limit": 8}


def inputs(count: int, tenant: str = "acme") -> list[dict]:
    return [{"tenant": tenant, "n": n} for n in range(count)]


def test_a_batch_over_the_limit_admits_the_first_runs_and_refuses_the_rest(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT)

    batch = engine.start_many("chat.turn", inputs(12))

    assert isinstance(batch, BatchStart)
    assert len(batch.started) == 8 and all(isinstance(h, RunHandle) for h in batch.started)
    assert [index for index, _ in batch.refused] == [8, 9, 10, 11]
    for _, error in batch.refused:
        assert isinstance(error, ConcurrencyLimitError)
        assert (error.workflow, error.key, error.limit, error.active) == (
            "chat.turn",
            "tenant:acme",
            8,
            8,
        )
    assert [h is not None for h in batch.handles] == [True] * 8 + [False] * 4
    assert [engine.get_run(h.run_id).input["n"] for h in batch.started] == list(range(8))
    assert engine.count_runs(tag="concurrency:tenant:acme") == 8
    # The next batch finds the key full; another key has slots of its own.
    again = engine.start_many("chat.turn", [*inputs(1), *inputs(2, "globex")])
    assert [i for i, _ in again.refused] == [0]
    assert [engine.get_run(h.run_id).input["tenant"] for h in again.started] == ["globex"] * 2


def test_each_element_is_counted_against_its_own_key_in_order(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency={**TENANT, "limit": 2})
    tenants = ["a", "b", "a", "c", "a", "b", "b", "a"]
    batch = engine.start_many("chat.turn", [{"tenant": t} for t in tenants])
    assert [i for i, _ in batch.refused] == [4, 6, 7]
    assert [e.key for _, e in batch.refused] == ["tenant:a", "tenant:b", "tenant:a"]


def test_a_per_start_quota_applies_to_every_element(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT)
    batch = engine.start_many(
        "chat.turn", inputs(5), concurrency={"key": "campaign", "limit": 3}, tags=["bulk"]
    )
    assert [i for i, _ in batch.refused] == [3, 4]
    run = engine.get_run(batch.started[0].run_id)
    assert run.tags == ["bulk", "concurrency:campaign"]


def test_a_batch_under_several_weighted_quotas_admits_each_element_in_order(engine: Engine):
    # Two quotas per element: the tenant's (4 units, the input's weight) and the
    # region's (3 runs). An element starts only when both admit it, counting the
    # batch's earlier elements; a refused one takes no unit of either key.
    engine.register(
        "chat.turn",
        "1",
        echo,
        concurrency=[
            {"key": lambda i: f"tenant:{i['tenant']}", "limit": 4, "weight": lambda i: i["w"]},
            {"key": lambda i: f"region:{i['region']}", "limit": 3},
        ],
    )
    elements = [
        {"tenant": "a", "region": "eu", "w": 2},  # a 2/4, eu 1/3
        {"tenant": "a", "region": "us", "w": 3},  # a would be 5/4: refused by the tenant
        {"tenant": "b", "region": "eu", "w": 1},  # b 1/4, eu 2/3
        {"tenant": "a", "region": "eu", "w": 2},  # a 4/4, eu 3/3
        {"tenant": "b", "region": "eu", "w": 1},  # eu full: refused by the region
        {"tenant": "b", "region": "us", "w": 3},  # b 4/4, us 1/3
        {"tenant": "a", "region": "us", "w": 1},  # a full: refused by the tenant
    ]
    batch = engine.start_many("chat.turn", elements)
    assert [(i, e.key, e.limit, e.active) for i, e in batch.refused] == [
        (1, "tenant:a", 4, 2),
        (4, "region:eu", 3, 3),
        (6, "tenant:a", 4, 4),
    ]
    assert [engine.get_run(h.run_id).input for h in batch.started] == [
        elements[i] for i in (0, 2, 3, 5)
    ]
    usage = {(u.key, u.active) for u in engine.quota_usage()}
    assert usage >= {("tenant:a", 4), ("tenant:b", 4), ("region:eu", 3), ("region:us", 1)}
    run = engine.get_run(batch.started[0].run_id)
    assert set(run.tags) == {"concurrency:region:eu", "concurrency:tenant:a"}
    assert run.weights == {"concurrency:tenant:a": 2}
    # A per-start list applies to every element, as a single start's does.
    more = engine.start_many(
        "chat.turn",
        elements[:3],
        concurrency=[{"key": "campaign", "limit": 5, "weight": 2}, {"key": "eu", "limit": 9}],
    )
    assert [(i, e.key, e.active) for i, e in more.refused] == [(2, "campaign", 4)]


def test_refusals_are_explained_once_the_batch_has_ended(engine: Engine):
    engine.register(
        "chat.turn",
        "1",
        echo,
        concurrency=[TENANT, {"key": lambda i: f"site:{i['site']}", "limit": 1}],
    )
    explained: list[tuple[str, float, bool]] = []

    def on_refused(sender, error, **kwargs):
        explained.append((error.key, error.retry_after, error.estimate is not None))

    run_refused.connect(on_refused)
    try:
        batch = engine.start_many(
            "chat.turn", [{"tenant": "acme", "site": s} for s in "aabbcdefghijk"]
        )
    finally:
        run_refused.disconnect(on_refused)
    assert len(batch.started) == 8
    errors = [error for _, error in batch.refused]
    assert [e.key for e in errors] == [
        "site:a",
        "site:b",
        "tenant:acme",
        "tenant:acme",
        "tenant:acme",
    ]
    assert all(error.retry_after >= 1 and error.engine is engine for error in errors)
    assert explained == [(e.key, e.retry_after, True) for e in errors]
    # One estimate per key: the refusals of one key share it, read once.
    assert errors[2].estimate is errors[3].estimate is errors[4].estimate
    assert errors[0].estimate is not errors[1].estimate is not errors[2].estimate
    assert {run.run_id for run in errors[2].holders()} == {h.run_id for h in batch.started}


def test_an_empty_batch_starts_nothing(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT)
    assert engine.start_many("chat.turn", []) == BatchStart([], [], [])


def test_run_ids_are_idempotency_keys_within_and_across_batches(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency={**TENANT, "limit": 2})
    first = engine.start_many("chat.turn", inputs(2), run_ids=["turn:1", "turn:2"])
    assert [h.created for h in first.started] == [True, True]
    # The key is full, but ids already taken are returned, never refused; a new one is.
    again = engine.start_many("chat.turn", inputs(3), run_ids=["turn:2", "turn:1", "turn:3"])
    assert [(h.run_id, h.created) for h in again.started] == [
        ("turn:2", False),
        ("turn:1", False),
    ]
    assert [i for i, _ in again.refused] == [2]


def test_an_id_given_twice_in_a_batch_is_created_once(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT)
    batch = engine.start_many(
        "chat.turn", [{"tenant": "acme", "n": 1}, {"tenant": "acme", "n": 2}], run_ids=["x", "x"]
    )
    assert [(h.run_id, h.created) for h in batch.started] == [("x", True), ("x", False)]
    assert engine.get_run("x").input == {"tenant": "acme", "n": 1}
    assert engine.count_runs(tag="concurrency:tenant:acme") == 1


def test_an_id_held_by_another_workflow_undoes_the_batch(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT)
    engine.register("other", "1", echo)
    engine.start("other", {}, "taken")
    with pytest.raises(DurableError, match=r"inputs\[2\]: run id 'taken' is taken"):
        engine.start_many("chat.turn", inputs(3), run_ids=["a", "b", "taken"])
    assert [run.run_id for run in engine.list_runs()] == ["taken"]


@pytest.mark.parametrize(
    ("batch", "error", "message"),
    [
        ([{"tenant": "acme"}, {"tenant": "acme", "x": {1, 2}}], UnstorableValueError, "inputs[1]"),
        ([{"tenant": "acme"}, {"no": "tenant"}], ValueError, "inputs[1]: workflow 'chat.turn'"),
        ([{"tenant": "acme"}, {"tenant": "a\x00b"}], ValueError, "inputs[1]"),
    ],
)
def test_bad_input_in_any_element_creates_nothing(engine: Engine, batch, error, message):
    engine.register("chat.turn", "1", echo, concurrency=TENANT)
    with pytest.raises(error) as raised:
        engine.start_many("chat.turn", batch)
    assert message in str(raised.value)
    assert engine.list_runs() == []


def test_bad_arguments_create_nothing(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT)
    with pytest.raises(ValueError, match=r"inputs\[1\]: run_id"):
        engine.start_many("chat.turn", inputs(2), run_ids=["ok", "x" * 1000])
    with pytest.raises(ValueError, match="2 item"):
        engine.start_many("chat.turn", inputs(3), run_ids=["a", "b"])
    with pytest.raises(TypeError, match="list of inputs"):
        engine.start_many("chat.turn", {"tenant": "acme"})
    with pytest.raises(ValueError, match="concurrency:"):
        engine.start_many("chat.turn", inputs(2), tags=["concurrency:x"])
    with pytest.raises(ValueError, match="namespace"):
        engine.start_many("chat.turn", inputs(2), namespace="n" * 1000)
    assert engine.list_runs() == []


def test_signals_are_sent_per_run(engine: Engine, django_capture_on_commit_callbacks):
    engine.register("chat.turn", "1", echo, concurrency={**TENANT, "limit": 1})
    started: list[str] = []
    refused: list[str] = []

    def on_started(sender, run_id, **kwargs):
        started.append(run_id)

    def on_refused(sender, error, **kwargs):
        refused.append(error.key)

    run_started.connect(on_started)
    run_refused.connect(on_refused)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            batch = engine.start_many("chat.turn", inputs(3))
    finally:
        run_started.disconnect(on_started)
        run_refused.disconnect(on_refused)
    assert started == [batch.started[0].run_id]
    assert refused == ["tenant:acme", "tenant:acme"]


def test_the_started_runs_execute(engine: Engine):
    engine.register("chat.turn", "1", echo, concurrency=TENANT)
    batch = engine.start_many("chat.turn", inputs(3))
    assert run_until_idle(engine) == 3
    assert [h.result(timeout=1) for h in batch.started] == [echo(None, i) for i in inputs(3)]


@pytest.mark.django_db(transaction=True)  # the batch runs in a thread, on its connection
def test_async_batches(engine: Engine):
    async def limit(key):
        return 2

    engine.register("chat.turn", "1", echo, concurrency={**TENANT, "limit": limit})
    batch = async_to_sync(engine.astart_many)("chat.turn", inputs(3))
    assert len(batch.started) == 2 and [i for i, _ in batch.refused] == [2]


# on the declared workflows -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # adispatch_many runs in a thread
def test_declared_workflows_dispatch_many(engine: Engine):
    registry: Registry = engine.registry

    @workflow(name="batch.fn", concurrency=TENANT, engine=engine)
    def fn(ctx, input):
        return input

    from durable_django import BaseWorkflow

    @workflow(name="batch.cls", concurrency={**TENANT, "limit": 1}, engine=engine)
    class Cls(BaseWorkflow):
        def run(self, ctx, input):
            return input

    assert len(fn.dispatch_many(inputs(3)).started) == 3
    batch = Cls.dispatch_many(inputs(2, "globex"))
    assert [i for i, _ in batch.refused] == [1]
    batch = async_to_sync(Cls.adispatch_many)(inputs(1, "initech"))
    assert len(batch.started) == 1
    assert registry.latest("batch.fn") is fn.definition


def test_dispatch_many_inside_a_body_is_refused(engine: Engine):
    @workflow(name="batch.child", engine=engine)
    def child(ctx, input):
        return input

    @workflow(name="batch.parent", engine=engine)
    def parent(ctx, input):
        child.dispatch_many([1, 2])

    handle = parent.dispatch({})
    run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == "failed" and "ctx.start_child" in run.error["message"]


# inside the caller's transaction (the ORM store) ---------------------------------------


def test_a_rolled_back_batch_leaves_nothing(orm_engine: Engine):
    orm_engine.register("chat.turn", "1", echo, concurrency=TENANT)
    with pytest.raises(RuntimeError), transaction.atomic():
        batch = orm_engine.start_many("chat.turn", inputs(3))
        assert len(batch.started) == 3
        raise RuntimeError("the view failed")
    assert Run.objects.count() == RunTag.objects.count() == 0


def test_a_batch_commits_with_the_callers_transaction(orm_engine: Engine):
    orm_engine.register("chat.turn", "1", echo, concurrency={**TENANT, "limit": 2})
    with transaction.atomic():
        first = orm_engine.start_many("chat.turn", inputs(1))
        second = orm_engine.start_many("chat.turn", inputs(2))
    assert (len(first.started), len(second.started), len(second.refused)) == (1, 1, 1)
    assert Run.objects.count() == 2


def test_the_portable_path_locks_each_key_once(db):
    from durable_django.stores import OrmStore

    engine = Engine(store=OrmStore(fast_path=False), registry=Registry(), enqueue=False)
    engine.register("chat.turn", "1", echo, concurrency={**TENANT, "limit": 2})
    batch = engine.start_many("chat.turn", [{"tenant": t} for t in "abcabc"])
    assert len(batch.started) == 6
    if connection.vendor != "postgresql":
        # (on MariaDB a new key's row is committed apart, so rows of other tests may stay)
        assert set(QuotaLock.objects.values_list("key", flat=True)) >= {
            "tenant:a",
            "tenant:b",
            "tenant:c",
        }


def test_the_batchs_messages_are_one_callback_on_commit(db, django_capture_on_commit_callbacks):
    from durable_django.stores import OrmStore

    engine = Engine(store=OrmStore(), registry=Registry(), enqueue=True)
    engine.register("chat.turn", "1", echo, concurrency={**TENANT, "limit": 3})
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        batch = engine.start_many("chat.turn", inputs(5))
    assert (len(batch.started), len(batch.refused)) == (3, 2)
    assert len(callbacks) == 1  # one publish_runs of the three; no run_started listener
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        engine.start_many("chat.turn", inputs(2))  # all refused: nothing to send
    assert callbacks == []
