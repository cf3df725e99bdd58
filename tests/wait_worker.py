"""The child process of the waiting hammer (``tests/runtime/test_wait.py``): threads starting runs
with ``wait=`` under one key, on the parent's test database. Kept apart so that a spawned
child imports it without importing a test module."""

from __future__ import annotations

import os
import threading
import traceback
from typing import Any


def process_main(
    db_name: str,
    fast_path: bool,
    key: str,
    limit: int,
    threads: int,
    wait: float,
    barrier: Any,
    results: Any,
) -> None:
    """Start ``threads`` runs of the hammer's workflow under ``key``, each with ``wait``,
    released together by ``barrier``; put ``"created"``, ``"refused"`` or a traceback of
    each on ``results`` (one list)."""
    outcomes: list[str] = []
    try:
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
        from django.conf import settings

        settings.DATABASES["default"]["NAME"] = db_name
        import django

        django.setup()
        from django.db import connections

        from durable_django import ConcurrencyLimitError

        from .hammer_worker import WORKFLOW, make_engine

        engine = make_engine(fast_path)

        def starter(n: int) -> None:
            try:
                barrier.wait(60)
                engine.start(
                    WORKFLOW, {"n": n}, concurrency={"key": key, "limit": limit}, wait=wait
                )
                outcomes.append("created")
            except ConcurrencyLimitError:
                outcomes.append("refused")
            except Exception:
                outcomes.append(traceback.format_exc())
            finally:
                connections.close_all()

        workers = [threading.Thread(target=starter, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    except Exception:
        barrier.abort()
        outcomes.append(traceback.format_exc())
    results.put(outcomes)
