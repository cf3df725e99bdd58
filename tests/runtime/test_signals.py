"""The Django signals: run started (on commit), refused, finished."""

from __future__ import annotations

import pytest
from django.db import transaction

from durable_django import ConcurrencyLimitError, Engine
from durable_django.signals import run_finished, run_refused, run_started
from durable_django.testing import run_until_idle


@pytest.fixture
def received():
    seen = []

    def receiver(signal, sender, **kwargs):
        seen.append((signal, kwargs))

    for signal in (run_started, run_refused, run_finished):
        signal.connect(receiver)
    yield seen
    for signal in (run_started, run_refused, run_finished):
        signal.disconnect(receiver)


def names(received):
    names = {run_started: "started", run_refused: "refused", run_finished: "finished"}
    return [names[signal] for signal, _ in received]


def test_started_refused_and_finished(memory_engine: Engine, received):
    engine = memory_engine
    engine.register("wf", "1", lambda ctx, i: i, concurrency={"key": lambda i: "k", "limit": 1})
    handle = engine.start("wf", 1)
    with pytest.raises(ConcurrencyLimitError):
        engine.start("wf", 2)
    run_until_idle(engine)
    assert names(received) == ["started", "refused", "finished"]
    started, refused, finished = (kwargs for _, kwargs in received)
    assert (started["run_id"], started["workflow"], started["namespace"]) == (
        handle.run_id,
        "wf",
        "default",
    )
    assert started["engine"] is engine
    assert refused["error"].key == "k" and refused["workflow"] == "wf"
    assert (finished["run_id"], finished["status"]) == (handle.run_id, "completed")


def test_a_cancel_is_a_finish_and_a_restart_starts_nothing(memory_engine: Engine, received):
    engine = memory_engine
    engine.register("wf", "1", lambda ctx, i: i)
    engine.start("wf", 1, "same")
    engine.start("wf", 1, "same")
    engine.cancel("same")
    assert names(received) == ["started", "finished"]
    assert received[1][1]["status"] == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_started_is_sent_only_when_the_start_commits(orm_engine: Engine, received):
    orm_engine.register("wf", "1", lambda ctx, i: i)
    with pytest.raises(RuntimeError), transaction.atomic():
        orm_engine.start("wf", 1)
        raise RuntimeError
    assert received == []
    with transaction.atomic():
        orm_engine.start("wf", 1)
        assert received == []
    assert names(received) == ["started"]


def test_a_receiver_connected_for_the_engine_class_hears_the_starts(memory_engine: Engine):
    heard = []

    def receiver(sender, **kwargs):
        heard.append((sender, kwargs["run_id"]))

    memory_engine.register("wf", "1", lambda ctx, i: i)
    run_started.connect(receiver, sender=Engine)
    try:
        one = memory_engine.start("wf", 1)
        two, three = memory_engine.start_many("wf", [2, 3]).started
    finally:
        run_started.disconnect(receiver, sender=Engine)
    assert heard == [(Engine, one.run_id), (Engine, two.run_id), (Engine, three.run_id)]


def test_a_receiver_connected_for_the_engine_class_hears_the_ends(memory_engine: Engine):
    heard = []

    def receiver(sender, **kwargs):
        heard.append((sender, kwargs["run_id"], kwargs["status"]))

    memory_engine.register("wf", "1", lambda ctx, i: i)
    run_finished.connect(receiver, sender=Engine)
    try:
        done = memory_engine.start("wf", 1)
        run_until_idle(memory_engine)
        cancelled = memory_engine.start("wf", 2)
        memory_engine.cancel(cancelled.run_id)
    finally:
        run_finished.disconnect(receiver, sender=Engine)
    assert heard == [
        (Engine, done.run_id, "completed"),
        (Engine, cancelled.run_id, "cancelled"),
    ]


def test_a_failing_receiver_is_logged_and_changes_nothing(memory_engine: Engine, caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    memory_engine.register(
        "wf", "1", lambda ctx, i: i, concurrency={"key": lambda i: "k", "limit": 0}
    )
    run_refused.connect(broken)
    try:
        with pytest.raises(ConcurrencyLimitError):
            memory_engine.start("wf", 1)
    finally:
        run_refused.disconnect(broken)
    assert "receiver" in caplog.text and "receiver bug" in caplog.text


def test_a_retry_refused_by_the_quota_is_refused_like_a_start(engine: Engine, received):
    engine.register("wf", "1", lambda ctx, i: 1 / 0, concurrency={"key": lambda i: "k", "limit": 1})
    failed = engine.start("wf", 1)
    run_until_idle(engine)
    engine.start("wf", 2)  # holds the key's one slot
    with pytest.raises(ConcurrencyLimitError):
        engine.retry(failed.run_id)
    # (The starts and the finish are sent on commit, which a test's transaction never does.)
    assert names(received).count("refused") == 1 and names(received)[-1] == "refused"
    refused = received[-1][1]
    assert (refused["workflow"], refused["error"].key, refused["error"].active) == ("wf", "k", 1)
    assert engine.get_run(failed.run_id).status == "failed"
