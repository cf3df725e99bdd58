"""The quota under real concurrency: many starters released together against one key.

Whatever the interleaving, a key with limit 8 admits exactly 8 runs; the others are
refused with ``ConcurrencyLimitError`` and leave nothing behind. Starts of other keys do
not wait for an open start; starts of the same key do, and then count what it committed.
Runs moving between counted statuses while others start neither open nor close a slot.
Runs on every database the suite supports (``DURABLE_TEST_DB``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from durable_django import ConcurrencyLimitError
from durable_django.models import QuotaLock, Run, RunTag, Signal
from durable_django.stores.orm import is_deadlock
from tests.hammer_worker import (
    WORKFLOW,
    Outcome,
    make_engine,
    process_main,
    run_threads,
    start_once,
)
from tests.hammering import reports_of
from tests.testapp.workflows import EchoWorkflow

from ..hammer import (
    LIMIT,
    PATIENCE,
    STORES,
    THREADS,
    TRIALS,
    assert_no_errors,
    assert_trials,
    fresh_keys,
    tag_of,
)

ECHO = EchoWorkflow.durable.definition

pytestmark = pytest.mark.slow

PROCESSES = 4
THREADS_PER_PROCESS = 8

on_sqlite = connection.vendor == "sqlite"
on_postgresql = connection.vendor == "postgresql"

server_only = pytest.mark.skipif(
    on_sqlite,
    reason="SQLite has one database-wide write lock: every start waits for any open one",
)


# the thread hammer ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", STORES)
def test_threads_released_together_admit_exactly_the_limit(fast_path: bool) -> None:
    engine = make_engine(fast_path)
    keys = fresh_keys(TRIALS)
    barrier = threading.Barrier(THREADS)

    outcomes = run_threads(engine, "t", keys, LIMIT, THREADS, barrier, PATIENCE)

    assert_trials(outcomes, keys, THREADS)
    assert Run.objects.count() == LIMIT * TRIALS
    assert RunTag.objects.count() == LIMIT * TRIALS


#: Starters and trials of the hammer on brand-new keys at small limits.
FRESH_THREADS = 16
FRESH_TRIALS = 40


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("limit", [0, 1])
@pytest.mark.parametrize("fast_path", STORES)
def test_starts_on_brand_new_keys_create_or_are_refused(fast_path: bool, limit: int) -> None:
    """Every start of a key no start has locked before either creates a run or raises
    ``ConcurrencyLimitError``, never a database error (such as a deadlock), and never more
    than ``limit`` are created. With limit 0 every start is refused, so nothing any of
    them wrote is ever committed."""
    engine = make_engine(fast_path)
    keys = fresh_keys(FRESH_TRIALS)
    barrier = threading.Barrier(FRESH_THREADS)

    outcomes = run_threads(engine, "n", keys, limit, FRESH_THREADS, barrier, PATIENCE)

    assert_trials(outcomes, keys, FRESH_THREADS, limit)
    assert Run.objects.count() == limit * FRESH_TRIALS


def _start_in_open_transaction(
    engine: Any,
    name: str,
    keys: list[str],
    limit: int,
    barrier: threading.Barrier,
    out: list[Outcome],
) -> None:
    """A starter inside a transaction that has already read, as under ``ATOMIC_REQUESTS``.

    On a server database every starter reads before the others are released, so all of
    them read before any of them commits. SQLite's transactions take the write lock as they
    begin, so there the starters are released before they open theirs.
    """
    try:
        for trial, key in enumerate(keys):
            if on_sqlite:
                barrier.wait(PATIENCE)
            with transaction.atomic():
                # Read before the start, as a view would (its tenant, its user...).
                Run.objects.filter(tag_rows__tag=tag_of(key)).count()
                if not on_sqlite:
                    barrier.wait(PATIENCE)
                out.append(start_once(engine, trial, name, key, limit))
    except Exception as error:
        out.append(Outcome(-1, name, "error", detail=repr(error)))
        barrier.abort()
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("limit", [LIMIT, 0])
@pytest.mark.parametrize("fast_path", STORES)
def test_starts_inside_transactions_that_already_read(fast_path: bool, limit: int) -> None:
    """Also at limit 0, where every start is refused, on keys never started before."""
    engine = make_engine(fast_path)
    keys = fresh_keys(TRIALS // 2)
    barrier = threading.Barrier(THREADS // 2)
    outcomes: list[Outcome] = []
    threads = [
        threading.Thread(
            target=_start_in_open_transaction,
            args=(engine, f"a{n}", keys, limit, barrier, outcomes),
        )
        for n in range(THREADS // 2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert_trials(outcomes, keys, THREADS // 2, limit)


# the process hammer --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", STORES)
def test_processes_released_together_admit_exactly_the_limit(fast_path: bool) -> None:
    context = multiprocessing.get_context("spawn")
    keys = fresh_keys(TRIALS)
    starters = PROCESSES * THREADS_PER_PROCESS
    barrier = context.Barrier(starters)
    results = context.Queue()
    db_name = connection.settings_dict["NAME"]
    children = [
        context.Process(
            target=process_main,
            args=(
                db_name,
                fast_path,
                index,
                keys,
                LIMIT,
                THREADS_PER_PROCESS,
                barrier,
                PATIENCE * 2,  # the first wait also covers each child's start-up
                results,
            ),
            name=f"hammer-process-{index}",
        )
        for index in range(PROCESSES)
    ]
    outcomes: list[Outcome] = reports_of(children, results, PATIENCE * 4)

    assert_trials(outcomes, keys, starters)
    assert [child.exitcode for child in children] == [0] * PROCESSES
    assert Run.objects.count() == LIMIT * TRIALS


# lock scope: other keys go on, the same key waits ----------------------------------------


def _session_id() -> int:
    """This thread's database session, as the server's lock views name it."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        else:
            cursor.execute("SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


def _is_waiting_on_a_lock(session: int) -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [session])
            row = cursor.fetchone()
            return row is not None and row[0] == "Lock"
        cursor.execute(
            "SELECT trx_state FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = %s",
            [session],
        )
        row = cursor.fetchone()
        return row is not None and row[0] == "LOCK WAIT"


