"""The start path: every way a run begins goes through this module, in this order.

``engine.start`` / ``astart`` (and ``Wf.dispatch``, ``Wf.start`` ...), child starts
(``ctx.child``, ``ctx.start_child``), ``engine.retry``, event triggers
(:func:`durable_django.events.publish`) and schedule windows
(:func:`durable_django.schedules.fire`) each take these steps:

1. **validate**: the workflow, the input (JSON), the run id, tags and namespace
   (:func:`prepare`, :func:`new_run`), before anything is written;
2. **resolve the quotas**: the per-start ``concurrency`` or else the workflow's, for this
   input (:func:`durable_django.concurrency.resolve`): for each quota one key, one int
   limit and the run's weight, in their declared order, or none;
3. **lock**: every quota key's lock, taken in key order, held until the transaction ends;
4. **idempotency**: a ``run_id`` already taken returns that run, and is never refused
   (checked under the lock, so two starts racing with one run id make one run);
5. **count**: each key's active units (the weights of its counted runs); for the first
   quota, in declared order, whose units and the run's weight exceed its limit,
   :class:`ConcurrencyLimitError` (and the ``run_refused`` signal), with nothing created;
   once the start's transaction has ended, the error is given its ``retry_after``
   (:func:`durable_django.estimates.explain`);
6. **insert**: the run and its tags; for a retry, the failed run made pending again;
7. **enqueue on commit**: the Celery message, and ``run_started``, once the transaction
   commits.

Steps 3 to 6 happen in the store, in one transaction: ``BaseStore.start_run`` for a new
run (one call on PostgreSQL), ``BaseStore.retry_run`` for a retry.

A batch (``Wf.dispatch_many``, ``engine.start_many``: :func:`start_many`) takes the same
steps for many runs at once: steps 1 and 2 for every element before anything is written,
steps 3 to 6 in one transaction of the store (``BaseStore.start_runs``, one call on
PostgreSQL), and step 7 once for the batch (:meth:`Engine.send_each`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import typing
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeAlias

from asgiref.sync import sync_to_async
from django.utils import timezone

from . import concurrency as quotas
from . import estimates, metrics, tickets, waiting
from .errors import ConcurrencyLimitError, DurableError, RunFailed
from .limits import text_lengths
from .observability import events as observing
from .records import NewRun, RunRecord
from .registry import WorkflowDefinition, validate_tags
from .serialization import json_copy, validate_text
from .signals import listened, run_refused, run_started
from .signals import send as send_signal
from .status import RunStatus
from .stores.base import StartRequest, batch_index

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    from .declaration import BaseWorkflow, Workflow
    from .runtime import EngineConfig, Runtime

    #: A workflow's input and output, as its body declares them; ``Any`` where unsaid.
    Input = TypeVar("Input", default=Any)
    Output = TypeVar("Output", default=Any)
else:  # a TypeVar's default is the type checker's (PEP 696); Python 3.11 has none
    Input = typing.TypeVar("Input")
    Output = typing.TypeVar("Output")

logger = logging.getLogger("durable_django.starting")

#: What names a workflow to start: its registered name, a declared workflow (a
#: ``@workflow`` function or ``BaseWorkflow`` class), or a definition.
WorkflowRef: TypeAlias = "str | WorkflowDefinition | Workflow | type[BaseWorkflow]"


@dataclass(frozen=True, slots=True)
class StartOptions:
    """How a start is made, besides its workflow, input and run id: the keyword options of
    ``Wf.dispatch``, ``engine.start`` and their twins, built once where the call comes in
    and passed down the start path as one value (change one with
    ``dataclasses.replace``). Each means what it means on :meth:`Engine.start
    <durable_django.Engine.start>`; a batch and a child start use the first ones."""

    concurrency: quotas.ConcurrencyOption = None
    tags: Iterable[str] = ()
    namespace: str | None = None
    wait: waiting.Wait = None
    ticket: str | None = None


#: A start with every option left as it is.
DEFAULT_OPTIONS = StartOptions()


class RunHandle(Generic[Output]):
    """A started run: its id, its workflow, whether this start created it, and its fate.

    ``run_id`` (str), ``workflow`` (its name) and ``created`` (False when an idempotent
    re-start found the run already there) are plain attributes; ``status`` is read afresh.
    A handle from ``Wf.dispatch`` is typed with the workflow's output (``RunHandle[int]``
    for a body returning an ``int``), which ``result`` returns.
    """

    __slots__ = ("created", "engine", "run_id", "workflow")

    def __init__(self, engine: Runtime, run_id: str, workflow: str, created: bool) -> None:
        self.engine = engine
        self.run_id = run_id
        self.workflow = workflow
        self.created = created

    def __repr__(self) -> str:
        return f"<RunHandle {self.workflow} {self.run_id} created={self.created}>"

    @property
    def status(self) -> str:
        """The run's status, read afresh."""
        return self.engine.get_run(self.run_id).status

    def result(self, timeout: float | None = None) -> Output:
        """Wait for the run to settle; return its output, or raise :class:`RunFailed`."""
        output: Output = _outcome(self.engine.wait_for_run(self.run_id, timeout=timeout))
        return output

    async def aresult(self, timeout: float | None = None) -> Output:
        """``result`` for async code."""
        return await sync_to_async(self.result)(timeout)


