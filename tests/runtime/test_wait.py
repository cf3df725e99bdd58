"""Waiting a little for a quota slot (``wait=``): admitted when a slot frees, refused at
the deadline with nothing left, refused where it cannot work, in arrival order within a
process, and never over the limit. On every test database; the memory store too where
it applies."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections, transaction
from django.test import Client

from durable_django import ConcurrencyLimitError, DurableError, Engine, RunStatus, workflow
from durable_django import engine as default_engine
from durable_django._core.lifecycle import ACTIVE_STATUSES
from durable_django._runtime.waiting import MAX_WAIT_SECONDS, waiting_count
from durable_django.models import Run, RunTag
from durable_django.stores import OrmStore
from durable_django.testing import run_until_idle

from ..hammer import STORES
from ..helpers import echo, force_status

on_postgresql = connection.vendor == "postgresql"
postgresql_only = pytest.mark.skipif(not on_postgresql, reason="PostgreSQL's")
#: Generous bounds for waits on other threads; a correct run never gets near them.
PATIENCE = 30.0


def fresh_key() -> str:
    return f"wait:{uuid.uuid4().hex[:12]}"


def quota(key: str, limit: int = 1) -> dict[str, Any]:
    return {"key": key, "limit": limit}


def wait_until(predicate: Callable[[], bool], timeout: float = PATIENCE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def tagged(engine: Engine, key: str) -> list[str]:
    return sorted(run.run_id for run in engine.list_runs(tag=f"concurrency:{key}"))


@pytest.fixture
def thread_engine(registry: Any, transactional_db: None) -> Engine:
    """An ORM engine whose commits other threads see."""
    engine = Engine(registry=registry, store=OrmStore(), enqueue=False)
    engine.register("wait.echo", "1", echo)
    engine.config  # noqa: B018  (resolve the options once, before threads share it)
    return engine


def finish(engine: Engine, run_id: str) -> None:
    """Complete a run from a thread of its own, as a worker's turn would end it."""

    def target() -> None:
        try:
            force_status(engine, run_id, RunStatus.COMPLETED)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(PATIENCE)


# validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait", "error", "words"),
    [
        (-1, ValueError, ">= 0"),
        (float("nan"), ValueError, "finite"),
        (float("inf"), ValueError, "finite"),
        (MAX_WAIT_SECONDS + 1, ValueError, "at most 3600"),
        (timedelta(hours=2), ValueError, "at most 3600"),
        (timedelta(seconds=-1), ValueError, ">= 0"),
        ("5", TypeError, "number of seconds or a timedelta"),
        (True, TypeError, "number of seconds or a timedelta"),
    ],
)
def test_a_bad_wait_is_refused_before_anything_is_written(
    engine: Engine, wait: Any, error: type[Exception], words: str
) -> None:
    engine.register("wait.echo", "1", echo)
    with pytest.raises(error) as caught:
        engine.start("wait.echo", {}, concurrency=quota(fresh_key()), wait=wait)
    assert "wait must be" in str(caught.value) and words in str(caught.value)
    assert engine.list_runs() == []


def test_without_wait_a_full_quota_refuses_at_once(engine: Engine) -> None:
    engine.register("wait.echo", "1", echo)
    key = fresh_key()
    engine.start("wait.echo", {}, concurrency=quota(key))
    for wait in (None, 0, 0.0, timedelta(0)):
        with pytest.raises(ConcurrencyLimitError):
            engine.start("wait.echo", {}, concurrency=quota(key), wait=wait)
    assert len(tagged(engine, key)) == 1 and waiting_count() == 0


def test_a_free_slot_admits_at_once_and_an_unlimited_start_never_waits(
    thread_engine: Engine,
) -> None:
    engine = thread_engine
    assert engine.start("wait.echo", {}, concurrency=quota(fresh_key()), wait=5).created
    assert engine.start("wait.echo", {}, wait=timedelta(seconds=5)).created


# admitted on release, refused at the deadline --------------------------------------------


