"""Event triggers: every subscriber starts under its own quota; refusals are skipped."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from celery.exceptions import WorkerShutdown
from django.db import DatabaseError, connection

from durable_django import ConcurrencyLimitError, Engine
from durable_django._rules.registry import Registry
from durable_django._runtime.events import event_run_id
from durable_django.signals import event_skipped
from durable_django.stores import OrmStore
from durable_django.testing import run_until_idle


def subscribe(engine: Engine, name: str, limit: int | None = None) -> None:
    concurrency = (
        None if limit is None else {"key": lambda i: f"{name}:{i['tenant']}", "limit": limit}
    )
    engine.register(
        name, "1", lambda ctx, i: {name: i}, on_event=["payment.settled"], concurrency=concurrency
    )


def test_every_subscriber_starts_with_the_payload(engine: Engine):
    subscribe(engine, "receipt")
    subscribe(engine, "ledger")
    engine.register("unrelated", "1", lambda ctx, i: None, on_event=["other"])
    result = engine.publish_event("payment.settled", {"tenant": "acme", "amount": 5})
    assert sorted(h.workflow for h in result.started) == ["ledger", "receipt"]
    assert result.skipped == []
    run_until_idle(engine)
    assert [h.result() for h in sorted(result.started, key=lambda h: h.workflow)] == [
        {"ledger": {"tenant": "acme", "amount": 5}},
        {"receipt": {"tenant": "acme", "amount": 5}},
    ]
    assert engine.publish_event("nobody.listens", {}).started == []


def test_a_refused_subscriber_is_skipped_and_the_others_start(engine: Engine):
    skipped = []

    def receiver(sender, **kwargs):
        skipped.append(kwargs)

    subscribe(engine, "receipt", limit=1)
    subscribe(engine, "ledger")
    engine.publish_event("payment.settled", {"tenant": "acme"})
    event_skipped.connect(receiver)
    try:
        result = engine.publish_event("payment.settled", {"tenant": "acme"}, id="evt-2")
    finally:
        event_skipped.disconnect(receiver)
    assert [h.workflow for h in result.started] == ["ledger"]
    [(workflow, error)] = result.skipped
    assert workflow == "receipt" and isinstance(error, ConcurrencyLimitError)
    assert (error.key, error.limit, error.active) == ("receipt:acme", 1, 1)
    assert skipped[0]["workflow"] == "receipt" and skipped[0]["event_id"] == "evt-2"
    assert skipped[0]["event"] == "payment.settled" and skipped[0]["error"] is error
    # Nothing was created for the refused subscriber.
    assert engine.count_runs(tag="concurrency:receipt:acme") == 1


def test_a_republished_event_id_starts_nothing_new_and_is_not_refused(engine: Engine):
    subscribe(engine, "receipt", limit=1)
    first = engine.publish_event("payment.settled", {"tenant": "acme"}, id="evt-1")
    again = engine.publish_event("payment.settled", {"tenant": "acme"}, id="evt-1")
    assert [h.created for h in first.started] == [True]
    assert [h.created for h in again.started] == [False] and again.skipped == []
    assert (
        again.started[0].run_id == first.started[0].run_id == "event:payment.settled:evt-1:receipt"
    )
    assert len(engine.list_runs()) == 1


def test_a_subscriber_whose_key_function_fails_is_skipped(engine: Engine):
    subscribe(engine, "receipt", limit=5)  # its key needs input["tenant"]
    subscribe(engine, "ledger")
    result = engine.publish_event("payment.settled", {"amount": 1})
    assert [h.workflow for h in result.started] == ["ledger"]
    assert result.skipped[0][0] == "receipt"
    assert "key function raised KeyError" in str(result.skipped[0][1])


def test_bad_publishes_are_refused_whole(engine: Engine):
    subscribe(engine, "receipt")
    with pytest.raises(TypeError, match="JSON-serialisable"):
        engine.publish_event("payment.settled", {"when": object()})
    with pytest.raises(ValueError, match="event name"):
        engine.publish_event("", {})
    with pytest.raises(ValueError, match="event id"):
        engine.publish_event("payment.settled", {}, id="")
    assert engine.list_runs() == []


def test_long_event_ids_are_hashed_into_a_run_id():
    run_id = event_run_id("e", "x" * 400, "wf")
    assert run_id.startswith("event:") and len(run_id) <= 255
    assert run_id == event_run_id("e", "x" * 400, "wf") != event_run_id("e", "y" * 400, "wf")


# one transaction per publish -------------------------------------------------------------


class Interrupted(WorkerShutdown):
    """The worker stopping while a key function runs: nobody's refusal nor failure, it
    passes on (any other error of a key function skips its subscriber)."""


def test_an_unexpected_error_on_the_second_subscriber_creates_nothing(engine: Engine):
    def interrupted(input):
        raise Interrupted("stopped mid-publish")

    subscribe(engine, "a-first", limit=5)
    engine.register(
        "b-second",
        "1",
        lambda ctx, i: i,
        on_event=["payment.settled"],
        concurrency={"key": interrupted, "limit": 5},
    )
    with pytest.raises(Interrupted):
        engine.publish_event("payment.settled", {"tenant": "acme"})
    assert engine.list_runs() == []


@pytest.fixture
def sent_to(redis_broker) -> Iterator[tuple[Engine, str]]:
    """An engine on the ORM store sending its runs to a queue nobody consumes."""
    from ..worker import unique_queue

    queue = unique_queue("durable-publish")
    try:
        yield Engine(store=OrmStore(), registry=Registry(), enqueue=True, queue=queue), queue
    finally:
        redis_broker.delete_queue(queue)


@pytest.mark.django_db(transaction=True)
def test_a_subscriber_the_database_refuses_undoes_the_whole_publish(sent_to, redis_broker):
    """The second subscriber's run (in the order of the quota keys) is refused by the
    database: the first one's run is rolled back with it, and no message goes out."""
    from ..database_refusal import MESSAGE, runs_refused

    engine, queue = sent_to
    subscribe(engine, "a-first", limit=5)  # key a-first:acme: started first
    subscribe(engine, "b-second", limit=5)  # key b-second:acme
    with runs_refused("b-second"), pytest.raises(DatabaseError, match=MESSAGE):
        engine.publish_event("payment.settled", {"tenant": "acme"}, id="evt-1")
    assert engine.list_runs() == []
    assert redis_broker.queued_count(queue) == 0

    # Published again once the database takes it: every subscriber starts, once.
    result = engine.publish_event("payment.settled", {"tenant": "acme"}, id="evt-1")
    assert sorted((h.workflow, h.created) for h in result.started) == [
        ("a-first", True),
        ("b-second", True),
    ]
    assert redis_broker.queued_count(queue) == 2


@pytest.mark.django_db(transaction=True)
def test_publishes_sharing_keys_in_opposite_orders_never_deadlock(registry: Registry):
    """Two events whose subscribers, in their registration order, take the same two keys
    in opposite orders; each publish holds its keys' locks until it commits."""
    engines = [Engine(store=OrmStore(), registry=registry, enqueue=False) for _ in range(8)]
    for event, keys in (("one", ["k:b", "k:a"]), ("two", ["k:a", "k:b"])):
        for key in keys:
            engines[0].register(
                f"{event}-{key}",
                "1",
                lambda ctx, i: i,
                on_event=[event],
                concurrency={"key": lambda i, key=key: key, "limit": 1000},
            )
    rounds = 5
    barrier = threading.Barrier(len(engines))
    errors: list[BaseException] = []

    def publish(n: int) -> None:
        try:
            for round in range(rounds):
                barrier.wait(60)
                result = engines[n].publish_event("one" if n % 2 else "two", {"n": n, "r": round})
                assert len(result.started) == 2 and result.skipped == []
        except BaseException as error:
            errors.append(error)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(len(engines))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert engines[0].count_runs() == 2 * rounds * len(engines)