def _outcome(run: RunRecord) -> Any:
    if run.status == RunStatus.COMPLETED:
        return run.output
    raise RunFailed(run.run_id, run.status, run.error)


# the starts ---------------------------------------------------------------------------


def start(
    engine: Runtime,
    workflow: WorkflowRef,
    input: Any = None,
    run_id: str | None = None,
    options: StartOptions = DEFAULT_OPTIONS,
) -> RunHandle:
    """What :meth:`Engine.start <durable_django.Engine.start>` does; with ``wait``, a
    refused start is tried again for up to that long (:mod:`durable_django.waiting`),
    presenting the ticket a fair quota gave its previous attempt."""
    seconds = waiting.seconds(options.wait)
    if seconds:
        waiting.refuse_in_body()
    presented = Presented(options.ticket)
    definition, input, option = prepare(engine, workflow, input, options.concurrency)
    resolved = quotas.resolve(option, input, definition.name)
    attempt = _attempt(
        engine, definition, input, resolved, run_id, options, presented, bool(seconds)
    )

    if not seconds:
        return attempt()
    keys = [quota.key for quota in resolved]
    waiting.check_may_wait(engine.store, keys)
    with observing.waiting(), metrics.waited(definition.name):
        return waiting.start_waiting(engine.store, keys, seconds, attempt)


async def astart(
    engine: Runtime,
    workflow: WorkflowRef,
    input: Any = None,
    run_id: str | None = None,
    options: StartOptions = DEFAULT_OPTIONS,
) -> RunHandle:
    """:func:`start` for async code: an async limit function is awaited on the loop, and
    a start with ``wait`` waits without blocking it."""
    seconds = waiting.seconds(options.wait)
    if seconds:
        waiting.refuse_in_body()
    presented = Presented(options.ticket)
    definition, input, option = prepare(engine, workflow, input, options.concurrency)
    resolved = await quotas.aresolve(option, input, definition.name)
    attempt = _attempt(
        engine, definition, input, resolved, run_id, options, presented, bool(seconds)
    )

    if not seconds:
        return await sync_to_async(attempt)()
    keys = [quota.key for quota in resolved]
    await sync_to_async(waiting.check_may_wait)(engine.store, keys)
    with observing.waiting(), metrics.waited(definition.name):
        return await waiting.astart_waiting(engine.store, keys, seconds, attempt)


def _attempt(
    engine: Runtime,
    definition: WorkflowDefinition,
    input: Any,
    resolved: Sequence[quotas.Quota],
    run_id: str | None,
    options: StartOptions,
    presented: Presented,
    waits: bool,
) -> Callable[[], RunHandle]:
    """One attempt of :func:`start`, presenting its ticket, made as often as it
    ``waits``. A waiting start without a ``run_id`` starts the same new one in every
    attempt: one whose answer was lost with its connection after it created the run is
    found by the next (whose handle says ``created``: this start created it)."""
    own = waits and run_id is None
    if own:
        run_id = _run_id(None)

    tags, namespace = options.tags, options.namespace

    def attempt() -> RunHandle:
        handle = presented.attempt(
            lambda held: admit(
                engine, definition, input, resolved, run_id, tags, namespace, ticket=held
            )
        )
        if own and not handle.created:
            return RunHandle(engine, handle.run_id, handle.workflow, True)
        return handle

    return attempt