def test_a_waiter_is_admitted_when_a_slot_frees(thread_engine: Engine) -> None:
    engine = thread_engine
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))

    def release() -> None:
        try:
            wait_until(lambda: waiting_count() == 1)
            force_status(engine, holder.run_id, RunStatus.COMPLETED)
        finally:
            connections.close_all()

    thread = threading.Thread(target=release)
    thread.start()
    handle = engine.start("wait.echo", {"n": 2}, concurrency=quota(key), wait=PATIENCE)
    thread.join(PATIENCE)
    assert handle.created and handle.status == RunStatus.PENDING
    assert tagged(engine, key) == sorted([holder.run_id, handle.run_id])
    assert waiting_count() == 0


def test_a_start_of_several_quotas_waits_for_the_full_one(thread_engine: Engine) -> None:
    engine = thread_engine
    full, roomy = fresh_key(), fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(full))
    both = [quota(roomy, 5), quota(full)]
    timer = threading.Timer(0.2, finish, (engine, holder.run_id))
    timer.start()
    handle = engine.start("wait.echo", {}, concurrency=both, wait=PATIENCE)
    timer.join()
    assert handle.created
    assert tagged(engine, full) == sorted([holder.run_id, handle.run_id])
    assert tagged(engine, roomy) == [handle.run_id]
    assert waiting_count() == 0


def test_a_waiter_whose_time_passes_is_refused_and_leaves_nothing(thread_engine: Engine) -> None:
    engine = thread_engine
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))
    begun = time.monotonic()
    with pytest.raises(ConcurrencyLimitError) as caught:
        engine.start("wait.echo", {"n": 2}, "wait:late", concurrency=quota(key), wait=0.3)
    assert time.monotonic() - begun >= 0.3
    error = caught.value
    assert (error.key, error.limit, error.active) == (key, 1, 1)
    assert error.retry_after >= 1
    assert tagged(engine, key) == [holder.run_id]
    assert not Run.objects.filter(id="wait:late").exists()
    assert waiting_count() == 0


class AnswerLostStore(OrmStore):
    """The ORM store whose first start commits, and then loses its connection before the
    answer comes back (as when the database restarts at that moment)."""

    lost = 0

    def start_run(self, *args: Any, **kwargs: Any) -> Any:
        outcome = super().start_run(*args, **kwargs)
        if not self.lost:
            self.lost += 1
            connections[self.using].connection.close()  # the server went away
            raise OperationalError("server closed the connection unexpectedly")
        return outcome


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no connection to lose")
def test_a_waiting_start_whose_answer_was_lost_finds_its_run(thread_engine: Engine) -> None:
    engine = Engine(registry=thread_engine.registry, store=AnswerLostStore(), enqueue=False)
    key = fresh_key()
    handle = engine.start("wait.echo", {}, concurrency=quota(key, 2), wait=PATIENCE)
    assert engine.store.lost == 1  # type: ignore[attr-defined]
    assert handle.created
    assert tagged(engine, key) == [handle.run_id]  # one run, not two


class UnreachableListenerStore(OrmStore):
    """The ORM store whose listener's server cannot be reached (a port nothing serves)."""

    def release_listener(self, keys: Any) -> Any:
        import psycopg

        return psycopg.connect("host=127.0.0.1 port=1 connect_timeout=5")  # refused


@pytest.mark.skipif(not on_postgresql, reason="LISTEN/NOTIFY is PostgreSQL's")
def test_a_listener_that_cannot_open_leaves_the_start_polling(
    thread_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine(
        registry=thread_engine.registry, store=UnreachableListenerStore(), enqueue=False
    )
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))
    timer = threading.Timer(0.3, finish, (engine, holder.run_id))
    timer.start()
    handle = engine.start("wait.echo", {}, concurrency=quota(key), wait=PATIENCE)
    timer.join()
    assert handle.created
    assert "polling instead" in caplog.text


