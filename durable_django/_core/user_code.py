"""What an exception raised through user code (a step's function, a body, a key, weight
or limit function) means: that code's failure, or something that must pass on.

Everything user code raises is its failure, ``SystemExit``, ``KeyboardInterrupt``,
``GeneratorExit`` and any other ``BaseException`` included, except two kinds, which pass
on untouched: the engine's own control flow (:class:`ControlFlow`: a run suspending, a
lease lost, a database gone), and the worker's shutdown (Celery's ``WorkerShutdown`` and
``WorkerTerminate``, and the ``SystemExit`` billiard raises through whatever runs in a
pool process it is ending on a signal).
"""

from __future__ import annotations

from billiard import common as billiard_common
from celery.exceptions import WorkerShutdown, WorkerTerminate


class ControlFlow(BaseException):
    """The engine's own exceptions that travel through user frames: never user code's
    failure. A ``BaseException`` so that user code's ``except Exception`` does not
    swallow them."""


def user_failure(error: BaseException) -> bool:
    """Whether ``error``, raised through user code, is that code's failure (see the
    module's docstring); ``False`` for what must pass on."""
    if isinstance(error, ControlFlow | WorkerShutdown | WorkerTerminate):
        return False
    return not (isinstance(error, SystemExit) and _pool_process_ending())


def _pool_process_ending() -> bool:
    """Whether this process is a Celery pool process that billiard's handler of a
    terminating signal (``revoke(terminate=True)``, a cold shutdown) is ending."""
    fired = getattr(billiard_common, "terminate_handler_fired", None)
    if fired is not None:
        return bool(fired())
    # billiard before terminate_handler_fired(): the flag its handler sets.
    return bool(getattr(billiard_common, "_should_have_exited", [False])[0])


__all__ = ["ControlFlow", "user_failure"]
