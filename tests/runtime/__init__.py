"""Tests of what the engine does, in-process: starts, waiting, the turn, events,
schedules, purges."""
