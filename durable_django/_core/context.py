"""Which workflow body runs here: the context variable a turn sets around its body.

Low in the package, so that the start path can tell a start made inside a body (a child
start, which neither waits for a slot nor presents a ticket) without importing the turn
that sets it (:mod:`durable_django._runtime.execution`, which starts children through the engine).
"""

from __future__ import annotations

import contextvars

#: The context of the body running in this thread (or task), if any: a
#: :class:`durable_django._runtime.execution.Context`, read typed through
#: :func:`durable_django._runtime.execution.running_context` (typed loosely here, so
#: that this low module names nothing above it, not even for the type checker).
current_context: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "durable_django_context", default=None
)

__all__ = ["current_context"]