def test_the_memory_store_waits_by_polling(memory_engine: Engine) -> None:
    engine = memory_engine
    engine.register("wait.echo", "1", echo)
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))
    timer = threading.Timer(0.2, force_status, (engine, holder.run_id, RunStatus.COMPLETED))
    timer.start()
    handle = engine.start("wait.echo", {}, concurrency=quota(key), wait=PATIENCE)
    timer.join()
    assert handle.created


# refused where waiting cannot work ------------------------------------------------------


@pytest.mark.django_db
def test_wait_inside_a_transaction(orm_engine: Engine) -> None:
    """On PostgreSQL a waiting start may run in a transaction (each attempt in a
    savepoint), unless the transaction holds its key's lock already; elsewhere it is
    refused, naming the way out, before anything is written."""
    engine = orm_engine
    engine.register("wait.echo", "1", echo)
    key = fresh_key()
    with transaction.atomic():
        if on_postgresql:
            assert engine.start("wait.echo", {}, concurrency=quota(key, 2), wait=1).created
        with pytest.raises(DurableError) as caught:
            engine.start("wait.echo", {}, concurrency=quota(key, 2), wait=1)
    said = str(caught.value)
    assert "inside this transaction" in said and "transaction.non_atomic_requests" in said
    if on_postgresql:
        assert f"it holds the lock of quota key {key!r}" in said
        assert len(tagged(engine, key)) == 1
    else:
        assert "until the transaction ends" in said
        assert tagged(engine, key) == []
    # without wait, a start in a transaction is what it always was
    with transaction.atomic():
        assert engine.start("wait.echo", {}, concurrency=quota(fresh_key()), wait=0).created


@postgresql_only
def test_wait_is_refused_in_a_transaction_that_would_never_see_a_release(
    thread_engine: Engine,
) -> None:
    engine = thread_engine
    with transaction.atomic(), pytest.raises(DurableError) as caught:
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        engine.start("wait.echo", {}, concurrency=quota(fresh_key()), wait=1)
    assert "its isolation level, repeatable read, would never see a slot free" in str(caught.value)


@pytest.fixture
def atomic_requests(monkeypatch: pytest.MonkeyPatch, transactional_db: None) -> None:
    """``ATOMIC_REQUESTS`` on the default database, with commits other threads see."""
    monkeypatch.setitem(connections.settings[DEFAULT_DB_ALIAS], "ATOMIC_REQUESTS", True)


def freed_when_waiting(key: str, run_id: str, refused: list[int]) -> threading.Thread:
    """A thread that, once a start waits, starts on the same key without waiting (which
    a quota lock held by the waiting start would block until its transaction ends, and
    is otherwise refused at once, while the other still waits: ``refused`` gets how many
    wait then), and then completes ``run_id``."""

    def target() -> None:
        try:
            wait_until(lambda: waiting_count() == 1)
            try:
                default_engine.start("tests.echo", {}, concurrency=quota(key))
            except ConcurrencyLimitError:
                refused.append(waiting_count())
            force_status(default_engine, run_id, RunStatus.COMPLETED)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    return thread


@pytest.mark.urls("tests.wait_views")
def test_a_view_under_atomic_requests_waits_where_its_database_allows(
    atomic_requests: None, client: Client
) -> None:
    key = fresh_key()
    holder = default_engine.start("tests.echo", {}, concurrency=quota(key))
    if not on_postgresql:
        with pytest.raises(DurableError) as caught:
            client.get(f"/wait/{key}/")
        assert "transaction.non_atomic_requests" in str(caught.value)
        assert tagged(default_engine, key) == [holder.run_id]
        return
    refused: list[int] = []
    thread = freed_when_waiting(key, holder.run_id, refused)
    response = client.get(f"/wait/{key}/")
    thread.join(PATIENCE)
    assert response.status_code == 201
    assert refused == [1]  # the view's refused attempts held no lock while it waited
    assert tagged(default_engine, key) == sorted([holder.run_id, response.content.decode()])
    assert waiting_count() == 0