class Presented:
    """The ticket a start presents to fair quotas: the one given (``ticket=``, checked
    here, before anything is written), else the one the request being served presented
    (:func:`durable_django.tickets.presenting`, ignored when not valid); after a
    refusal, the ticket it gave, for the next attempt of a waiting start."""

    __slots__ = ("ticket",)

    def __init__(self, token: str | None) -> None:
        self.ticket = (
            tickets.read(token)
            if token is not None
            else tickets.read_presented(tickets.presented())
        )

    def attempt(self, admit: Callable[[tickets.Ticket | None], RunHandle]) -> RunHandle:
        """``admit(ticket)``, keeping the ticket a refusal gives."""
        try:
            return admit(self.ticket)
        except ConcurrencyLimitError as error:
            if error.ticket is not None:
                self.ticket = tickets.read(error.ticket)
            raise


def start_child(
    engine: Runtime,
    parent: RunRecord,
    workflow: WorkflowRef,
    input: Any,
    run_id: str,
    options: StartOptions = DEFAULT_OPTIONS,
) -> RunHandle:
    """Start a child of ``parent``, in its namespace, under the child's quota (the
    ``concurrency`` and ``tags`` of ``options``)."""
    definition, input, option = prepare(engine, workflow, input, options.concurrency)
    resolved = quotas.resolve(option, input, definition.name)
    tags, namespace = options.tags, parent.namespace
    return admit(
        engine, definition, input, resolved, run_id, tags, namespace, parent_id=parent.run_id
    )


@dataclass(frozen=True, slots=True)
class Planned:
    """One start of :func:`start_together`: a workflow, its JSON input, and its run id
    (``None`` for a new one)."""

    definition: WorkflowDefinition
    input: Any
    run_id: str | None = None


def start_together(
    engine: Runtime, planned: Sequence[Planned]
) -> tuple[dict[int, RunHandle], dict[int, Exception]]:
    """Start several runs in one transaction, each under its own quota: what an event
    does for its subscribers. Returns the handles of the runs started and the errors of
    the starts skipped, each by its index in ``planned``.

    Every quota is resolved first, before anything is written: a start whose key or
    limit function fails on its input is skipped. Then each start runs in a savepoint of
    its own: one refused by its quota, or whose values cannot be stored, is skipped and
    undone alone, and the others go on; an unexpected error (the database refusing a
    write, a lost connection) undoes them all and sends nothing. The keys are locked in
    one order, by key then workflow name, and each lock is held until the transaction
    ends: two batches sharing keys never wait on each other in a cycle. When a start has
    several quotas, every key of the batch is locked first, in key order, before the
    first start.
    """
    started: dict[int, RunHandle] = {}
    skipped: dict[int, Exception] = {}
    ready: list[tuple[int, Planned, tuple[quotas.Quota, ...]]] = []
    for index, start in enumerate(planned):
        try:
            resolved = quotas.resolve(
                start.definition.concurrency, start.input, start.definition.name
            )
        except (TypeError, ValueError) as error:
            skipped[index] = error
        else:
            ready.append((index, start, resolved))
    ready.sort(
        key=lambda item: (min((q.key for q in item[2]), default=""), item[1].definition.name)
    )
    store = engine.store
    several = any(len(resolved) > 1 for _, _, resolved in ready)
    keys = {quota.key for _, _, resolved in ready for quota in resolved}
    with store.atomic(), store.quota_locks(keys) if several else contextlib.nullcontext():
        for index, start, resolved in ready:
            try:
                with store.atomic():  # a savepoint: a refusal undoes this start only
                    started[index] = admit(
                        engine, start.definition, start.input, resolved, start.run_id, (), None
                    )
            except (DurableError, TypeError, ValueError) as error:
                skipped[index] = error
    return started, skipped


