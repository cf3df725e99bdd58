"""What the engine does: starts, waiting, publishing, a worker's turn, events,
schedules, the tick, quota usage, estimates, the purge.

Internal: import from ``durable_django``."""