@postgresql_only
@pytest.mark.urls("tests.wait_views")
def test_a_view_under_atomic_requests_is_refused_at_its_deadline(
    atomic_requests: None, client: Client
) -> None:
    key = fresh_key()
    holder = default_engine.start("tests.echo", {}, concurrency=quota(key))
    response = client.get(f"/wait/{key}/?wait=0.2")
    assert (response.status_code, response.content.decode()) == (429, key)
    assert tagged(default_engine, key) == [holder.run_id]


@pytest.mark.urls("tests.wait_views")
def test_a_non_atomic_view_waits_on_every_database(atomic_requests: None, client: Client) -> None:
    key = fresh_key()
    holder = default_engine.start("tests.echo", {}, concurrency=quota(key))
    refused: list[int] = []
    thread = freed_when_waiting(key, holder.run_id, refused)
    response = client.get(f"/wait-outside/{key}/")
    thread.join(PATIENCE)
    assert response.status_code == 201 and refused == [1]
    assert tagged(default_engine, key) == sorted([holder.run_id, response.content.decode()])


def test_wait_inside_a_workflow_body_is_refused(engine: Engine) -> None:
    key = fresh_key()

    @workflow(name="wait.child", engine=engine)
    def child(ctx: Any, input: Any) -> Any:
        return input

    @workflow(name="wait.parent", engine=engine)
    def parent(ctx: Any, input: Any) -> Any:
        said = []
        for start in (
            lambda: child.dispatch({}, concurrency=quota(key), wait=1),
            lambda: child.start({}, concurrency=quota(key), wait=1),
            lambda: engine.start("wait.child", {}, concurrency=quota(key), wait=1),
        ):
            try:
                start()
            except DurableError as error:
                said.append(str(error))
        return said

    handle = parent.dispatch({})
    run_until_idle(engine)
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.COMPLETED
    assert len(run.output) == 3
    assert all("inside a workflow body" in said for said in run.output)
    assert tagged(engine, key) == []


# async ---------------------------------------------------------------------------------


def listening_backends(key: str) -> int:
    """How many connections are registered as waiters of ``key`` (and listen to it)."""
    from durable_django.stores.postgres.listening import WAITER_LOCK

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
            "AND l.classid = %s AND l.objid::text::bigint = hashtext(%s)::bigint & 4294967295 "
            "AND a.query LIKE '%%LISTEN%%'",
            [WAITER_LOCK, f"concurrency:{key}"],
        )
        return int(cursor.fetchone()[0])


def test_an_async_waiter_is_admitted_without_blocking_the_loop(thread_engine: Engine) -> None:
    engine = thread_engine
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))
    ticks: list[float] = []

    async def scenario() -> Any:
        task = asyncio.ensure_future(
            engine.astart("wait.echo", {}, concurrency=quota(key), wait=PATIENCE)
        )
        while waiting_count() == 0:
            await asyncio.sleep(0.005)
        for _ in range(5):  # the loop runs while the start waits
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)
        assert not task.done()
        threading.Thread(target=finish, args=(engine, holder.run_id)).start()
        return await task

    handle = async_to_sync(scenario)()
    assert handle.created and len(ticks) == 5
    assert tagged(engine, key) == sorted([holder.run_id, handle.run_id])


def test_a_cancelled_async_wait_leaves_nothing(thread_engine: Engine) -> None:
    engine = thread_engine
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))

    seen: list[int] = []

    async def scenario() -> None:
        task = asyncio.ensure_future(
            engine.astart("wait.echo", {}, "wait:cancelled", concurrency=quota(key), wait=PATIENCE)
        )
        while waiting_count() == 0:
            await asyncio.sleep(0.005)
        if on_postgresql:  # the listener is there while the start waits
            deadline = time.monotonic() + PATIENCE
            while not seen or (seen[-1] == 0 and time.monotonic() < deadline):
                seen.append(await asyncio.to_thread(listening_backends_closing, key))
        else:
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async_to_sync(scenario)()
    if on_postgresql:
        assert seen[-1] == 1
    assert waiting_count() == 0
    assert tagged(engine, key) == [holder.run_id]
    assert not Run.objects.filter(id="wait:cancelled").exists()
    if on_postgresql:
        wait_until(lambda: listening_backends(key) == 0)  # the listener's connection closed