def retry(
    engine: Runtime, run_id: str, *, concurrency: quotas.ConcurrencyOption = None
) -> RunHandle:
    """What :meth:`Engine.retry <durable_django.Engine.retry>` does: a start of the failed
    run, as its next attempt, through the same steps as any start."""
    run = engine.get_run(run_id)
    if run.status != RunStatus.FAILED:
        raise DurableError(f"only a failed run can be retried; run {run_id!r} is {run.status}")
    definition = engine.registry.get(run.workflow, run.version) or engine.registry.latest(
        run.workflow
    )
    option = _quota_option(definition, concurrency)
    resolved = quotas.resolve(option, run.input, run.workflow)
    with observing.start("retry", run.workflow, run.namespace, resolved) as observed:
        try:
            engine.store.retry_run(run, resolved, read_namespace=engine.read_namespace)
        except ConcurrencyLimitError as error:
            _refused(engine, run.workflow, error, resolved)
            raise
        if observed is not None:
            observed.run_ids.append(run_id)
            observed.created = 1
    engine.send_each((run,))
    return RunHandle(engine, run_id, run.workflow, True)


# batches ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchStart(Generic[Output]):
    """What a batch of starts did (``Wf.dispatch_many``, ``engine.start_many``).

    ``started``: the handles of the runs started, in the order of the inputs (an
    idempotent re-start among them has ``created`` False). ``refused``: ``(index,
    error)`` pairs, the index of the input in the batch and the
    :class:`~durable_django.ConcurrencyLimitError` that refused it. ``handles``: one
    entry per input, its handle or ``None`` where it was refused.
    """

    started: list[RunHandle[Output]]
    refused: list[tuple[int, ConcurrencyLimitError]]
    handles: list[RunHandle[Output] | None]


def start_many(
    engine: Runtime,
    workflow: WorkflowRef,
    inputs: Iterable[Any],
    run_ids: Iterable[str | None] | None = None,
    options: StartOptions = DEFAULT_OPTIONS,
) -> BatchStart:
    """What :meth:`Engine.start_many <durable_django.Engine.start_many>` does (with the
    ``concurrency``, ``tags`` and ``namespace`` of ``options``)."""
    definition, option, batch = prepare_many(engine, workflow, inputs, run_ids, options)
    quotas_of: list[tuple[quotas.Quota, ...]] = []
    for index, (input, _) in enumerate(batch):
        with batch_index(index):  # an error names the element
            quotas_of.append(quotas.resolve(option, input, definition.name))
    return admit_many(engine, definition, batch, quotas_of, options.tags, options.namespace)


async def astart_many(
    engine: Runtime,
    workflow: WorkflowRef,
    inputs: Iterable[Any],
    run_ids: Iterable[str | None] | None = None,
    options: StartOptions = DEFAULT_OPTIONS,
) -> BatchStart:
    """:func:`start_many` for async code: an async limit function is awaited on the loop."""
    definition, option, batch = prepare_many(engine, workflow, inputs, run_ids, options)
    quotas_of: list[tuple[quotas.Quota, ...]] = []
    for index, (input, _) in enumerate(batch):
        with batch_index(index):  # an error names the element
            quotas_of.append(await quotas.aresolve(option, input, definition.name))
    return await sync_to_async(admit_many)(
        engine, definition, batch, quotas_of, options.tags, options.namespace
    )


def prepare_many(
    engine: Runtime,
    workflow: WorkflowRef,
    inputs: Iterable[Any],
    run_ids: Iterable[str | None] | None,
    options: StartOptions = DEFAULT_OPTIONS,
) -> tuple[WorkflowDefinition, tuple[quotas.Concurrency, ...], list[tuple[Any, str | None]]]:
    """Validate a batch: the definition, the quotas that apply, and each input as JSON
    with its run id; an error names the index of the element at fault."""
    definition = engine.definition(workflow)
    option = _quota_option(definition, options.concurrency)
    if isinstance(inputs, str | bytes | dict) or not isinstance(inputs, Iterable):
        raise TypeError(f"inputs must be a list of inputs, not {type(inputs).__name__}")
    inputs = list(inputs)
    if run_ids is None:
        ids: list[str | None] = [None] * len(inputs)
    else:
        if isinstance(run_ids, str | bytes) or not isinstance(run_ids, Iterable):
            raise TypeError(f"run_ids must be a list of run ids, not {type(run_ids).__name__}")
        ids = list(run_ids)
        if len(ids) != len(inputs):
            raise ValueError(f"run_ids has {len(ids)} item(s) for {len(inputs)} input(s)")
    what = f"the input of workflow {definition.name!r}"
    batch = []
    for index, (input, run_id) in enumerate(zip(inputs, ids, strict=True)):
        with batch_index(index):
            batch.append((json_copy(input, what), run_id))
    return definition, option, batch


