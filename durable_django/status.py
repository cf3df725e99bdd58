"""Run statuses, as Django choices (the plain values live in
:mod:`~durable_django._core.lifecycle`)."""

from __future__ import annotations

from django.db import models

from ._core.lifecycle import ACTIVE_STATUSES, ALL_STATUSES, TERMINAL_STATUSES


class RunStatus(models.TextChoices):
    """The life cycle of a run. The first four are active; the last three are terminal."""

    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUSPENDED = "suspended", "Suspended"
    BLOCKED = "blocked", "Blocked"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"

    @classmethod
    def terminal_values(cls) -> tuple[str, ...]:
        """The statuses a run never leaves."""
        return TERMINAL_STATUSES


__all__ = ["ACTIVE_STATUSES", "ALL_STATUSES", "TERMINAL_STATUSES", "RunStatus"]
