"""Fair quotas: refused starts get tickets, and a retry presenting its ticket is served in
ticket order; a ticket not presented again holds nothing, a held slot is held no longer
than the window, and the limit holds. On the ORM store (each test database) and the
memory store; the HTTP round trip through the middleware; a hammer of polite clients
and a flood on the server databases."""

from __future__ import annotations

import contextlib
import datetime
import json
import multiprocessing
import queue
import random
import threading
import time
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from durable_django import Concurrency, ConcurrencyLimitError, Engine, RunStatus
from durable_django import engine as default_engine
from durable_django._core.lifecycle import ACTIVE_STATUSES
from durable_django._rules import tickets
from durable_django._rules.concurrency import DEFAULT_FAIR_WINDOW, Quota, merge
from durable_django._rules.tickets import HEADER, KeptTicket, issue, place_in_line, read
from durable_django._runtime.estimates import Holder, soonest_free
from durable_django.stores import MemoryStore, OrmStore

from .. import hammer_tickets
from ..helpers import echo, force_status, statements_sent


def fresh_key() -> str:
    return f"fair:{uuid.uuid4().hex[:12]}"


def fair(key: str, limit: int = 1, window: float = DEFAULT_FAIR_WINDOW) -> Concurrency:
    return Concurrency(key=key, limit=limit, fair=True, fair_window=window)


@pytest.fixture
def fair_engine(kept_tickets_forgotten: None, engine: Engine) -> Engine:
    engine.register("fair.echo", "1", echo)
    return engine


def start(engine: Engine, key: str, ticket: str | None = None, **options: Any) -> str:
    return engine.start(
        "fair.echo", {"key": key}, concurrency=fair(key, **options), ticket=ticket
    ).run_id


def refused(engine: Engine, key: str, ticket: str | None = None, **options: Any):
    before = {run.run_id for run in engine.list_runs()}
    with pytest.raises(ConcurrencyLimitError) as caught:
        start(engine, key, ticket, **options)
    assert {run.run_id for run in engine.list_runs()} == before  # nothing created
    return caught.value


def finish(engine: Engine, run_id: str) -> None:
    force_status(engine, run_id, RunStatus.COMPLETED)


def kept(engine: Engine, key: str) -> list[KeptTicket]:
    return sorted(engine.store.ticket_line(key), key=lambda ticket: ticket.place)


# declaring -----------------------------------------------------------------------------


def test_fair_is_declared_with_a_window():
    quota = Concurrency(key="k", limit=2, fair=True, fair_window=datetime.timedelta(seconds=5))
    assert (quota.fair, quota.fair_window) == (True, 5.0)
    assert Concurrency(key="k", limit=2).fair is False
    assert quota != Concurrency(key="k", limit=2)
    assert "fair=True" in repr(quota)
    assert Concurrency(**{"key": "k", "limit": 1, "fair": True}).fair


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"fair": 1}, TypeError, "fair must be True or False"),
        ({"fair": True, "fair_window": 0}, ValueError, "fair_window must be more than 0"),
        ({"fair": True, "fair_window": 7200}, ValueError, "at most 3600"),
        ({"fair": True, "fair_window": "3"}, TypeError, "fair_window must be seconds"),
    ],
)
def test_bad_fair_options_are_refused(options, error, message):
    with pytest.raises(error, match=message):
        Concurrency(key="k", limit=1, **options)


def test_two_quotas_of_one_key_merge_fair_with_the_shorter_window():
    statuses = ACTIVE_STATUSES
    (merged,) = merge([Quota("k", 3, statuses, 1, 5.0), Quota("k", 2, statuses, 1, None)])
    assert (merged.limit, merged.weight, merged.fair_window) == (2, 2, 5.0)
    (both,) = merge([Quota("k", 3, statuses, 1, 5.0), Quota("k", 3, statuses, 1, 2.0)])
    assert both.fair_window == 2.0


# tickets ---------------------------------------------------------------------------------


