"""Fixtures: engines on each store, each with a registry of its own."""

from __future__ import annotations

import pytest

from durable_django import Engine, RunStatus
from durable_django.registry import Registry
from durable_django.stores import MemoryStore, OrmStore


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def memory_engine(registry: Registry) -> Engine:
    return Engine(store=MemoryStore(), registry=registry, enqueue=False)


@pytest.fixture
def orm_engine(registry: Registry, db: None) -> Engine:
    return Engine(store=OrmStore(), registry=registry, enqueue=False)


@pytest.fixture(params=["orm", "memory"])
def engine(request: pytest.FixtureRequest, registry: Registry, db: None) -> Engine:
    """An engine on the ORM store (the test database) and one on the memory store."""
    store = OrmStore() if request.param == "orm" else MemoryStore()
    return Engine(store=store, registry=registry, enqueue=False)


def echo(ctx, input):
    return {"echo": input}


def force_status(engine: Engine, run_id: str, status: str, **fields) -> None:
    """Put a run in ``status`` whatever it was, as a worker or an operator would."""
    assert engine.store.transition(run_id, RunStatus.values, status, **fields)


def boom(ctx, input):
    ctx.step("shout", str.upper, input.get("text", ""))
    raise RuntimeError("the reply service is down")


@pytest.fixture
def failing_workflow():
    """``tests.boom`` on the default engine, keyed like ``tests.echo`` (limit 3): its runs
    record one step, then fail."""
    from durable_django import Concurrency
    from durable_django import engine as default_engine

    definition = default_engine.register(
        "tests.boom",
        "1",
        boom,
        concurrency=Concurrency(key=lambda input: input.get("key"), limit=3),
    )
    yield definition
    default_engine.registry.remove(definition.name)


@pytest.fixture(scope="module")
def broker():
    """The Redis broker the worker tests send to. Without one they are skipped, except on
    CI (``CI`` set), where a missing broker is a failure."""
    import os

    import redis

    from .worker import app, broker_client

    client = broker_client()
    try:
        client.ping()
    except redis.RedisError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Redis broker at {app.conf.broker_url}: {error}")
    yield client
    client.close()
