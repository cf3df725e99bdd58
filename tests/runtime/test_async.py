"""Starting from async code: adispatch/astart and async limit functions."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from durable_django import BaseWorkflow, ConcurrencyLimitError, Engine, workflow
from durable_django.testing import run_until_idle


@pytest.mark.django_db(transaction=True)
def test_adispatch_with_an_async_limit_function(orm_engine: Engine):
    looked_up = []

    async def plan_limit(key: str) -> int:
        looked_up.append(key)
        return 2

    @workflow(
        name="chat.turn",
        engine=orm_engine,
        concurrency={"key": lambda i: f"tenant:{i['tenant']}", "limit": plan_limit},
    )
    class Turn(BaseWorkflow):
        def run(self, ctx, input):
            return {"ok": True}

    async def view():
        first = await Turn.adispatch({"tenant": "acme"})
        second = await Turn.adispatch({"tenant": "acme"}, run_id="turn:2")
        try:
            await Turn.adispatch({"tenant": "acme"})
        except ConcurrencyLimitError as error:
            refused = error
        again = await Turn.adispatch({"tenant": "acme"}, run_id="turn:2")
        count = await sync_to_async(orm_engine.count_runs)(tag="concurrency:tenant:acme")
        return first, second, refused, again, count

    first, second, refused, again, count = async_to_sync(view)()
    assert first.created and second.created and not again.created
    assert (refused.key, refused.limit, refused.active) == ("tenant:acme", 2, 2)
    assert count == 2
    assert looked_up == ["tenant:acme"] * 4


@pytest.mark.django_db(transaction=True)
def test_a_sync_limit_function_querying_the_database_from_async_code(orm_engine: Engine):
    from durable_django.models import Run

    def limit_from_the_database(key: str) -> int:
        return Run.objects.count() + 1  # a database query: must not run on the event loop

    orm_engine.register(
        "wf",
        "1",
        lambda ctx, i: None,
        concurrency={"key": lambda i: "k", "limit": limit_from_the_database},
    )
    handle = async_to_sync(orm_engine.astart)("wf", {})
    assert handle.created


def test_astart_waits_for_the_output(memory_engine: Engine):
    memory_engine.register("wf", "1", lambda ctx, i: i + 1)

    async def start_and_wait():
        import asyncio

        handle = await memory_engine.astart("wf", 1)
        await asyncio.to_thread(run_until_idle, memory_engine)
        return await handle.aresult(timeout=5)

    assert async_to_sync(start_and_wait)() == 2