def test_a_ticket_reads_back_and_refuses_tampering():
    now = timezone.now()
    ticket = issue("tenant:a", 2, now, now + datetime.timedelta(seconds=9))
    again = read(ticket.token)
    assert (again.id, again.key, again.weight) == (ticket.id, "tenant:a", 2)
    assert abs((again.issued_at - now).total_seconds()) < 1e-5
    with pytest.raises(ValueError, match="not one this project issued"):
        read(ticket.token[:-2] + "xx")
    with pytest.raises(TypeError, match="ticket must be a str"):
        read(42)


def test_the_line_counts_only_live_kept_tickets_ahead():
    now = timezone.now()
    later = now + datetime.timedelta(seconds=60)
    old = KeptTicket("a", "k", now - datetime.timedelta(seconds=3), 1, later)
    mid = KeptTicket("b", "k", now - datetime.timedelta(seconds=2), 2, later)
    gone = KeptTicket("c", "k", now - datetime.timedelta(seconds=4), 1, now)
    mine = issue("k", 1, now - datetime.timedelta(seconds=1), later)
    lapsed = KeptTicket("d", "k", now - datetime.timedelta(seconds=5), 1, later, "", now)
    line = place_in_line([mid, gone, old, lapsed], mine, "k", active=0, limit=2, weight=1, now=now)
    assert (line.ticket, line.kept, line.ahead, line.holds) == (mine, False, 3, True)
    assert (line.hold_ends, line.length) == (None, 2)
    mine_kept = KeptTicket(mine.id, "k", now - datetime.timedelta(seconds=2.5), 1, later)
    line = place_in_line([mid, old, mine_kept], mine, "k", active=0, limit=2, weight=1, now=now)
    assert (line.kept, line.ahead, line.holds) == (True, 1, False)  # behind "a" only: fits
    line = place_in_line([mid, old], None, "k", active=2, limit=2, weight=1, now=now)
    assert (line.ahead, line.holds) == (3, False)  # full anyway: nothing is held
    bound = KeptTicket("e", "k", now - datetime.timedelta(seconds=1), 1, later, "", later)
    line = place_in_line([old, bound], None, "k", active=0, limit=1, weight=1, now=now)
    assert (line.holds, line.hold_ends) == (True, later)


# the line --------------------------------------------------------------------------------


def test_a_ticket_not_presented_again_holds_nothing(fair_engine):
    key = fresh_key()
    first = start(fair_engine, key)
    error = refused(fair_engine, key)
    assert error.ticket and error.held == 0
    assert read(error.ticket).key == key
    assert kept(fair_engine, key) == []  # a refusal writes nothing
    finish(fair_engine, first)
    start(fair_engine, key)  # the slot is not held for a ticket never presented again


def test_a_ticket_presented_again_is_served_before_later_starts(fair_engine):
    key = fresh_key()
    first = start(fair_engine, key)
    ticket = refused(fair_engine, key).ticket
    again = refused(fair_engine, key, ticket)  # still full: the ticket is kept
    assert again.ticket == ticket
    (entry,) = kept(fair_engine, key)
    assert entry.id == read(ticket).id
    finish(fair_engine, first)
    other = refused(fair_engine, key)  # the freed slot is held for the ticket
    assert (other.active, other.held) == (0, 1)
    assert "1 held for older tickets" in str(other)
    assert other.ticket != ticket
    run_id = start(fair_engine, key, ticket)
    assert fair_engine.get_run(run_id).status == RunStatus.PENDING
    assert kept(fair_engine, key) == []  # admitted: the ticket is dropped


def test_tickets_are_served_in_the_order_they_joined_the_line(fair_engine):
    """A ticket joins the line when its client first comes back with it: one issued
    earlier but presented later is served later."""
    key = fresh_key()
    first = start(fair_engine, key, limit=2)
    second = start(fair_engine, key, limit=2)
    issued_first = refused(fair_engine, key, limit=2).ticket
    issued_later = refused(fair_engine, key, limit=2).ticket
    refused(fair_engine, key, issued_later, limit=2)  # joins first
    behind = refused(fair_engine, key, issued_first, limit=2)
    assert behind.held == 1  # one ticket ahead of it
    assert [t.id for t in kept(fair_engine, key)] == [read(issued_later).id, read(issued_first).id]
    finish(fair_engine, first)
    assert refused(fair_engine, key, issued_first, limit=2).held == 1  # the other's turn
    start(fair_engine, key, issued_later, limit=2)
    finish(fair_engine, second)
    start(fair_engine, key, issued_first, limit=2)
    assert kept(fair_engine, key) == []


