"""The start path: every way a run begins goes through this module, in this order.

``engine.start`` / ``astart`` (and ``Wf.dispatch``, ``Wf.start`` ...), child starts
(``ctx.child``, ``ctx.start_child``), ``engine.retry``, event triggers
(:func:`durable_django._runtime.events.publish`) and schedule windows
(:func:`durable_django._runtime.schedules.fire`) each take these steps:

1. **validate**: the workflow, the input (JSON), the run id, tags and namespace
   (:func:`prepare`, :func:`new_run`), before anything is written;
2. **resolve the quotas**: the per-start ``concurrency`` or else the workflow's, for this
   input (:func:`durable_django._rules.concurrency.resolve`): for each quota one key, one int
   limit and the run's weight, in their declared order, or none;
3. **lock**: every quota key's lock, taken in key order, held until the transaction ends;
4. **idempotency**: a ``run_id`` already taken returns that run, and is never refused
   (checked under the lock, so two starts racing with one run id make one run);
5. **count**: each key's active units (the weights of its counted runs); for the first
   quota, in declared order, whose units and the run's weight exceed its limit,
   :class:`ConcurrencyLimitError` (and the ``run_refused`` signal), with nothing created;
   once the start's transaction has ended, the error is given its ``retry_after``
   (:func:`durable_django._runtime.estimates.explain`);
6. **insert**: the run and its tags; for a retry, the failed run made pending again;
7. **enqueue on commit**: the Celery message, and ``run_started``, once the transaction
   commits.

Steps 3 to 6 happen in the store, in one transaction: ``BaseStore.start_run`` for a new
run (one call on PostgreSQL), ``BaseStore.retry_run`` for a retry.

A batch (``Wf.dispatch_many``, ``engine.start_many``: :func:`start_many`) takes the same
steps for many runs at once: steps 1 and 2 for every element before anything is written,
steps 3 to 6 in one transaction of the store (``BaseStore.start_runs``, one call on
PostgreSQL), and step 7 once for the batch (:meth:`Engine.send_each`).

The package's modules, one job each: :mod:`.single` (a start, a child's, a retry's, and
:func:`admit`), :mod:`.batch` (:func:`start_many`), :mod:`.together` (an event's starts,
:func:`start_together`), :mod:`.fair` (fair quotas' tickets at the start path),
:mod:`.steps` (the steps they share) and :mod:`.options` (:class:`StartOptions`). What a
start returns is in :mod:`durable_django._runtime.handles`.
"""

from ..handles import BatchStart, Input, Output, RunHandle, WorkflowRef
from .batch import admit_many, astart_many, prepare_many, start_many
from .fair import Presented
from .options import DEFAULT_OPTIONS, StartOptions
from .single import admit, astart, retry, start, start_child
from .steps import new_run, prepare
from .together import Planned, start_together

__all__ = [
    "DEFAULT_OPTIONS",
    "BatchStart",
    "Input",
    "Output",
    "Planned",
    "Presented",
    "RunHandle",
    "StartOptions",
    "WorkflowRef",
    "admit",
    "admit_many",
    "astart",
    "astart_many",
    "new_run",
    "prepare",
    "prepare_many",
    "retry",
    "start",
    "start_child",
    "start_many",
    "start_together",
]