def listening_backends_closing(key: str) -> int:
    try:
        return listening_backends(key)
    finally:
        connections.close_all()


# order ---------------------------------------------------------------------------------


def test_waiters_of_one_key_in_one_process_are_admitted_in_arrival_order(
    thread_engine: Engine,
) -> None:
    engine = thread_engine
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))
    admitted: list[tuple[int, str]] = []
    lock = threading.Lock()

    def waiter(n: int) -> None:
        try:
            handle = engine.start("wait.echo", {"n": n}, concurrency=quota(key), wait=PATIENCE)
            with lock:
                admitted.append((n, handle.run_id))
        finally:
            connections.close_all()

    threads = []
    for n in range(5):
        thread = threading.Thread(target=waiter, args=(n,))
        thread.start()
        threads.append(thread)
        wait_until(lambda n=n: waiting_count() == n + 1)
    current = holder.run_id
    for n in range(5):
        force_status(engine, current, RunStatus.COMPLETED)
        wait_until(lambda n=n: len(admitted) == n + 1)
        current = admitted[n][1]
    for thread in threads:
        thread.join(PATIENCE)
    assert [n for n, _ in admitted] == [0, 1, 2, 3, 4]
    assert waiting_count() == 0


# the hammer with waiters -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="a server database's concurrency")
@pytest.mark.parametrize("fast_path", STORES)
def test_waiters_mixed_with_starters_and_releases_never_over_admit(fast_path: bool) -> None:
    """Starters with and without ``wait`` released together on one key, while runs end:
    the key's counted runs never exceed the limit (sampled all along, and at the end),
    and each start is admitted or refused, a refused one leaving nothing."""
    from ..hammer_worker import WORKFLOW, make_engine

    limit, starters = 4, 24
    key = fresh_key()
    tag = f"concurrency:{key}"
    engine = make_engine(fast_path)
    barrier = threading.Barrier(starters + 1)
    outcomes: list[str] = []
    errors: list[BaseException] = []
    over: list[int] = []
    done = threading.Event()

    def starter(n: int) -> None:
        try:
            barrier.wait(PATIENCE)
            try:
                engine.start(
                    WORKFLOW,
                    {"n": n},
                    concurrency=quota(key, limit),
                    wait=None if n % 3 == 0 else 3.0,
                )
                outcomes.append("created")
            except ConcurrencyLimitError:
                outcomes.append("refused")
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    def releaser() -> None:
        try:
            barrier.wait(PATIENCE)
            while not done.is_set():
                active = list(
                    RunTag.objects.filter(tag=tag, status__in=ACTIVE_STATUSES).values_list(
                        "run_id", flat=True
                    )
                )
                if len(active) > limit:
                    over.append(len(active))
                if active:
                    time.sleep(0.01)
                    force_status(engine, active[0], RunStatus.COMPLETED)
                else:
                    time.sleep(0.005)
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=starter, args=(n,)) for n in range(starters)]
    threads.append(threading.Thread(target=releaser))
    for thread in threads:
        thread.start()
    for thread in threads[:-1]:
        thread.join(PATIENCE * 2)
    done.set()
    threads[-1].join(PATIENCE)
    assert not errors, errors
    assert not over
    assert len(outcomes) == starters
    created = outcomes.count("created")
    assert created > limit  # waiters were admitted as slots freed
    assert RunTag.objects.filter(tag=tag).count() == created == Run.objects.count()
    assert RunTag.objects.filter(tag=tag, status__in=ACTIVE_STATUSES).count() <= limit
    assert waiting_count() == 0


# the release notification (PostgreSQL) -------------------------------------------------