class OpenStart(threading.Thread):
    """Starts a run under ``key`` inside ``atomic()`` and keeps it open until released."""

    def __init__(self, engine: Any, key: str, limit: int) -> None:
        super().__init__(name="open-start")
        self.engine, self.key, self.limit = engine, key, limit
        self.started = threading.Event()
        self.release = threading.Event()
        self.committing = threading.Event()
        self.outcome: Outcome | None = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with transaction.atomic():
                self.outcome = start_once(self.engine, 0, "open", self.key, self.limit)
                self.started.set()
                assert self.release.wait(PATIENCE), "never released"
                self.committing.set()  # set before the commit: later starts must see it set
        except BaseException as error:
            self.failure = error
        finally:
            self.started.set()
            connection.close()


class Starter(threading.Thread):
    """Starts one run under ``key``; notes whether the open start was committing by then."""

    def __init__(self, engine: Any, key: str, limit: int, opener: OpenStart, watch: bool) -> None:
        super().__init__(name=f"start-{key}")
        self.engine, self.key, self.limit, self.opener, self.watch = (
            engine,
            key,
            limit,
            opener,
            watch,
        )
        self.ready = threading.Event()
        self.done = threading.Event()
        self.session: int | None = None
        self.outcome: Outcome | None = None
        self.opener_committing_after: bool | None = None

    def run(self) -> None:
        try:
            if self.watch:
                self.session = _session_id()
            self.ready.set()
            self.outcome = start_once(self.engine, 0, self.name, self.key, self.limit)
            self.opener_committing_after = self.opener.committing.is_set()
        finally:
            self.ready.set()
            self.done.set()
            connection.close()


def _prepare_keys(engine: Any, keys: list[str], known: bool) -> int:
    """With ``known``, give each key one committed run (and its lock row) beforehand."""
    if not known:
        return 0
    for key in keys:
        assert start_once(engine, 0, "before", key, LIMIT).kind == "created"
    return 1


