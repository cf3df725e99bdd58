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
Receivers run in the process that sent the signal (the web process for starts, the worker
for finishes); keep them quick.
"""

from django.dispatch import Signal

run_started = Signal()
run_refused = Signal()
run_finished = Signal()
event_skipped = Signal()