def admit_many(
    engine: Runtime,
    definition: WorkflowDefinition,
    batch: Sequence[tuple[Any, str | None]],
    quotas_of: Sequence[Sequence[quotas.Quota]],
    tags: Iterable[str],
    namespace: str | None,
) -> BatchStart:
    """The steps of a batch after its quotas are resolved: every run checked, then the
    store's one transaction, then each refusal explained and ``run_refused`` sent for it
    (:func:`_refused_many`), and on commit the messages of the runs created, sent
    together, and ``run_started`` for each."""
    tags = validate_tags(tags)  # the batch's, checked once, before any element
    if namespace is not None:
        validate_text(namespace, "namespace", text_lengths().namespace)
    if not batch:
        return BatchStart([], [], [])
    config = engine.config
    if namespace is None:
        namespace = config.namespace
    requests = []
    for index, ((input, run_id), resolved) in enumerate(zip(batch, quotas_of, strict=True)):
        with batch_index(index):
            checked_id = _run_id(run_id)
        run = _new_run(config, definition, input, resolved, checked_id, tags, namespace)
        requests.append(StartRequest(run, resolved, check_existing=run_id is not None))
    every_quota = (quota for each in quotas_of for quota in each)
    with observing.start("batch", definition.name, namespace, every_quota, len(batch)) as observed:
        outcomes = engine.store.start_runs(requests, read_namespace=engine.read_namespace)
        handles, refused, created = _sorted_outcomes(engine, requests, outcomes)
        if refused:
            _refused_many(engine, definition.name, refused, requests)
        if observed is not None:
            observed.run_ids.extend(handle.run_id for handle in handles if handle is not None)
            observed.created = len(created)
            observed.refused.extend(error for _, error in refused)
    if created:
        engine.send_each(created)
        _announce_started(engine, created)
    return BatchStart([h for h in handles if h is not None], refused, handles)


def _sorted_outcomes(
    engine: Runtime,
    requests: Sequence[StartRequest],
    outcomes: Sequence[Any],
) -> tuple[list[RunHandle | None], list[tuple[int, ConcurrencyLimitError]], list[NewRun]]:
    """A batch's outcomes: a handle per element (``None`` where refused), the refusals by
    index, and the runs created."""
    handles: list[RunHandle | None] = []
    refused: list[tuple[int, ConcurrencyLimitError]] = []
    created: list[NewRun] = []
    for index, (request, outcome) in enumerate(zip(requests, outcomes, strict=True)):
        run = request.run
        if isinstance(outcome, ConcurrencyLimitError):
            refused.append((index, outcome))
            handles.append(None)
            continue
        if outcome.created:
            created.append(run)
        handles.append(RunHandle(engine, run.run_id, outcome.workflow, outcome.created))
    return handles, refused, created


def _refused_many(
    engine: Runtime,
    workflow: str,
    refused: Sequence[tuple[int, ConcurrencyLimitError]],
    requests: Sequence[StartRequest],
) -> None:
    """A batch's refusals, as :func:`_refused` does one (the store's transaction has
    ended): each explained, then announced, in the batch's order. Refusals under one key,
    limit, counted statuses and weight share one estimate: it reads the key's holders and
    history once, whatever the number of elements the key refused. A batch presents no
    tickets and is given none; under a fair quota its elements wait behind the kept
    tickets like any start without one."""
    shared: dict[tuple[str, int, tuple[str, ...], int, int], estimates.Estimate] = {}
    for index, error in refused:
        quota = next(q for q in requests[index].quotas if q.key == error.key)
        statuses = tuple(quota.count_statuses)
        line: tickets.Line | None = error.line
        ahead = line.ahead if line else 0
        what = (error.key, error.limit, statuses, quota.weight, ahead)
        if what in shared:
            error.engine = engine
            error.estimate = shared[what]
            error.retry_after = error.estimate.seconds
        else:
            estimates.explain(engine, error, statuses, needed=quota.weight, ahead=ahead)
            if error.estimate is not None:
                shared[what] = error.estimate
        if line is not None and line.holds and quota.fair_window is not None:
            _keep_line(engine, error, quota, line, give_ticket=False)
        observing.refused(workflow, error)
        send_signal(run_refused, type(engine), engine=engine, workflow=workflow, error=error)


