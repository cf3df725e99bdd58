"""A run's life cycle as plain values: which statuses are active, which terminal.

Pure Python, importable without Django's ORM. :class:`~durable_django.RunStatus` (in
:mod:`durable_django.status`) is the same statuses as a Django ``TextChoices``, for model
fields and the admin.
"""

from __future__ import annotations

#: The statuses of a run that has not ended; each occupies a quota slot by default.
ACTIVE_STATUSES: tuple[str, ...] = ("pending", "running", "suspended", "blocked")

#: The statuses a run never leaves.
TERMINAL_STATUSES: tuple[str, ...] = ("completed", "failed", "cancelled")

#: Every status, active or terminal.
ALL_STATUSES: frozenset[str] = frozenset(ACTIVE_STATUSES + TERMINAL_STATUSES)