@postgresql_only
def test_a_run_leaving_an_active_status_notifies_its_keys_channel_on_commit(
    thread_engine: Engine,
) -> None:
    engine = thread_engine
    key, other = fresh_key(), fresh_key()
    store = engine.store
    first = engine.start("wait.echo", {}, concurrency=quota(key, 5), tags=["plain"])
    second = engine.start("wait.echo", {}, concurrency=quota(key, 5))
    elsewhere = engine.start("wait.echo", {}, concurrency=quota(other, 5))
    listener = store.release_listener([key])
    assert listener is not None
    with listener:
        # between active statuses: no slot frees
        force_status(engine, first.run_id, RunStatus.RUNNING)
        assert not listener.wait(0.2)
        # another key's release is not heard here
        force_status(engine, elsewhere.run_id, RunStatus.COMPLETED)
        assert not listener.wait(0.2)
        # a release rolled back is never heard
        with transaction.atomic():
            force_status(engine, first.run_id, RunStatus.COMPLETED)
            transaction.set_rollback(True)
        assert not listener.wait(0.2)
        assert engine.get_run(first.run_id).status == RunStatus.RUNNING
        # a release is heard once it commits
        force_status(engine, first.run_id, RunStatus.FAILED)
        assert listener.wait(PATIENCE)
        # and so is an active run deleted
        Run.objects.filter(id=second.run_id).delete()
        assert listener.wait(PATIENCE)
        assert not listener.wait(0.1)


@postgresql_only
def test_the_release_notification_carries_the_tag(thread_engine: Engine) -> None:
    import psycopg

    from durable_django.stores.postgres.listening import registration, release_channel

    engine = thread_engine
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as listening:
        listening.execute(registration([key]))
        force_status(engine, holder.run_id, RunStatus.CANCELLED)
        heard = list(listening.notifies(timeout=PATIENCE, stop_after=1))
    assert [(n.channel, n.payload) for n in heard] == [(release_channel(key), f"concurrency:{key}")]