# the steps ----------------------------------------------------------------------------


def prepare(
    engine: Runtime,
    workflow: WorkflowRef,
    input: Any,
    concurrency: quotas.ConcurrencyOption,
) -> tuple[WorkflowDefinition, Any, tuple[quotas.Concurrency, ...]]:
    """Validate a start: the definition, the input as JSON, and the quotas that apply
    (a per-start list, or one, replaces the workflow's whole list)."""
    definition = engine.definition(workflow)
    input = json_copy(input, f"the input of workflow {definition.name!r}")
    return definition, input, _quota_option(definition, concurrency)


def _quota_option(
    definition: WorkflowDefinition, concurrency: quotas.ConcurrencyOption
) -> tuple[quotas.Concurrency, ...]:
    if concurrency is None:
        return definition.concurrency
    return quotas.for_start(concurrency)


def admit(
    engine: Runtime,
    definition: WorkflowDefinition,
    input: Any,
    resolved: Sequence[quotas.Quota],
    run_id: str | None,
    tags: Iterable[str],
    namespace: str | None,
    *,
    parent_id: str | None = None,
    ticket: tickets.Ticket | Literal[False] | None = False,
) -> RunHandle:
    """The steps after the quotas are resolved: locks, idempotency, counts and insert in
    the store, then the message and ``run_started`` on commit (or ``run_refused``).

    ``ticket``: the ticket the start presents to fair quotas, ``None`` for none; a fair
    quota's refusal then gives one (``error.ticket``). ``False`` (a start that cannot
    come back with one: a child, an event's) presents none and is given none."""
    run = new_run(engine, definition, input, resolved, run_id, tags, namespace, parent_id)
    presented = {"ticket": ticket} if ticket else {}  # a store of the old contract has none
    kind: observing.StartKind = "start" if parent_id is None else "child"
    with observing.start(kind, run.workflow, run.namespace, resolved) as observed:
        try:
            outcome = engine.store.start_run(
                run,
                resolved,
                check_existing=run_id is not None,
                read_namespace=engine.read_namespace,
                **presented,
            )
        except ConcurrencyLimitError as error:
            _refused(engine, run.workflow, error, resolved, give_ticket=ticket is not False)
            raise
        if observed is not None:
            observed.run_ids.append(run.run_id)
            observed.created = int(outcome.created)
    if outcome.created:
        engine.send_each((run,))
        _announce_started(engine, (run,))
    return RunHandle(engine, run.run_id, outcome.workflow, outcome.created)


def new_run(
    engine: Runtime,
    definition: WorkflowDefinition,
    input: Any,
    resolved: Sequence[quotas.Quota],
    run_id: str | None,
    tags: Iterable[str],
    namespace: str | None,
    parent_id: str | None = None,
) -> NewRun:
    """The run to insert, its id, tags and namespace checked, in that order (a new id when
    none is given; the engine's namespace when none is given), with one tag per quota,
    weighing the quota's weight."""
    run_id = _run_id(run_id)
    tags = validate_tags(tags)
    namespace = _namespace(engine, namespace)
    return _new_run(engine.config, definition, input, resolved, run_id, tags, namespace, parent_id)


def _run_id(run_id: str | None) -> str:
    """``run_id`` checked, or a new one when it is ``None``."""
    if run_id is None:
        return uuid.uuid4().hex
    return validate_text(run_id, "run_id", text_lengths().run_id)


def _namespace(engine: Runtime, namespace: str | None) -> str:
    """``namespace`` checked, or the engine's when it is ``None``."""
    if namespace is None:
        return engine.config.namespace
    return validate_text(namespace, "namespace", text_lengths().namespace)