def test_a_held_slot_is_released_after_the_window(fair_engine):
    key = fresh_key()
    first = start(fair_engine, key, window=0.2)
    ticket = refused(fair_engine, key, window=0.2).ticket
    refused(fair_engine, key, ticket, window=0.2)
    finish(fair_engine, first)
    assert refused(fair_engine, key, window=0.2).held == 1  # the hold begins
    (entry,) = kept(fair_engine, key)
    assert entry.held_until is not None
    assert entry.held_until <= timezone.now() + datetime.timedelta(seconds=0.2)
    time.sleep(0.3)
    start(fair_engine, key, window=0.2)  # the ticket's holder never came: it expired
    late = refused(fair_engine, key, ticket, window=0.2)
    assert late.ticket != ticket  # a new place, at the back of the line
    assert read(late.ticket).issued_at > read(ticket).issued_at


def join(engine: Engine, key: str, **options: Any) -> str:
    """A ticket taken and presented once, while the key is full: it joins the line."""
    ticket = refused(engine, key, **options).ticket
    assert refused(engine, key, ticket, **options).ticket == ticket
    return ticket


def turned_away(engine: Engine, key: str, window: float) -> tuple[int, float]:
    """A start refused at a freed slot held for tickets: the hold begins. Returns the
    units held, and when one window has passed since (``time.monotonic()``)."""
    error = refused(engine, key, window=window)
    assert error.active == 0
    return error.held, time.monotonic() + window


def wait_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()) + 0.01)


#: A window long enough for the tickets of a test not to expire on their own while it
#: takes them (a ticket also expires ``retry_after + window`` after its last refusal).
LONG = 1.0


@pytest.mark.parametrize("abandoned", [1, 6])
def test_abandoned_tickets_keep_a_freed_slot_one_window_at_most(fair_engine, abandoned):
    """A client collects tickets, presents each once and leaves: the freed slot is held
    for the line one window from the first start it turned away, not one per ticket;
    then every ticket waiting leaves the line together, and a new start is admitted."""
    key = fresh_key()
    holder = start(fair_engine, key, window=LONG)
    for _ in range(abandoned):
        join(fair_engine, key, window=LONG)
    finish(fair_engine, holder)
    held, one_window_later = turned_away(fair_engine, key, window=LONG)
    assert held >= min(2, abandoned)
    wait_until(one_window_later)
    start(fair_engine, key, window=LONG)  # open
    assert all(not entry.live(timezone.now()) for entry in kept(fair_engine, key))


def test_tickets_joining_during_a_hold_leave_with_it(fair_engine):
    """A ticket presented while a hold runs is bound to that hold: presenting a new one
    every window does not keep the slot held for longer."""
    key = fresh_key()
    holder = start(fair_engine, key, window=LONG)
    join(fair_engine, key, window=LONG)
    late = refused(fair_engine, key, window=LONG).ticket  # taken while the key is full
    finish(fair_engine, holder)
    held, one_window_later = turned_away(fair_engine, key, window=LONG)
    assert held == 1
    assert refused(fair_engine, key, late, window=LONG).held == 1  # joins during the hold
    bound = {entry.id: entry.held_until for entry in kept(fair_engine, key)}
    assert bound[read(late).id] is not None
    wait_until(one_window_later)
    start(fair_engine, key, window=LONG)


@pytest.mark.django_db(transaction=True)
def test_a_hold_used_by_its_ticket_keeps_the_places_behind_it(fair_engine):
    """A kept ticket admitted into the held slot ends the hold (once its start commits:
    outside a transaction of the test's, so that it does); the tickets behind it keep
    their places past the window, for the next slot."""
    key = fresh_key()
    holder = start(fair_engine, key, window=LONG)
    first, second = join(fair_engine, key, window=LONG), join(fair_engine, key, window=LONG)
    finish(fair_engine, holder)
    held, one_window_later = turned_away(fair_engine, key, window=LONG)
    assert held == 2
    served = start(fair_engine, key, first, window=LONG)  # the slot went to the line
    (behind,) = kept(fair_engine, key)
    assert (behind.id, behind.held_until) == (read(second).id, None)
    wait_until(one_window_later)  # the used hold took no one with it:
    assert refused(fair_engine, key, second, window=LONG).ticket == second
    finish(fair_engine, served)
    assert refused(fair_engine, key, window=LONG).held == 1  # held for the second
    start(fair_engine, key, second, window=LONG)
    assert kept(fair_engine, key) == []


