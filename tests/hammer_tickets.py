"""Polite clients presenting their tickets and flooders without, under one fair key, for
``tests/runtime/test_fair_tickets.py``, in threads and in spawned processes.

A polite client starts, and on each refusal retries at once (no sleep: the hammer is
about the limit, not about manners) presenting the ticket it was given; a flooder starts
without a ticket, again and again. Both run until a deadline.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from typing import Any

from .hammering import django_in_child

#: The workflow the hammer starts (declared in ``tests.testapp.workflows``).
WORKFLOW = "tests.plain"
LIMIT = 3
WINDOW = 0.5


def start(engine: Any, key: str, ticket: str | None) -> str:
    return engine.start(
        WORKFLOW,
        {},
        concurrency={"key": key, "limit": LIMIT, "fair": True, "fair_window": WINDOW},
        ticket=ticket,
    ).run_id


def client_loop(
    engine: Any, key: str, polite: bool, deadline: float, admitted: list[str], errors: list[str]
) -> None:
    """One client until ``deadline``; what it started goes on ``admitted``, what went
    wrong on ``errors`` (list.append is atomic)."""
    from django.db import connection

    from durable_django import ConcurrencyLimitError

    ticket = None
    try:
        while time.monotonic() < deadline:
            try:
                admitted.append(start(engine, key, ticket if polite else None))
                ticket = None
            except ConcurrencyLimitError as error:
                ticket = error.ticket
                if polite:
                    time.sleep(random.uniform(0.002, 0.02))
    except Exception:
        errors.append(traceback.format_exc())
    finally:
        connection.close()


def run_clients(
    engine: Any, key: str, polite: int, flood: int, seconds: float
) -> tuple[list[str], list[str]]:
    """``polite`` and ``flood`` client threads for ``seconds``: (admitted, errors)."""
    admitted: list[str] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    threads = [
        threading.Thread(
            target=client_loop, args=(engine, key, n < polite, deadline, admitted, errors)
        )
        for n in range(polite + flood)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return admitted, errors


def process_main(db_name: str, key: str, polite: int, flood: int, seconds: float, out: Any) -> None:
    """Entry point of a spawned child: Django on the parent's test database, then the
    clients. Puts ``(admitted, errors)`` on ``out``."""
    try:
        django_in_child(db_name)
        from .hammer_worker import make_engine

        out.put(run_clients(make_engine(True), key, polite, flood, seconds))
    except Exception:
        out.put(([], [traceback.format_exc()]))
