"""An operator's override is read under the key's lock, on every start path of a server
database: a start waiting for the key's lock while the override is set and committed
obeys it once the lock is granted (a path reading the override before taking the lock
would admit it under the old limit).

One thread holds the key's lock (``store.quota_lock``, the lock every path takes), a
second starts under the key and waits for that lock (seen waiting in the server's lock
tables), the test sets a pause of the key, then the first thread lets the lock go.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from durable_django._rules.overrides import Override
from durable_django.errors import ConcurrencyLimitError
from durable_django.stores import OrmStore
from durable_django.stores.contract import batch, new_run, quota, start

from ..helpers import every_start_a_first

pytestmark = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite lets one writer in at a time: none waits"
)

#: How a server shows the start waiting for the key's lock: on PostgreSQL an advisory
#: lock not granted; on MariaDB a statement of another session still executing (the
#: holder is idle in its transaction; a procedure's inner wait is not listed as a lock
#: wait there).
WAITING = {
    "postgresql": "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
    "mysql": "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
    "WHERE ID <> CONNECTION_ID() AND COMMAND = 'Query' AND DB = DATABASE()",
}


def _single(store: OrmStore, key: str) -> Any:
    return start(store, new_run(f"{key}-run"), quota(key, 5))


def _batch(store: OrmStore, key: str) -> Any:
    outcome = batch(store, (new_run(f"{key}-run"), quota(key, 5)))[0]
    if isinstance(outcome, ConcurrencyLimitError):
        raise outcome
    return outcome


def _fair(store: OrmStore, key: str) -> Any:
    return start(store, new_run(f"{key}-run"), dataclasses.replace(quota(key, 5), fair_window=3.0))


PATHS: dict[str, tuple[bool, Callable[[OrmStore, str], Any]]] = {
    "function or procedure": (True, _single),
    "first start's statements": (True, _single),
    "batch": (True, _batch),
    "fair": (True, _fair),
    "portable": (False, _single),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_start_waiting_for_the_lock_obeys_the_override_set_meanwhile(
    path: str, transactional_db: None, kept_tickets_forgotten: None, monkeypatch: Any
) -> None:
    if path == "first start's statements":
        if connection.vendor != "postgresql":
            pytest.skip("the first start's statements are PostgreSQL's")
        every_start_a_first(monkeypatch)
    fast, starting = PATHS[path]
    store = OrmStore(fast_path=fast)
    key = f"lock-{path.split()[0]}"
    held, release = threading.Event(), threading.Event()
    outcome: list[Any] = []

    def hold() -> None:
        try:
            with store.quota_lock(key):
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    def starter() -> None:
        try:
            outcome.append(starting(store, key))
        except Exception as error:
            outcome.append(error)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    waiter = threading.Thread(target=starter)
    waiter.start()
    try:
        deadline = time.monotonic() + 30
        with connection.cursor() as cursor:
            while True:
                cursor.execute(WAITING[connection.vendor])
                if cursor.fetchone()[0] > 0:
                    break
                assert time.monotonic() < deadline, "the start never waited for the lock"
                time.sleep(0.01)
        now = timezone.now()
        store.set_override(Override(key, "concurrency", 0, None, "", now))
    finally:
        release.set()
        holder.join(30)
        waiter.join(30)
    [result] = outcome
    assert isinstance(result, ConcurrencyLimitError), result
    assert (result.key, result.limit, result.active) == (key, 0, 0)