@pytest.mark.django_db(transaction=True)
def test_a_line_keeps_a_bounded_number_of_tickets(fair_engine, monkeypatch):
    """At most ``LINE_PER_UNIT`` tickets per unit of the limit are kept: a ticket
    presented to a full line stays valid, unkept, and joins once the line has room.
    (Outside a transaction of the test's: off SQLite, the tickets are written on a
    connection of their own, which would wait on the rows the test's drops lock.)"""
    monkeypatch.setattr(tickets, "LINE_PER_UNIT", 2)
    key = fresh_key()
    holder = start(fair_engine, key, limit=2)
    start(fair_engine, key, limit=2)
    for _ in range(5):
        join(fair_engine, key, limit=2)
    assert len(kept(fair_engine, key)) == 4  # 2 per unit of the limit
    outside = refused(fair_engine, key, limit=2).ticket
    assert refused(fair_engine, key, outside, limit=2).ticket == outside  # valid, unkept
    assert read(outside).id not in {entry.id for entry in kept(fair_engine, key)}
    finish(fair_engine, holder)
    for entry in kept(fair_engine, key)[:2]:  # two leave the line, admitted
        fair_engine.store.drop_ticket(entry.id)
    refused(fair_engine, key, outside, limit=2)
    assert read(outside).id in {entry.id for entry in kept(fair_engine, key)}


def test_each_namespace_has_a_line_of_its_own(fair_engine):
    """With ``scope_reads``, a namespace counts its own runs and its own tickets: a ticket
    kept in one does not refuse a start in another."""
    blue, green = (
        Engine(
            store=fair_engine.store,
            registry=fair_engine.registry,
            namespace=name,
            scope_reads=True,
            enqueue=False,
        )
        for name in ("blue", "green")
    )
    key = fresh_key()
    holder = start(blue, key)
    ticket = join(blue, key)
    assert [entry.namespace for entry in kept(blue, key)] == ["blue"]
    admitted = start(green, key)  # green has the whole limit, and no one in its line
    green_ticket = join(green, key)
    finish(blue, holder)
    assert refused(blue, key).held == 1  # held for blue's ticket only
    start(blue, key, ticket)
    assert [entry.id for entry in kept(green, key)] == [read(green_ticket).id]
    finish(green, admitted)
    start(green, key, green_ticket)


def test_the_purge_deletes_expired_tickets_only(fair_engine):
    key = fresh_key()
    start(fair_engine, key, window=0.2)
    gone = refused(fair_engine, key, window=0.2).ticket
    refused(fair_engine, key, gone, window=0.2)
    assert len(kept(fair_engine, key)) == 1
    live = refused(fair_engine, key, window=60).ticket
    refused(fair_engine, key, live, window=60)
    now = timezone.now()  # expired now:
    fair_engine.store.keep_ticket(KeptTicket(read(gone).id, key, now, 1, now), most=10)
    result = fair_engine.purge(datetime.timedelta(days=1))
    assert result.tickets == 1
    assert [t.id for t in kept(fair_engine, key)] == [read(live).id]


def test_a_key_without_kept_tickets_behaves_as_without_fair(fair_engine):
    key, plain = fresh_key(), fresh_key()
    outcomes = []
    for quota_key, options in ((key, {"fair": True}), (plain, {})):
        admitted = []
        for _ in range(5):
            try:
                admitted.append(
                    fair_engine.start(
                        "fair.echo",
                        {},
                        concurrency=Concurrency(key=quota_key, limit=3, **options),
                    ).run_id
                )
            except ConcurrencyLimitError as error:
                assert error.held == 0
        outcomes.append(len(admitted))
    assert outcomes == [3, 3]