@server_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("known", [False, True], ids=["new-keys", "known-keys"])
@pytest.mark.parametrize("fast_path", STORES)
def test_a_start_of_another_key_does_not_wait(fast_path: bool, known: bool) -> None:
    engine = make_engine(fast_path)
    # Neighbouring keys: B sorts just before A, in the gap next to A's lock row.
    prefix = f"hammer:{uuid.uuid4().hex[:12]}"
    key_a, key_b = f"{prefix}:b", f"{prefix}:a"
    before = _prepare_keys(engine, [key_a, key_b], known)
    opener = OpenStart(engine, key_a, LIMIT)
    other = Starter(engine, key_b, LIMIT, opener, watch=False)
    try:
        opener.start()
        assert opener.started.wait(PATIENCE)
        assert opener.failure is None and opener.outcome is not None
        assert opener.outcome.kind == "created", opener.outcome

        other.start()
        assert other.done.wait(PATIENCE), "a start of key B waited for the open start of key A"
        assert not opener.committing.is_set()
        assert other.outcome is not None and other.outcome.kind == "created", other.outcome
        assert other.opener_committing_after is False
    finally:
        opener.release.set()
        opener.join(PATIENCE)
        other.join(PATIENCE)
    assert opener.failure is None
    assert engine.count_runs(tag=tag_of(key_a)) == before + 1
    assert engine.count_runs(tag=tag_of(key_b)) == before + 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("known", [False, True], ids=["new-key", "known-key"])
@pytest.mark.parametrize("fast_path", STORES)
def test_a_start_of_the_same_key_waits_then_counts_the_commit(fast_path: bool, known: bool) -> None:
    engine = make_engine(fast_path)
    key = fresh_keys(1)[0]
    before = _prepare_keys(engine, [key], known)
    limit = before + 1  # the open start fills the key
    opener = OpenStart(engine, key, limit)
    waiter = Starter(engine, key, limit, opener, watch=not on_sqlite)
    try:
        opener.start()
        assert opener.started.wait(PATIENCE)
        assert opener.failure is None and opener.outcome is not None
        assert opener.outcome.kind == "created", opener.outcome

        waiter.start()
        assert waiter.ready.wait(PATIENCE)
        if on_sqlite:
            # No lock view to ask: give the start a moment in which it must not finish.
            assert not waiter.done.wait(0.5)
        else:
            assert waiter.session is not None
            deadline = time.monotonic() + PATIENCE
            while not _is_waiting_on_a_lock(waiter.session):
                # InnoDB refreshes its lock views only when left unread for 100 ms.
                assert not waiter.done.wait(0.25), "the second start of the key did not wait"
                assert time.monotonic() < deadline, "the second start never waited on a lock"
        assert not waiter.done.is_set()
    finally:
        opener.release.set()
        opener.join(PATIENCE)
        waiter.join(PATIENCE)
    assert opener.failure is None
    assert waiter.opener_committing_after is True, "the second start finished before the commit"
    outcome = waiter.outcome
    assert outcome is not None and outcome.kind == "refused", outcome
    assert (outcome.key, outcome.limit, outcome.active) == (key, limit, limit)
    assert engine.count_runs(tag=tag_of(key)) == limit


# a start chosen as the victim of a deadlock ------------------------------------------------


class RunIdHolder(threading.Thread):
    """A transaction of its own that inserts run ``run_id`` (and many other rows, so that
    the database picks the other side of a deadlock as its victim), then, once told to,
    takes the lock of quota ``key`` as a start would, and commits."""

    def __init__(self, run_id: str, key: str) -> None:
        super().__init__(name="run-id-holder")
        self.run_id, self.key = run_id, key
        self.inserted = threading.Event()
        self.take_key = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if on_postgresql:
                    # PostgreSQL rolls back the waiter whose deadlock check runs first:
                    # make it the start's.
                    cursor.execute("SET LOCAL deadlock_timeout = '60s'")
                Run.objects.create(id=self.run_id, workflow=WORKFLOW, version="1", input={})
                Signal.objects.bulk_create(Signal(token=f"weight:{n}") for n in range(200))
                self.inserted.set()
                assert self.take_key.wait(PATIENCE), "never told to take the key"
                if on_postgresql:
                    cursor.execute("SELECT durable_lock_quota_key_v1(%s)", [self.key])
                else:
                    QuotaLock.objects.filter(key=self.key).update(last_start_at=timezone.now())
        except BaseException as error:
            self.failure = error
        finally:
            self.inserted.set()
            connection.close()


