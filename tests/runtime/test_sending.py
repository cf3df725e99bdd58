"""Run messages sent from the process's sender thread (``durable_django._runtime.sending``).

The sender itself is tested with real threads and a send function of the test's; the
starts' messages on a real broker (Redis; RabbitMQ too on PostgreSQL): handed over only
once the start commits, none for a refused or rolled-back start, inline when
``PUBLISH`` is ``"inline"``, under Celery's eager mode and under uWSGI without threads,
sent before a process exits, and never sent twice by a forked child.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest
from celery import Celery
from celery.app import app_or_default
from celery.signals import task_postrun
from django.db import transaction
from django.test import override_settings

from durable_django import ConcurrencyLimitError, Engine
from durable_django._runtime import sending
from durable_django._runtime.sending import Sender
from durable_django.tasks import execute_run

from ..brokers import Broker
from ..celery_app import app, broker_settings
from ..testapp.workflows import EchoWorkflow, plain
from ..worker import Worker, unique_queue

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A send function: records each batch and the thread that sent it; ``hold`` keeps
    the next send waiting until released."""

    def __init__(self, *, fail: bool = False) -> None:
        self.batches: list[list[tuple[str, str]]] = []
        self.threads: set[str] = set()
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail = fail

    def __call__(self, runs: object) -> None:
        self.entered.set()
        self.hold.wait(10)
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(runs))  # type: ignore[call-overload]
        if self.fail:
            raise ConnectionError("the broker is down")


def runs(*ids: str) -> list[tuple[str, str]]:
    return [(run_id, "q") for run_id in ids]


# the sender alone ---------------------------------------------------------------------


def test_messages_handed_over_while_a_send_is_under_way_go_in_the_next_batch_in_order() -> None:
    recorder = Recorder()
    recorder.hold.clear()
    sender = Sender(recorder)

    sender.hand_over(runs("a"))
    assert recorder.entered.wait(5)  # the thread took "a" and waits in its send
    sender.hand_over(runs("b", "c"))
    sender.hand_over(runs("d"))
    assert sender.waiting == 4
    recorder.hold.set()

    assert sender.flush(5)
    assert recorder.batches == [runs("a"), runs("b", "c", "d")]
    assert recorder.threads == {"durable-sender"}
    assert (sender.handed, sender.waiting) == (4, 0)


def test_a_batch_takes_at_most_the_limit() -> None:
    recorder = Recorder()
    recorder.hold.clear()
    sender = Sender(recorder, batch_limit=3)
    sender.hand_over(runs("first"))
    assert recorder.entered.wait(5)
    sender.hand_over(runs(*"abcdefg"))
    recorder.hold.set()

    assert sender.flush(5)
    assert [len(batch) for batch in recorder.batches] == [1, 3, 3, 1]
    assert [run_id for batch in recorder.batches for run_id, _ in batch] == ["first", *"abcdefg"]


def test_flush_gives_up_after_its_timeout_while_a_send_is_stuck() -> None:
    recorder = Recorder()
    recorder.hold.clear()
    sender = Sender(recorder)
    sender.hand_over(runs("stuck"))

    assert sender.flush(0.2) is False
    assert sender.waiting == 1
    recorder.hold.set()
    assert sender.flush(5)
    assert sender.waiting == 0


def test_a_send_that_fails_is_logged_and_the_next_messages_still_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder(fail=True)
    sender = Sender(recorder)
    with caplog.at_level(logging.ERROR, logger="durable_django"):
        sender.hand_over(runs("lost-1", "lost-2"))
        assert sender.flush(5)
    assert "could not send the messages of 2 run(s) (lost-1, lost-2)" in caplog.text
    assert "the tick sends them again" in caplog.text

    recorder.fail = False
    sender.hand_over(runs("next"))
    assert sender.flush(5)
    assert recorder.batches[-1] == runs("next")


def test_flush_with_nothing_handed_over_returns_at_once() -> None:
    assert Sender(Recorder()).flush(0)