def test_a_ticket_for_another_key_counts_as_none(fair_engine):
    key, other = fresh_key(), fresh_key()
    start(fair_engine, other)
    foreign = refused(fair_engine, other).ticket
    start(fair_engine, key, foreign)  # unaffected by it
    error = refused(fair_engine, key, foreign)
    assert error.ticket != foreign and read(error.ticket).key == key


def test_a_bad_ticket_is_refused_before_anything_is_written(fair_engine):
    key = fresh_key()
    with pytest.raises(ValueError, match="ticket is not one this project issued"):
        start(fair_engine, key, "not-a-ticket")
    assert fair_engine.list_runs(tag=f"concurrency:{key}") == []


def test_a_batch_waits_behind_kept_tickets_and_gets_none(fair_engine):
    key = fresh_key()
    first = start(fair_engine, key)
    ticket = refused(fair_engine, key).ticket
    refused(fair_engine, key, ticket)
    finish(fair_engine, first)
    batch = fair_engine.start_many("fair.echo", [{}, {}], concurrency=fair(key))
    assert batch.started == [] and [error.held for _, error in batch.refused] == [1, 1]
    assert all(error.ticket is None for _, error in batch.refused)
    start(fair_engine, key, ticket)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has one writer: see below")
def test_a_ticket_is_kept_when_the_callers_transaction_rolls_back(registry):
    """A view under ATOMIC_REQUESTS rolls back what it wrote when it raises the refusal;
    the ticket is kept on a connection of its own (on SQLite it joins the transaction)."""
    engine = Engine(registry=registry, store=OrmStore(), enqueue=False)
    engine.register("fair.echo", "1", echo)
    key = fresh_key()
    start(engine, key)
    ticket = refused(engine, key).ticket
    with pytest.raises(ConcurrencyLimitError), transaction.atomic():
        start(engine, key, ticket)
    assert [t.id for t in kept(engine, key)] == [read(ticket).id]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has one writer: see above")
def test_a_second_start_presenting_a_spent_ticket_in_one_transaction_does_not_hang(registry):
    """A request admitted with its ticket (the ticket's row deleted, locked by the
    request's transaction) and then starting again with it: the refusal's write, on a
    connection of its own, gives up after its lock timeout instead of waiting on the
    request forever; the refusal stands."""
    engine = Engine(registry=registry, store=OrmStore(), enqueue=False)
    engine.register("fair.echo", "1", echo)
    key = fresh_key()
    holder = start(engine, key)
    ticket = refused(engine, key).ticket
    refused(engine, key, ticket)
    finish(engine, holder)
    outcomes: list[Any] = []

    def request() -> None:
        try:
            with transaction.atomic():
                outcomes.append(start(engine, key, ticket))
                with pytest.raises(ConcurrencyLimitError) as caught:
                    start(engine, key, ticket)
                outcomes.append(caught.value)
        except BaseException as error:  # reported below
            outcomes.append(error)
        finally:
            connections.close_all()

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the second start waited on its own transaction"
    assert [type(outcome) for outcome in outcomes] == [str, ConcurrencyLimitError]


# HTTP ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["/fair", "/afair"])
def test_the_429_gives_a_ticket_and_the_retry_presents_it(
    kept_tickets_forgotten, db, client, async_client, prefix
):
    key = fresh_key()

    def get(**headers: str):
        if prefix == "/afair":
            return async_to_sync(async_client.get)(f"{prefix}/{key}", headers=headers)
        return client.get(f"{prefix}/{key}", headers=headers)

    with override_settings(
        ROOT_URLCONF="tests.http_urls",
        MIDDLEWARE=["durable_django.http.ConcurrencyLimitMiddleware"],
    ):
        first = get()
        assert first.status_code == 202
        refusal = get()
        assert refusal.status_code == 429
        ticket = refusal[HEADER]
        body = json.loads(refusal.content)
        assert (body["ticket"], body["held"]) == (ticket, 0)
        assert get(**{HEADER: ticket})[HEADER] == ticket  # kept, same place
        force_status(default_engine, first.content.decode(), RunStatus.COMPLETED)
        assert get().status_code == 429  # held for the ticket
        assert get(**{HEADER: "stale"}).status_code == 429  # a bad header is no ticket
        assert get(**{HEADER: ticket}).status_code == 202


