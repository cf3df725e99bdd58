"""Ticking in-process tests along: timers are due after real time passes."""

from __future__ import annotations

import datetime
import time

from django.utils import timezone

from durable_django import Engine
from durable_django.testing import run_until_idle


def later(seconds: float) -> datetime.datetime:
    return timezone.now() + datetime.timedelta(seconds=seconds)


def wait_and_tick(engine: Engine, seconds: float = 0.06) -> None:
    time.sleep(seconds)
    engine.tick()
    run_until_idle(engine)


def tick_until_settled(engine: Engine, run_id: str, attempts: int = 200) -> None:
    """Tick and execute until the run ends: timers are due after real time passes, and a
    loaded machine may need more than one round."""
    for _ in range(attempts):
        if engine.get_run(run_id).status in ("completed", "failed", "cancelled"):
            return
        wait_and_tick(engine, 0.03)
    raise AssertionError(f"run {run_id} did not settle")