def test_uwsgi_without_threads_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    """uWSGI runs an application's threads only with ``enable-threads`` (or ``threads``);
    it puts its own ``uwsgi`` module in ``sys.modules``."""
    assert sending.threads_run()
    monkeypatch.setitem(sys.modules, "uwsgi", types.SimpleNamespace(opt={}))
    assert not sending.threads_run()
    monkeypatch.setitem(sys.modules, "uwsgi", types.SimpleNamespace(opt={"enable-threads": True}))
    assert sending.threads_run()
    monkeypatch.setitem(sys.modules, "uwsgi", types.SimpleNamespace(opt={"threads": b"4"}))
    assert sending.threads_run()


def test_a_publish_mode_other_than_background_or_inline_is_refused() -> None:
    with pytest.raises(ValueError, match=r"DURABLE\['PUBLISH'\] must be one of"):
        _ = Engine(publish="sometimes").config
    with (
        override_settings(DURABLE={"PUBLISH": True}),
        pytest.raises(ValueError, match=r"DURABLE\['PUBLISH'\].*not True"),
    ):
        _ = Engine().config


# starts on a real broker --------------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """This process's sender, made anew with a send function that records each batch's
    ``(run_id, queue)`` and then sends it for real."""
    recorder = Recorder()

    def record_and_send(items: object) -> None:
        recorder([(run_id, run[1]) for run_id, run, *_ in items])  # type: ignore[attr-defined]
        sending._send_items(items)  # type: ignore[arg-type]

    monkeypatch.setattr(sending, "_sender", Sender(record_and_send))
    return recorder


def test_each_message_is_sent_with_the_celery_app_of_the_thread_that_handed_it_over(
    broker: Broker, recorded: Recorder
) -> None:
    """Celery's current app is per thread: a thread that did not make it current sees
    the default app. The sender thread sends with the publisher of the caller's app:
    here an app current in this thread only, whose default queue is the test's."""
    queue = unique_queue("durable-sending-app")
    caller = Celery("caller", set_as_current=True)
    caller.conf.update(
        broker_url=broker.url, task_default_queue=queue, **broker_settings(broker.url)
    )
    seen: list[str] = []
    try:
        thread = threading.Thread(target=lambda: seen.append(app_or_default(None).main))
        thread.start()
        thread.join()
        sending.send_later([("from-the-caller", "")])  # "": the app's default routing
        assert broker.queued_run_ids(queue) == ["from-the-caller"]
    finally:
        app.set_current()
        caller.close()
        broker.delete_queue(queue)
    assert recorded.threads == {"durable-sender"}
    assert seen == [app.main]  # what the sender thread would have seen as current


@pytest.mark.django_db(transaction=True)
def test_a_start_is_handed_to_the_sender_when_it_commits_and_sent_from_its_thread(
    idle_queue: str, broker: Broker, recorded: Recorder
) -> None:
    with transaction.atomic():
        handle = plain.dispatch({"n": 1})
        assert sending.sender().handed == 0  # not before the commit
    assert sending.sender().handed == 1

    assert broker.queued_run_ids(idle_queue) == [handle.run_id]
    assert recorded.batches == [[(handle.run_id, idle_queue)]]
    assert recorded.threads == {"durable-sender"}


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_or_refused_start_hands_nothing_over(
    idle_queue: str, broker: Broker, recorded: Recorder
) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        plain.dispatch({"n": 1})
        raise RuntimeError("the view failed")
    for _ in range(3):
        EchoWorkflow.dispatch({"key": "full"})
    with pytest.raises(ConcurrencyLimitError):
        EchoWorkflow.dispatch({"key": "full"})

    assert sending.sender().handed == 3
    assert len(broker.queued_run_ids(idle_queue)) == 3
    assert sum(len(batch) for batch in recorded.batches) == 3


@pytest.mark.django_db(transaction=True)
def test_a_batch_is_handed_over_in_one_piece(
    idle_queue: str, broker: Broker, recorded: Recorder
) -> None:
    batch = plain.dispatch_many([{"n": n} for n in range(5)])
    run_ids = [handle.run_id for handle in batch.handles if handle is not None]

    assert len(run_ids) == 5
    assert broker.queued_run_ids(idle_queue) == run_ids
    assert recorded.batches == [[(run_id, idle_queue) for run_id in run_ids]]


