"""Django signals a project can connect to (``django.dispatch``), all sent by the engine.

- ``run_started``: a start created a run; sent once its transaction commits.
  Arguments: ``run_id``, ``workflow``, ``namespace``, ``parent_id``.
- ``run_refused``: a start was refused by its quota (nothing was created).
  Arguments: ``workflow``, ``error`` (the :class:`~durable_django.ConcurrencyLimitError`).
- ``run_finished``: a run ended ``completed``, ``failed`` or ``cancelled``.
  Arguments: ``run_id``, ``workflow``, ``status``.
- ``event_skipped``: ``engine.publish_event`` skipped a subscriber (refused by its quota,
  or unable to start on the payload). Arguments: ``event``, ``event_id``, ``workflow``,
  ``error``.

The sender is the :class:`~durable_django.Engine` class and ``engine`` the engine itself.
A receiver that raises is logged (``durable_django.signals``) and does not change what
the engine does: the other receivers still run, a refusal still raises
``ConcurrencyLimitError``, a publish still starts its other subscribers. One that raises
what is not an ``Exception`` (``sys.exit()``) is logged too, and the receivers after it
are not called for that sending; the worker goes on.
Receivers run in the process that sent the signal (the web process for starts, the worker
for finishes); keep them quick.
"""

import logging
from typing import Any

from django.dispatch import Signal

from ._core.user_code import user_failure

logger = logging.getLogger("durable_django.signals")

run_started = Signal()
run_refused = Signal()
run_finished = Signal()
event_skipped = Signal()


def listened(signal: Signal, sender: Any) -> bool:
    """Whether ``signal`` has a receiver for ``sender`` (connected for every sender or for
    that one): ask before preparing what only receivers need. ``has_listeners()`` asked
    without the sender finds only the receivers connected for every sender."""
    return signal.has_listeners(sender)


def send(signal: Signal, sender: Any, **arguments: Any) -> None:
    """Send ``signal`` to every receiver, logging (not raising) a receiver's error. One
    that raises what is not an ``Exception`` (``sys.exit()``) is logged too, and ends
    this sending: the receivers after it are not called (a worker's shutdown passes on)."""
    try:
        responses = signal.send_robust(sender, **arguments)
    except BaseException as error:
        if not user_failure(error):
            raise
        logger.error(
            "a receiver of a signal sent by durable_django raised %s; the receivers after "
            "it were not called",
            type(error).__name__,
            exc_info=error,
        )
        return
    for receiver, result in responses:
        if isinstance(result, Exception):
            logger.error(
                "receiver %r of a signal sent by durable_django raised", receiver, exc_info=result
            )
