"""What a team's tools see of durable_django: its log lines, the run for user code, and
OpenTelemetry spans, all fed by one seam (:mod:`durable_django.observability.events`).

- :func:`current_run` (also ``durable_django.current_run``): the run the calling code
  works for, as a :class:`RunInfo`, in a body or a step; ``None`` elsewhere.
- :class:`RunFilter`: a logging filter that adds the run's fields to every record
  emitted inside a run.
- :func:`observe` / :func:`forget`: plug an :class:`Observer` into the seam.

The log observer (:mod:`~durable_django.observability.logs`) is always in place; the
span observer (:mod:`~durable_django.observability.spans`) when ``opentelemetry-api``
is installed (the ``otel`` extra).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .events import Observer, ask_again, forget, observe, observers, running
from .logs import LogObserver, run_fields

__all__ = [
    "Observer",
    "RunFilter",
    "RunInfo",
    "ask_again",
    "current_run",
    "forget",
    "observe",
    "observers",
]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The run code is working for: its id, workflow, version and namespace; ``step``,
    the step's name inside a step (``None`` in the body itself); ``attempt``, the step's
    attempt inside a step, the run's attempt (1, then 2 after a retry ...) in the body."""

    run_id: str
    workflow: str
    version: str
    namespace: str
    step: str | None
    attempt: int


def current_run() -> RunInfo | None:
    """The run the calling code works for, in a workflow body or a step's function;
    ``None`` elsewhere."""
    found = running()
    if found is None:
        return None
    run, step, attempt = found
    return RunInfo(run.run_id, run.workflow, run.version, run.namespace, step, attempt)


class RunFilter(logging.Filter):
    """Adds the current run to every record emitted inside a run, as the attributes
    ``durable_run_id``, ``durable_workflow``, ``durable_version``, ``durable_namespace``,
    ``durable_step`` and ``durable_attempt`` (the names of the package's own records'
    ``extra``); outside a run, ``None`` each (so a format string may name them). A value
    the record already has is kept. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = running()
        fields = run_fields(*found) if found is not None else dict.fromkeys(run_fields.NAMES)
        for name, value in fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


observe(LogObserver())
try:
    from .spans import SpanObserver
except ImportError:  # opentelemetry-api is not installed
    pass
else:
    observe(SpanObserver())
