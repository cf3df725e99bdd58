"""Small helpers the test modules share: a driven clock, workflow bodies, reading and
forcing a run's status, the ``durable`` command, and values that cannot be stored. Fixtures live in
``conftest.py``; no test module imports another."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

from django.core.management import call_command
from django.db import connection

from durable_django import Engine, RunStatus
from durable_django import engine as default_engine
from durable_django.stores.base import RunRecord

# fair quotas' tickets ------------------------------------------------------------------


def forget_kept_tickets() -> None:
    """Delete every kept ticket, committed. Off SQLite a refusal keeps its ticket on a
    connection of its own when a transaction is open (a test's, too), so the rows outlive
    the test's rolled-back transaction; a test that keeps tickets calls this after."""
    from django.db import connections

    connection = connections["default"]
    if connection.vendor == "sqlite":
        return
    own = type(connection)(connection.settings_dict, connection.alias)
    try:
        with own.cursor() as cursor:
            cursor.execute("DELETE FROM durable_quota_ticket")
    finally:
        own.close()


# time ----------------------------------------------------------------------------------

#: Where a driven clock starts.
CLOCK_START = datetime.datetime(2030, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


class Clock:
    """The time every ``timezone.now()`` reads, moved by the test (the ``clock`` fixture)."""

    def __init__(self) -> None:
        self.at = CLOCK_START

    def __call__(self) -> datetime.datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += datetime.timedelta(seconds=seconds)

    def to(self, seconds: float) -> None:
        self.at = CLOCK_START + datetime.timedelta(seconds=seconds)


# workflow bodies -----------------------------------------------------------------------


def echo(ctx, input):
    return {"echo": input}


def boom(ctx, input):
    ctx.step("shout", str.upper, input.get("text", ""))
    raise RuntimeError("the reply service is down")


# runs ----------------------------------------------------------------------------------


def force_status(engine: Engine, run_id: str, status: str, **fields) -> None:
    """Put a run in ``status`` whatever it was, as a worker or an operator would."""
    assert engine.store.transition(run_id, RunStatus.values, status, **fields)


def run_of(run_id: str) -> RunRecord:
    """The run as the default engine reads it."""
    return default_engine.get_run(run_id)


def status_is(run_id: str, status: str) -> Callable[[], bool]:
    """A predicate for ``wait_until``: whether the run is in ``status``."""
    return lambda: run_of(run_id).status == status


def steps_of(run_id: str) -> list[tuple[int, str, Any]]:
    """The run's recorded steps as ``(position, name, result)``."""
    return [(s.position, s.name, s.result) for s in default_engine.store.get_steps(run_id)]


# the durable command -------------------------------------------------------------------


def durable(*args: str) -> str:
    """What ``manage.py durable *args`` prints."""
    out = io.StringIO()
    call_command("durable", *args, stdout=out)
    return out.getvalue()


def durable_json(*args: str):
    """What ``manage.py durable *args --json`` prints, decoded."""
    return json.loads(durable(*args, "--json"))


# values that cannot be stored ----------------------------------------------------------

#: Text no column takes: a NUL character, and a lone surrogate (not encodable as UTF-8).
NUL = "a\x00b"
SURROGATE = "a\ud800b"


def nested(depth: int) -> list:
    """A list nested ``depth`` levels deep."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@contextlib.contextmanager
def statements_sent() -> Iterator[list[str]]:
    """The statements Django's default connection sends inside the block (its execute
    wrappers see them)."""
    sent: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        yield sent


@contextlib.contextmanager
def other_connection() -> Iterator[Any]:
    """A second psycopg connection of the PostgreSQL test database's, autocommitted."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other:
        yield other


# the migrations ------------------------------------------------------------------------


def routines_installed(operation: type, replaced: bool = False) -> list[str]:
    """The routines that durable_django's migrations install with operations of class
    ``operation`` (``InstallFunctions``, ``InstallProcedures``), in the migrations' order:
    those installed first, or (``replaced``) those installed again over an earlier
    migration's (``replace=True``)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None)
    return [
        name
        for key in loader.graph.forwards_plan(loader.graph.leaf_nodes("durable_django")[0])
        if key[0] == "durable_django"
        for step in loader.get_migration(*key).operations
        if isinstance(step, operation) and step.replace == replaced
        for name in step.names
    ]


def every_start_a_first(monkeypatch: Any) -> None:
    """Make every PostgreSQL start its connection's first (``first_start._STARTED``
    knows none), so that it sends the first start's statements."""
    from durable_django.stores.postgres import first_start

    class NoConnectionHasStarted:
        def __contains__(self, item: object) -> bool:
            return False

        def add(self, item: object) -> None:
            pass

    monkeypatch.setattr(first_start, "_STARTED", NoConnectionHasStarted())
