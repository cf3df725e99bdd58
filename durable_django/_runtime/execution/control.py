"""How a turn ends early: the control flow a durable call raises through the body, which
the turn driver (:mod:`durable_django._runtime.execution.turn`) catches."""

from __future__ import annotations

import datetime
from typing import Any

from ..._core.user_code import ControlFlow


class Suspend(ControlFlow):
    """Ends the turn: the run waits for ``wait`` (until ``wake_at``, when given)."""

    def __init__(self, wait: dict[str, Any], wake_at: datetime.datetime | None = None) -> None:
        self.wait = wait
        self.wake_at = wake_at
        super().__init__(wait)


class LeaseLost(ControlFlow):
    """The worker no longer holds the run (cancelled, or its lease was handed on)."""


class DatabaseLost(ControlFlow):
    """The store's database went away during a durable call (a restart, a failover, a
    network cut). The turn ends and records nothing; the run is handed back, to be
    replayed, rather than failed for what was no fault of its own."""


class TimeUp(ControlFlow):
    """Celery's soft time limit fired after the turn completed a step: the turn ends
    there and the run is handed back, to go on in a turn of its own (the interrupted
    step runs again). A step that alone outlasts the limit fails its attempt instead."""


__all__ = ["DatabaseLost", "LeaseLost", "Suspend", "TimeUp"]