class DeadlockedStarter(threading.Thread):
    """Starts run ``run_id`` under ``key``, inside a transaction of its own or not."""

    def __init__(self, engine: Any, run_id: str, key: str, inside_transaction: bool) -> None:
        super().__init__(name="deadlocked-starter")
        self.engine, self.run_id, self.key = engine, run_id, key
        self.inside_transaction = inside_transaction
        self.ready = threading.Event()
        self.session: int | None = None
        self.handle: Any = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.session = _session_id()
            if on_postgresql:
                # Its deadlock check must come after the holder waits for the key: it
                # runs once per wait, after deadlock_timeout.
                with connection.cursor() as cursor:
                    cursor.execute("SET deadlock_timeout = '5s'")
            self.ready.set()
            with transaction.atomic() if self.inside_transaction else contextlib.nullcontext():
                self.handle = self.engine.start(
                    WORKFLOW, {}, run_id=self.run_id, concurrency={"key": self.key, "limit": LIMIT}
                )
        except BaseException as error:
            self.failure = error
        finally:
            self.ready.set()
            connection.close()


@server_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "inside_transaction", [False, True], ids=["own-transaction", "caller-transaction"]
)
@pytest.mark.parametrize("fast_path", STORES)
def test_a_start_chosen_as_the_victim_of_a_deadlock(
    fast_path: bool, inside_transaction: bool
) -> None:
    """The start holds the key's lock and waits for the run id another transaction is
    inserting; that transaction then waits for the key: a deadlock, which the database
    breaks by rolling back the start. Tried again, the start finds the other's run.
    Inside a transaction of the caller's, rolled back whole, the error is raised with a
    note saying so."""
    engine = make_engine(fast_path)
    key = fresh_keys(1)[0]
    assert start_once(engine, 0, "before", key, LIMIT).kind == "created"  # the key is known
    run_id = f"deadlock:{uuid.uuid4().hex}"
    holder = RunIdHolder(run_id, key)
    starter = DeadlockedStarter(engine, run_id, key, inside_transaction)
    try:
        holder.start()
        assert holder.inserted.wait(PATIENCE) and holder.failure is None, holder.failure
        starter.start()
        assert starter.ready.wait(PATIENCE) and starter.session is not None
        deadline = time.monotonic() + PATIENCE
        while not _is_waiting_on_a_lock(starter.session):
            assert starter.is_alive(), f"the start did not wait: {starter.failure!r}"
            assert time.monotonic() < deadline, "the start never waited for the run id"
            time.sleep(0.1)
        holder.take_key.set()
    finally:
        holder.take_key.set()
        holder.join(PATIENCE)
        starter.join(PATIENCE)
    # The holder got the key: the database rolled back the start, not the holder.
    assert holder.failure is None, holder.failure
    if inside_transaction:
        error = starter.failure
        assert isinstance(error, OperationalError) and is_deadlock(error), repr(error)
        assert "rolled back the whole transaction it ran in" in "".join(error.__notes__)
    else:
        assert starter.failure is None, starter.failure
        assert (starter.handle.run_id, starter.handle.created) == (run_id, False)
    assert list(Run.objects.filter(pk=run_id).values_list("workflow", "input")) == [(WORKFLOW, {})]


# idempotent re-starts under contention ---------------------------------------------------


def _restart(
    engine: Any,
    run_id: str,
    key: str,
    barrier: threading.Barrier,
    out: list[tuple[str, Any]],
) -> None:
    try:
        barrier.wait(PATIENCE)
        handle = engine.start(ECHO, {"key": key, "text": "again"}, run_id=run_id)
        out.append(("handle", handle))
    except ConcurrencyLimitError as error:
        out.append(("refused", error))
    except Exception as error:
        out.append(("error", error))
        barrier.abort()
    finally:
        connection.close()