@pytest.mark.django_db(transaction=True)
def test_inline_publish_sends_before_the_start_returns(
    idle_queue: str, broker: Broker, recorded: Recorder
) -> None:
    with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": idle_queue, "PUBLISH": "inline"}):
        handle = plain.dispatch({"n": 1})
        assert broker.queued_run_ids(idle_queue) == [handle.run_id]
    assert sending.sender().handed == 0


@pytest.mark.django_db(transaction=True)
def test_under_uwsgi_without_threads_a_start_sends_inline(
    idle_queue: str, broker: Broker, recorded: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uwsgi", types.SimpleNamespace(opt={}))
    handle = plain.dispatch({"n": 1})
    assert sending.sender().handed == 0
    assert broker.queued_run_ids(idle_queue) == [handle.run_id]


@pytest.mark.django_db(transaction=True)
def test_in_celery_eager_mode_the_run_executes_in_the_caller(
    idle_queue: str, recorded: Recorder
) -> None:
    app.conf.task_always_eager = True
    try:
        handle = plain.dispatch({"n": 1})
    finally:
        app.conf.task_always_eager = False
    assert sending.sender().handed == 0
    assert handle.result() == {"got": {"n": 1}}


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """This process's sender, made anew with a recording send function that sends
    nothing: what is handed over to it directly is ``(run_id, queue)``."""
    recorder = Recorder()
    monkeypatch.setattr(sending, "_sender", Sender(recorder))
    return recorder


def test_a_worker_sends_what_a_task_handed_over_before_its_next_task(held: Recorder) -> None:
    """A pool process may be ended at any task's end: ``task_postrun`` waits for the
    messages its task handed over."""
    held.hold.clear()
    sending.sender().hand_over(runs("child"))
    assert held.entered.wait(5)
    threading.Timer(0.2, held.hold.set).start()

    task_postrun.send(sender=execute_run, task_id="t", task=execute_run, args=(), kwargs={})

    assert sending.sender().waiting == 0
    assert held.batches == [runs("child")]


def test_a_forked_child_neither_sends_nor_waits_for_its_parents_messages(held: Recorder) -> None:
    held.hold.clear()
    parent = sending.sender()
    parent.hand_over(runs("parent"))
    assert held.entered.wait(5)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            child = sending.sender()
            if child is not parent and child.handed == 0 and sending.flush(0):
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    held.hold.set()
    assert sending.flush(5)
    assert held.batches == [runs("parent")]


@pytest.mark.django_db(transaction=True)
def test_a_process_that_exits_right_after_its_start_still_sends_it(
    idle_queue: str, broker: Broker
) -> None:
    """The interpreter's exit waits for the sender: a script that dispatches and ends
    does not leave its run to the tick. The child's sender takes 0.3 s per send, so
    that without the wait at exit its message would never leave."""
    script = textwrap.dedent(
        f"""
        import time, django
        django.setup()
        import tests.celery_app  # the test broker, as a project's celery.py
        from durable_django._runtime import sending
        def slow(items):
            time.sleep(0.3)
            sending._send_items(items)
        sending._sender = sending.Sender(slow)
        from django.test import override_settings
        from tests.testapp.workflows import plain
        with override_settings(DURABLE={{"ENQUEUE": True, "QUEUE": {idle_queue!r}}}):
            print(plain.dispatch({{"n": 1}}).run_id)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=Worker("unused").environment(),  # this test's database and broker
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert broker.queued_run_ids(idle_queue) == [done.stdout.strip()]


@pytest.mark.django_db(transaction=True)
def test_when_the_thread_cannot_start_the_start_sends_inline(
    idle_queue: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the interpreter's exit no thread can start (``RuntimeError``): a start made
    then (an ``atexit`` hook dispatching) sends its message itself, nothing queued."""

    def no_thread() -> threading.Thread:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    fresh = Sender(sending._send_items)
    monkeypatch.setattr(fresh, "_start", no_thread)
    monkeypatch.setattr(sending, "_sender", fresh)

    handle = plain.dispatch({"n": 1})

    assert (fresh.handed, fresh.waiting) == (0, 0)
    assert broker.queued_run_ids(idle_queue) == [handle.run_id]
