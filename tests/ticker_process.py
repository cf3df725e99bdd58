"""Tickers in spawned processes, for the test of declared schedules synced at once.

Each child sets Django up on the parent's test database, declares the same schedules,
waits for every other ticker, ticks once, and reports what it raised, if anything.
"""

from __future__ import annotations

import os
import traceback
from typing import Any


def declare(engine: Any, keys: list[str]) -> None:
    """The workflow every ticker declares, with one schedule per key."""
    engine.register(
        "declared", "1", lambda ctx, i: i, schedule=[{"key": k, "interval": 60} for k in keys]
    )


def tick_in_process(db_name: str, keys: list[str], barrier: Any, results: Any) -> None:
    """Entry point of a spawned child; puts ``""`` or a traceback on ``results``."""
    try:
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
        from django.conf import settings

        settings.DATABASES["default"]["NAME"] = db_name
        import django

        django.setup()
        from durable_django import Engine
        from durable_django._rules.registry import Registry
        from durable_django.stores import OrmStore

        engine = Engine(store=OrmStore(), registry=Registry(), enqueue=False)
        declare(engine, keys)
        barrier.wait(60)
        engine.tick()
        results.put("")
    except BaseException:
        barrier.abort()
        results.put(traceback.format_exc())