# the hammer ------------------------------------------------------------------------------

ROUNDS = 5
server_database = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="a hammer needs a server database"
)


class Watch:
    """The parent's side of a hammer: a finisher ending the key's runs at random, and a
    sampler counting its active runs at every instant, until the block ends."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.engine = Engine(store=OrmStore(), enqueue=False)
        self.stop = threading.Event()
        self.seen: list[int] = []
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self.guarded, args=(f,)) for f in (self.finish, self.sample)
        ]

    def guarded(self, body) -> None:
        try:
            body()
        except BaseException as error:  # reported by check()
            self.errors.append(error)
        finally:
            connections.close_all()

    def finish(self) -> None:
        tag = f"concurrency:{self.key}"
        while not self.stop.is_set():
            active = self.engine.list_runs(tag=tag, statuses=ACTIVE_STATUSES)
            if active:
                force_status(self.engine, random.choice(active).run_id, RunStatus.COMPLETED)
            time.sleep(random.uniform(0.002, 0.02))

    def sample(self) -> None:
        tag = f"concurrency:{self.key}"
        while not self.stop.is_set():
            self.seen.append(self.engine.count_runs(tag=tag, statuses=ACTIVE_STATUSES))

    def __enter__(self) -> Watch:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def check(self, admitted: list[str], errors: list[str]) -> None:
        assert not errors, "\n\n".join(errors)
        assert not self.errors, self.errors
        assert self.seen and max(self.seen) <= hammer_tickets.LIMIT
        tag = f"concurrency:{self.key}"
        assert self.engine.count_runs(tag=tag, statuses=ACTIVE_STATUSES) <= hammer_tickets.LIMIT
        assert len(admitted) > hammer_tickets.LIMIT  # slots freed and were taken again
        assert sorted(run.run_id for run in self.engine.list_runs(tag=tag)) == sorted(admitted)


@server_database
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("trial", range(ROUNDS))
def test_polite_clients_and_a_flood_in_threads_never_exceed_the_limit(trial):
    key = fresh_key()
    engine = Engine(store=OrmStore(), enqueue=False)
    engine.config  # noqa: B018  (resolve the options once, before threads share it)
    with Watch(key) as watch:
        admitted, errors = hammer_tickets.run_clients(engine, key, polite=6, flood=3, seconds=2)
    watch.check(admitted, errors)


@server_database
@pytest.mark.django_db(transaction=True)
def test_polite_clients_and_a_flood_in_processes_never_exceed_the_limit():
    context = multiprocessing.get_context("spawn")
    key = fresh_key()
    out = context.Queue()
    children = [
        context.Process(
            target=hammer_tickets.process_main,
            args=(connection.settings_dict["NAME"], key, 3, 1, 6.0, out),
        )
        for _ in range(3)
    ]
    admitted: list[str] = []
    errors: list[str] = []
    with Watch(key) as watch:
        try:
            for child in children:
                child.start()
            for _ in children:
                started, failed = out.get(timeout=120)
                admitted += started
                errors += failed
        except queue.Empty:
            pytest.fail("a hammer process did not report")
        finally:
            for child in children:
                child.join(timeout=60)
                if child.is_alive():
                    child.kill()
                    child.join()
    watch.check(admitted, errors)


@override_settings(USE_TZ=False)
def test_a_ticket_reads_back_without_time_zones():
    now = timezone.now()
    assert timezone.is_naive(now)
    ticket = read(issue("k", 1, now, now + datetime.timedelta(seconds=5)).token)
    assert timezone.is_naive(ticket.issued_at)
    assert abs((ticket.issued_at - now).total_seconds()) < 1e-5


def test_a_tickets_retry_after_counts_the_turns_ahead_of_it():
    """Two holders ending in 1 s and 2 s, runs lasting 3 s: with two units of tickets
    ahead, the start's turn comes when the first of their runs ends, at 4 s."""
    recorded = [3.0] * 5
    held = [
        Holder("a", "wf", "running", None, None, age=2.0),
        Holder("b", "wf", "running", None, None, age=1.0),
    ]
    assert soonest_free(held, recorded, limit=2) == 1.0
    assert soonest_free(held, recorded, limit=2, ahead=2) == 4.0
    assert soonest_free(held, recorded, limit=3, ahead=2) == 2.0  # one slot free now
    assert soonest_free(held, recorded, limit=2, needed=2, ahead=1) == 4.0