def _new_run(
    config: EngineConfig,
    definition: WorkflowDefinition,
    input: Any,
    resolved: Sequence[quotas.Quota],
    run_id: str,
    tags: tuple[str, ...],
    namespace: str,
    parent_id: str | None = None,
) -> NewRun:
    """:func:`new_run` from parts already checked."""
    return NewRun(
        run_id=run_id,
        workflow=definition.name,
        version=definition.version,
        namespace=namespace,
        input=input,
        tags=tuple(dict.fromkeys((*definition.tags, *tags, *(quota.tag for quota in resolved)))),
        queue=definition.queue if definition.remote else config.queue,
        parent_id=parent_id,
        weights={quota.tag: quota.weight for quota in resolved if quota.weight != 1},
    )


def _refused(
    engine: Runtime,
    workflow: str,
    error: ConcurrencyLimitError,
    resolved: Sequence[quotas.Quota],
    *,
    give_ticket: bool = False,
) -> None:
    """A refusal: explained (the store's transaction has ended; under a fair quota, when
    the start's turn likely comes, after the tickets ahead of it), its line's tickets
    kept (:func:`_keep_line`), then announced."""
    quota = next((quota for quota in resolved if quota.key == error.key), None)
    line: tickets.Line | None = error.line
    estimates.explain(
        engine,
        error,
        quota.count_statuses if quota else quotas.DEFAULT_CONCURRENCY_STATUSES,
        needed=quota.weight if quota else 1,
        ahead=line.ahead if line else 0,
    )
    if line is not None and quota is not None and quota.fair_window is not None:
        _keep_line(engine, error, quota, line, give_ticket)
    observing.refused(workflow, error)
    send_signal(run_refused, type(engine), engine=engine, workflow=workflow, error=error)


def _keep_line(
    engine: Runtime,
    error: ConcurrencyLimitError,
    quota: quotas.Quota,
    line: tickets.Line,
    give_ticket: bool,
) -> None:
    """A fair quota's refusal, in its key's line (the engine's namespace's): when the
    line alone turned the start away, a unit is held for it, and the line's tickets no
    hold binds (one may have ended since the line was read) are bound to one ending a
    window from now. With ``give_ticket``, the start's ticket (the one it presented, now
    kept, joining the back of the line bound to the hold it saw running, if it had not;
    or a new one, not kept until it comes back) goes on the error, valid until
    ``retry_after`` and the window have passed. A write that fails is logged: the
    refusal stands, and the ticket stays valid, unkept."""
    now = timezone.now()
    window = datetime.timedelta(seconds=quota.fair_window or 0)
    expires = now + datetime.timedelta(seconds=error.retry_after) + window
    hold_ends = line.hold_ends or (now + window if line.holds else None)
    presented = line.ticket
    if give_ticket:
        ticket = presented or tickets.issue(quota.key, quota.weight, now, expires)
        error.ticket = ticket.token
    try:
        if line.holds:  # a window from now for those no hold binds, whatever was read
            engine.store.hold_tickets(quota.key, engine.read_namespace, now + window)
        if give_ticket and presented is not None:
            engine.store.keep_ticket(
                tickets.KeptTicket(
                    presented.id,
                    quota.key,
                    now,
                    quota.weight,
                    expires,
                    engine.namespace,
                    hold_ends,
                ),
                most=tickets.most_kept(quota.limit),
            )
    except Exception:  # the refusal stands whatever the writes did
        logger.warning("could not keep the tickets of key %r", quota.key, exc_info=True)


def _announce_started(engine: Runtime, runs: Sequence[NewRun]) -> None:
    """``run_started`` for each of ``runs``, once the transaction commits; nothing to do
    when no receiver listens (asked once, for the whole batch), whether connected for
    every sender or for the engine's class, the signal's sender."""
    if listened(run_started, type(engine)):
        for run in runs:
            engine.store.on_commit(functools.partial(_send_started, engine, run))


def _send_started(engine: Runtime, run: NewRun) -> None:
    send_signal(
        run_started,
        type(engine),
        engine=engine,
        run_id=run.run_id,
        workflow=run.workflow,
        namespace=run.namespace,
        parent_id=run.parent_id,
    )


__all__ = [
    "BatchStart",
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
