"""What every hammer's starters share: threads started together and waited for, and a
spawned child's Django set up on the parent's test database.

The hammers (``hammer_worker``, ``hammer_batches``, ``hammer_multikey``,
``hammer_rates``, ``hammer_tickets``) each plan their own starts and check their own
invariant; they run their starters through these two helpers.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any


def in_threads(target: Callable[..., None], argsets: Iterable[tuple[Any, ...]], name: str) -> None:
    """Run ``target(*args)`` for each of ``argsets``, one thread each (named ``name`` and
    its number), all started before any is waited for; return once every one ended."""
    workers = [
        threading.Thread(target=target, args=args, name=f"{name}-{number}")
        for number, args in enumerate(argsets)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def django_in_child(db_name: str) -> None:
    """In a spawned child: Django set up with the test settings, on the parent's test
    database ``db_name`` (not the configured one)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    from django.conf import settings

    settings.DATABASES["default"]["NAME"] = db_name
    import django

    django.setup()


def reports_of(children: list[Any], out: Any, patience: float) -> list[Any]:
    """Start the spawned ``children``, gather the list each puts on ``out`` (waiting at
    most ``patience`` seconds for each), then join them, killing one still alive after
    ``patience / 4``; a child that never reports fails the test."""
    import pytest

    reported: list[Any] = []
    try:
        for child in children:
            child.start()
        for _ in children:
            reported.extend(out.get(timeout=patience))
    except queue.Empty:
        pytest.fail("a hammer process did not report")
    finally:
        for child in children:
            child.join(timeout=patience / 4)
            if child.is_alive():
                child.kill()
                child.join()
    return reported