def test_a_waiting_start_presents_the_ticket_its_last_attempt_got(memory_engine):
    """A start with wait= keeps its place across attempts: its second refusal keeps its
    ticket, and a later start without one finds the freed slot held for it."""
    memory_engine.register("fair.echo", "1", echo)
    key = fresh_key()
    holder = start(memory_engine, key)
    waited: list[Any] = []

    def waiter() -> None:
        waited.append(memory_engine.start("fair.echo", {}, concurrency=fair(key), wait=10).run_id)

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 10
    while not kept(memory_engine, key):  # the waiter's second attempt kept its ticket
        assert time.monotonic() < deadline, "the waiting start's ticket was never kept"
        time.sleep(0.01)
    finish(memory_engine, holder)
    late = refused(memory_engine, key)
    assert (late.held, late.active) in ((1, 0), (0, 1))  # held for it, or it got in
    thread.join(10)
    assert waited and memory_engine.get_run(waited[0]).status == RunStatus.PENDING
    assert kept(memory_engine, key) == []


class RefusesTicketWrites(MemoryStore):
    """A store whose ticket writes fail, as a database refusing them or gone away would."""

    def keep_ticket(self, ticket: KeptTicket) -> None:
        raise OSError("the database went away")

    def hold_tickets(self, key: str, namespace: Any, until: Any) -> None:
        raise OSError("the database went away")


def test_a_failed_ticket_write_leaves_the_refusal_standing(registry, caplog):
    """The keep and the hold are written after the refused start's transaction: when
    they fail, the refusal is raised as it would be, nothing is created, the failure is
    logged, and the ticket stays valid (unkept)."""
    engine = Engine(registry=registry, store=RefusesTicketWrites(), enqueue=False)
    engine.register("fair.echo", "1", echo)
    key = fresh_key()
    holder = start(engine, key)
    ticket = refused(engine, key).ticket
    with caplog.at_level("WARNING", logger="durable_django.starting"):
        again = refused(engine, key, ticket)  # the keep fails
    assert again.ticket == ticket
    assert "could not keep the tickets" in caplog.text
    finish(engine, holder)
    start(engine, key, ticket)  # the slot freed; nothing was held


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's fast path")
@pytest.mark.parametrize("callers", [False, True], ids=["own", "in-a-callers-transaction"])
def test_a_fair_start_on_postgresql_is_two_round_trips(registry, callers):
    """One read under the keys' locks (the locks, the existing run, the units, the kept
    tickets), then one write carrying its ``COMMIT`` (inside a transaction of the caller's,
    its savepoint's release): a start admitted with its kept ticket, which it drops; a
    refused start ends its transaction instead of writing."""
    engine = Engine(registry=registry, store=OrmStore(), enqueue=False)
    engine.register("fair.echo", "1", echo)
    key = fresh_key()
    holder = start(engine, key)
    ticket = refused(engine, key).ticket
    refused(engine, key, ticket)  # the ticket is kept: it joins the line
    finish(engine, holder)
    around = transaction.atomic if callers else contextlib.nullcontext
    with around(), statements_sent() as admitted:
        run_id = start(engine, key, ticket)
    with around(), statements_sent() as refusal, pytest.raises(ConcurrencyLimitError):
        start(engine, key)
    begin, end, undo = (
        ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")
        if callers
        else ("BEGIN", "COMMIT", "ROLLBACK")
    )
    assert len(admitted) == 2, admitted
    assert admitted[0].startswith(begin) and "durable_quota_ticket" in admitted[0]
    assert admitted[1].startswith("INSERT") and admitted[1].split("; ")[-1].startswith(end)
    assert "DELETE" in admitted[1] and kept(engine, key) == []
    # The refusal's own statements; then the engine keeps the ticket and estimates.
    assert refusal[0].startswith(begin) and refusal[1].startswith(undo), refusal
    assert engine.get_run(run_id).status == RunStatus.PENDING
