"""Run statuses."""

from __future__ import annotations

from django.db import models


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


ACTIVE_STATUSES: tuple[str, ...] = ("pending", "running", "suspended", "blocked")
TERMINAL_STATUSES: tuple[str, ...] = ("completed", "failed", "cancelled")
ALL_STATUSES: frozenset[str] = frozenset(RunStatus.values)
