"""Which workflow body runs here: the context variable a turn sets around its body.

Low in the package, so that the start path can tell a start made inside a body (a child
start, which neither waits for a slot nor presents a ticket) without importing the turn
that sets it (:mod:`durable_django._runtime.execution`, which starts children through the engine).
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._runtime.execution import Context

#: The context of the body running in this thread (or task), if any.
current_context: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "durable_django_context", default=None
)

__all__ = ["current_context"]
