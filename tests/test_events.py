"""Event triggers: every subscriber starts under its own quota; refusals are skipped."""

from __future__ import annotations

import pytest

from durable_django import ConcurrencyLimitError, Engine
from durable_django.events import event_run_id
from durable_django.signals import event_skipped
from durable_django.testing import run_until_idle

pytestmark = pytest.mark.quota


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
