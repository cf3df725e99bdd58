"""Fixtures: engines on each store, each with a registry of its own, a failing workflow,
and the brokers. Helpers the tests share live in ``tests/helpers.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from durable_django import Engine
from durable_django._rules.registry import Registry
from durable_django.stores import MemoryStore, OrmStore

from .helpers import Clock, boom, forget_kept_tickets

if TYPE_CHECKING:
    from .brokers import Broker


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


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Every ``timezone.now()`` reads this clock, which the test moves."""
    from django.utils import timezone

    driven = Clock()
    monkeypatch.setattr(timezone, "now", driven)
    return driven


@pytest.fixture
def kept_tickets_forgotten(django_db_blocker: Any) -> Iterator[None]:
    """Deletes every kept ticket after the test, once its transaction has rolled back:
    request it before ``db`` (off SQLite a refusal keeps its ticket on a connection of
    its own, committed, which the test's rollback does not undo)."""
    yield
    with django_db_blocker.unblock():
        forget_kept_tickets()


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


#: The brokers the worker tests run on. RabbitMQ's behaviour does not depend on the
#: database, so its variants run on PostgreSQL only, which keeps the suite's time in check.
BROKERS = ["redis", "rabbitmq"] if os.environ.get("DURABLE_TEST_DB") == "postgres" else ["redis"]


@pytest.fixture(scope="module", params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """The broker the worker tests and their workers send to, for the whole module
    (``tests.brokers``). Without one the tests are skipped, except on CI (``CI`` set),
    where a missing broker is a failure."""
    yield from _broker_in_use(request.param)


@pytest.fixture(scope="module")
def redis_broker() -> Iterator[Broker]:
    """``broker`` on Redis only: for tests whose subject is not the broker (faults of the
    database), run once."""
    yield from _broker_in_use("redis")


@pytest.fixture
def idle_queue(broker: Broker) -> Iterator[str]:
    """Starts of the default engine send their runs to a fresh queue that no worker
    consumes."""
    from django.test import override_settings

    from .worker import unique_queue

    queue = unique_queue("durable-idle")
    try:
        with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": queue}):
            yield queue
    finally:
        broker.delete_queue(queue)


def _broker_in_use(name: str) -> Iterator[Broker]:
    from .brokers import BY_NAME

    broker = BY_NAME[name]()
    try:
        try:
            broker.check()
        except Exception as error:
            if os.environ.get("CI"):
                raise
            pytest.skip(f"no {broker.name} broker at {broker.url}: {error}")
        with broker.in_use():
            yield broker
    finally:
        broker.close()


@pytest.fixture
def configured() -> Iterator[Any]:
    """``configure(**settings)`` sets Celery settings of the test app until the test ends
    (its router and run publisher are made anew)."""
    from durable_django._runtime.publishing import forget_publisher

    from .celery_app import app

    changed: dict[str, Any] = {}

    def configure(**settings: Any) -> None:
        for key, value in settings.items():
            changed.setdefault(key, app.conf[key])
            app.conf[key] = value
        app.amqp.flush_routes()  # Celery reads the routes once, and builds its router then
        app.amqp.router = app.amqp.Router()
        forget_publisher()

    try:
        yield configure
    finally:
        configure(**changed)