def _restart_wave(engine: Any, run_id: str, key: str) -> list[tuple[str, Any]]:
    barrier = threading.Barrier(THREADS)
    out: list[tuple[str, Any]] = []
    threads = [
        threading.Thread(target=_restart, args=(engine, run_id, key, barrier, out))
        for _ in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("others", [0, 2], ids=["room-left", "fills-the-key"])
@pytest.mark.parametrize("fast_path", STORES)
def test_concurrent_restarts_of_one_run_id_create_it_once(fast_path: bool, others: int) -> None:
    engine = make_engine(fast_path)
    key = fresh_keys(1)[0]
    (declared,) = ECHO.concurrency
    limit = declared.limit
    assert others < limit
    for n in range(others):
        engine.start(ECHO, {"key": key, "text": str(n)})
    run_id = f"restart:{uuid.uuid4().hex}"

    first = _restart_wave(engine, run_id, key)
    # Once the key is full, a second wave re-starts the run again: still never refused.
    second = _restart_wave(engine, run_id, key) if others + 1 == limit else []

    for wave in (first, second):
        assert not [r for r in wave if r[0] != "handle"], wave
    created = [h for _, h in first if h.created]
    assert len(created) == 1
    assert not [h for _, h in second if h.created]
    assert {(h.run_id, h.workflow) for _, h in first + second} == {(run_id, ECHO.name)}
    assert Run.objects.filter(pk=run_id).count() == 1
    assert RunTag.objects.filter(run_id=run_id).count() == 1
    assert engine.count_runs(tag=tag_of(key)) == others + 1
    assert QuotaLock.objects.filter(key=key).count() <= 1


# status changes of counted runs during starts ---------------------------------------------

#: Moves between counted statuses, half of them back to ``pending``: a count that reads
#: the statuses one after another at different moments could miss or double-count a run.
FLIPS = ("blocked", "pending", "suspended", "pending", "running", "pending")


def _flip_statuses(
    residents: list[list[str]], trial: list[int], stop: threading.Event, out: list[str]
) -> None:
    """Move the current trial's residents between counted statuses until ``stop`` is set.

    Each move changes the runs and their tags' copy of the status in one transaction, as
    a worker does, all of them at once so that a count caught in the middle is far off.
    On SQLite the moves pause between each other: the writer that never lets go of the
    database lock would starve the starters, whose busy handler sleeps while it waits.
    """
    pause = 0.01 if on_sqlite else 0.0
    try:
        step = 0
        while not stop.wait(pause):
            run_ids = residents[trial[0]]
            status = FLIPS[step % len(FLIPS)]
            with transaction.atomic():
                Run.objects.filter(pk__in=run_ids).update(status=status)
                RunTag.objects.filter(run_id__in=run_ids).update(status=status)
            step += 1
    except Exception as error:
        out.append(repr(error))
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", STORES)
def test_runs_changing_status_during_starts_open_no_slot(fast_path: bool) -> None:
    engine = make_engine(fast_path)
    keys = fresh_keys(TRIALS)
    residents = [
        [start_once(engine, -1, "resident", key, LIMIT).run_id for _ in range(LIMIT - 1)]
        for key in keys
    ]
    trial = [0]
    passes = iter(range(len(keys)))
    # Each release of the starters points the flips at that trial's residents.
    barrier = threading.Barrier(THREADS, action=lambda: trial.__setitem__(0, next(passes)))
    stop = threading.Event()
    failures: list[str] = []
    flipper = threading.Thread(target=_flip_statuses, args=(residents, trial, stop, failures))
    flipper.start()
    try:
        outcomes = run_threads(engine, "s", keys, LIMIT, THREADS, barrier, PATIENCE)
    finally:
        stop.set()
        flipper.join(PATIENCE)
    assert not failures

    assert_no_errors(outcomes)
    for number, key in enumerate(keys):
        results = [o for o in outcomes if o.trial == number]
        kinds = Counter(o.kind for o in results)
        assert kinds == {"created": 1, "refused": THREADS - 1}, f"trial {number}: {kinds}"
        actives = Counter(o.active for o in results if o.kind == "refused")
        assert actives == {LIMIT: THREADS - 1}, f"trial {number}: refused with {actives}"
        assert engine.count_runs(tag=tag_of(key)) == LIMIT