def raw_connection(**options: Any) -> Any:
    """A psycopg connection of its own to the test database."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    return psycopg.connect(**params, **options)


@postgresql_only
def test_no_notification_is_sent_when_nobody_waits(thread_engine: Engine) -> None:
    from durable_django.stores.postgres.listening import release_channel

    engine = thread_engine
    alone, waited, after = fresh_key(), fresh_key(), fresh_key()
    holders = {
        key: [engine.start("wait.echo", {}, concurrency=quota(key, 5)).run_id for _ in range(2)]
        for key in (alone, waited, after)
    }
    channels = {release_channel(key): key for key in holders}
    with raw_connection(autocommit=True) as overhearing:
        # LISTEN without registering: hears what the trigger sends, never asks for it
        for channel in channels:
            overhearing.execute(f'LISTEN "{channel}"'.encode())

        def next_heard() -> str:
            (notification,) = overhearing.notifies(timeout=PATIENCE, stop_after=1)
            return channels[notification.channel]

        listener = engine.store.release_listener([waited])
        assert listener is not None
        with listener:
            force_status(engine, holders[alone][0], RunStatus.COMPLETED)  # nobody waits
            force_status(engine, holders[waited][0], RunStatus.COMPLETED)  # a waiter
            assert next_heard() == waited  # notifications come in commit order
            assert listener.wait(PATIENCE)
        # closed: the waiter is unregistered, and the next release of its key is silent
        second = engine.store.release_listener([after])
        assert second is not None
        with second:
            force_status(engine, holders[waited][1], RunStatus.COMPLETED)
            Run.objects.filter(id=holders[after][0]).delete()
            assert next_heard() == after


@postgresql_only
def test_a_release_that_found_no_waiter_is_seen_by_the_waiters_count(
    thread_engine: Engine,
) -> None:
    """The race: a release's trigger finds no waiter, then a waiter registers and counts
    before the release commits. Its registration waits for that commit, so its count,
    after, sees the slot free."""
    from durable_django.stores.postgres.listening import RELEASE_LOCK

    engine = thread_engine
    key = fresh_key()
    holder = engine.start("wait.echo", {}, concurrency=quota(key))
    opened: list[Any] = []

    def listen() -> None:
        opened.append(engine.store.release_listener([key]))

    with raw_connection() as releasing:
        releasing.execute(
            "UPDATE durable_run_tag SET status = 'completed' WHERE run_id = %s", [holder.run_id]
        )  # the trigger has run: nobody was registered, nothing will be sent
        thread = threading.Thread(target=listen)
        thread.start()

        def registration_waits() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND classid = %s AND NOT granted",
                    [RELEASE_LOCK],
                )
                return bool(cursor.fetchone()[0])

        wait_until(registration_waits)
        assert thread.is_alive() and not opened
        with pytest.raises(ConcurrencyLimitError):  # a count now would not see the slot
            engine.start("wait.echo", {}, concurrency=quota(key))
        releasing.commit()
        thread.join(PATIENCE)
    (listener,) = opened
    assert listener is not None
    with listener:
        # registered after the release: the count is what admits the start
        assert engine.start("wait.echo", {}, concurrency=quota(key)).created
        assert not listener.wait(0)


@postgresql_only
def test_a_waiter_whose_connection_dies_is_unregistered(thread_engine: Engine) -> None:
    engine = thread_engine
    key = fresh_key()
    listener = engine.store.release_listener([key])
    assert listener is not None
    with listener:
        assert listening_backends(key) == 1
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND query LIKE %s",
                [f"%concurrency:{key}%"],
            )
        wait_until(lambda: listening_backends(key) == 0)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_the_triggers_go_with_their_migration() -> None:
    from django.db.migrations.executor import MigrationExecutor

    def triggers() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'durable_run_tag'::regclass "
                "AND NOT tgisinternal ORDER BY tgname"
            )
            return [row[0] for row in cursor.fetchall()]

    both = ["durable_quota_release", "durable_quota_release_delete"]
    assert triggers() == both
    try:
        MigrationExecutor(connection).migrate([("durable_django", "0001_initial")])
        assert triggers() == []
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("durable_django"))
    assert triggers() == both


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="a server database's concurrency")
@pytest.mark.parametrize("fast_path", STORES)
def test_waiters_of_several_processes_never_over_admit(fast_path: bool) -> None:
    """Three processes of waiting starters (heads of three queues retrying at once) and
    this process ending runs: the key never holds more than its limit, and every start
    is admitted or refused."""
    import multiprocessing
    import queue as queues

    from .. import wait_worker

    processes, threads, limit = 3, 6, 3
    key = fresh_key()
    tag = f"concurrency:{key}"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes * threads + 1)
    results = context.Queue()
    db_name = connection.settings_dict["NAME"]
    children = [
        context.Process(
            target=wait_worker.process_main,
            args=(db_name, fast_path, key, limit, threads, 20.0, barrier, results),
        )
        for _ in range(processes)
    ]
    outcomes: list[str] = []
    over: list[int] = []
    engine = Engine(store=OrmStore(fast_path=fast_path), enqueue=False)
    try:
        for child in children:
            child.start()
        barrier.wait(PATIENCE * 2)
        reported = 0
        while reported < processes:
            active = list(
                RunTag.objects.filter(tag=tag, status__in=ACTIVE_STATUSES).values_list(
                    "run_id", flat=True
                )
            )
            if len(active) > limit:
                over.append(len(active))
            if active:
                force_status(engine, active[0], RunStatus.COMPLETED)
            try:
                outcomes.extend(results.get(timeout=0.01))
                reported += 1
            except queues.Empty:
                pass
    finally:
        for child in children:
            child.join(PATIENCE)
            if child.is_alive():
                child.kill()
    errors = [o for o in outcomes if o not in ("created", "refused")]
    assert not errors, "\n\n".join(errors)
    assert not over
    assert len(outcomes) == processes * threads
    created = outcomes.count("created")
    assert created > limit
    assert RunTag.objects.filter(tag=tag).count() == created
