"""A fair start whose database goes away on PostgreSQL's two round trips: nothing leaks.

Under a fair quota, a PostgreSQL start reads under the keys' locks in one round trip and
writes, with its ``COMMIT``, in a second (``stores/orm/postgres.py``). Here the engine's
store reaches the test database through a :class:`~tests.faults.TcpProxy` of the test's
own, which drops its connections between the two round trips, or after the write's
commit but before its answer (the commit in doubt). Either way the start raises the
database error, and nothing is left half-done: no run and the ticket still kept when the
write never arrived; the run and the ticket's use committed once when it did, the start
made again with the same id finding that run. PostgreSQL only: the other databases take
the portable path, whose faults the wait and turn fault tests cover.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections

from durable_django import Concurrency, ConcurrencyLimitError, Engine, RunStatus
from durable_django._rules.registry import Registry
from durable_django.stores import OrmStore

from ..faults import TcpProxy, proxied_test_database
from ..helpers import echo, force_status

ALIAS = "fair_start_faults"

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", ALIAS])


@pytest.fixture(scope="module")
def proxied(django_db_setup: None) -> Iterator[TcpProxy]:
    """A proxy in front of the test database's server, and the test database through it
    as the database ``ALIAS``."""
    if connection.vendor != "postgresql":
        pytest.skip("the fair start's two round trips are PostgreSQL's")
    with proxied_test_database(ALIAS) as running:
        yield running


@pytest.fixture
def proxy(proxied: TcpProxy) -> Iterator[TcpProxy]:
    yield proxied
    proxied.restore()


@pytest.fixture
def engine(proxy: TcpProxy, registry: Registry) -> Iterator[Engine]:
    engine = Engine(store=OrmStore(using=ALIAS), registry=registry, enqueue=False)
    engine.register("fair.echo", "1", echo)
    yield engine
    connections[ALIAS].close()


def _is_write(sql: str) -> bool:
    return sql.startswith('INSERT INTO "durable_run"') and sql.rstrip().endswith("COMMIT")


def _start(engine: Engine, key: str, run_id: str | None = None, ticket: str | None = None):
    quota = Concurrency(key=key, limit=1, fair=True)
    return engine.start("fair.echo", {"key": key}, run_id=run_id, concurrency=quota, ticket=ticket)


def _refused_with_ticket(engine: Engine, key: str) -> str:
    """A run holding the key's one slot, a start refused with a ticket and refused again
    presenting it (now kept in the key's line), then the slot freed: the ticket's holder
    is next."""
    holder = _start(engine, key).run_id
    with pytest.raises(ConcurrencyLimitError) as refused:
        _start(engine, key)
    ticket = refused.value.ticket
    with pytest.raises(ConcurrencyLimitError):
        _start(engine, key, ticket=ticket)
    assert len(engine.store.ticket_line(key)) == 1
    force_status(engine, holder, RunStatus.COMPLETED)
    return ticket


def _faulty(fault: Callable[[], None], *, after: bool) -> Callable[..., Any]:
    """An execute wrapper making ``fault`` at the fair start's write, once: before it is
    sent, or after the server ran it (its commit done) with the answer then lost."""
    made: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not _is_write(sql) or made:
            return execute(sql, params, many, context)
        made.append(sql)
        if not after:
            fault()
            return execute(sql, params, many, context)
        execute(sql, params, many, context)
        fault()
        raise DatabaseError("the answer to the write and its COMMIT was lost")

    wrapper.made = made  # type: ignore[attr-defined]
    return wrapper


def test_a_connection_lost_between_the_read_and_the_write_leaves_nothing(engine, proxy):
    """The read was answered (locks taken, units and tickets read), then the connection
    drops before the write: the server rolls the transaction back with its locks, no
    run is created, and the ticket stays kept, so the same start made again is admitted
    as the ticket's holder."""
    key = f"fair:{uuid.uuid4().hex[:12]}"
    ticket = _refused_with_ticket(engine, key)
    run_id = f"fault-{uuid.uuid4().hex[:8]}"
    wrapper = _faulty(proxy.drop, after=False)
    with connections[ALIAS].execute_wrapper(wrapper), pytest.raises(DatabaseError):
        _start(engine, key, run_id, ticket)
    assert wrapper.made
    connections[ALIAS].close()  # as the end of a request does with a broken connection
    assert engine.store.get_run(run_id) is None
    assert len(engine.store.ticket_line(key)) == 1  # still kept: the write never arrived

    handle = _start(engine, key, run_id, ticket)
    assert handle.created
    assert engine.get_run(run_id).status == RunStatus.PENDING
    assert list(engine.store.ticket_line(key)) == []


def test_a_write_whose_commit_answer_is_lost_committed_once(engine, proxy):
    """The write and its ``COMMIT`` ran on the server, then the answer was lost: the start
    raises, though the run was created and the ticket used. Made again with the same id
    (as a waiting start, or a client retrying, does), it finds that run, creates no
    second one, and the key holds one run: its slot is the run's, not leaked."""
    key = f"fair:{uuid.uuid4().hex[:12]}"
    ticket = _refused_with_ticket(engine, key)
    run_id = f"fault-{uuid.uuid4().hex[:8]}"
    wrapper = _faulty(proxy.drop, after=True)
    with connections[ALIAS].execute_wrapper(wrapper), pytest.raises(DatabaseError):
        _start(engine, key, run_id, ticket)
    assert wrapper.made
    connections[ALIAS].close()
    assert engine.get_run(run_id).status == RunStatus.PENDING
    assert list(engine.store.ticket_line(key)) == []

    again = _start(engine, key, run_id, ticket)
    assert not again.created
    runs = engine.list_runs(tag=f"concurrency:{key}")
    assert [run.run_id for run in runs if run.status != RunStatus.COMPLETED] == [run_id]
    # The slot is the run's: another start is refused until it ends, then admitted.
    with pytest.raises(ConcurrencyLimitError):
        _start(engine, key)
    force_status(engine, run_id, RunStatus.COMPLETED)
    assert _start(engine, key).created
