"""A single start: :func:`start` and :func:`astart` (waiting for a slot with ``wait``), a
child's, a retry's, and :func:`admit`, the steps after a start's quotas are resolved."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from asgiref.sync import sync_to_async

from ... import metrics
from ..._core.records import RunRecord
from ..._rules import concurrency as quotas
from ..._rules import tickets
from ..._rules.registry import WorkflowDefinition
from ...errors import ConcurrencyLimitError, DurableError
from ...observability import events as observing
from ...status import RunStatus
from .. import waiting
from ..handles import RunHandle, WorkflowRef
from .fair import Presented
from .options import DEFAULT_OPTIONS, StartOptions
from .steps import after_refusal, announce_started, checked_run_id, new_run, prepare, quota_option

if TYPE_CHECKING:
    from ..._core.runtime import Runtime


def start(
    engine: Runtime,
    workflow: WorkflowRef,
    input: Any = None,
    run_id: str | None = None,
    options: StartOptions = DEFAULT_OPTIONS,
) -> RunHandle:
    """What :meth:`Engine.start <durable_django.Engine.start>` does; with ``wait``, a
    refused start is tried again for up to that long (:mod:`durable_django._runtime.waiting`),
    presenting the ticket a fair quota gave its previous attempt."""
    seconds, presented, definition, input, option = _checked(engine, workflow, input, options)
    resolved = quotas.resolve(option, input, definition.name)
    attempt = _attempt(engine, definition, input, resolved, run_id, options, presented, seconds)
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
    seconds, presented, definition, input, option = _checked(engine, workflow, input, options)
    resolved = await quotas.aresolve(option, input, definition.name)
    attempt = _attempt(engine, definition, input, resolved, run_id, options, presented, seconds)
    if not seconds:
        return await sync_to_async(attempt)()
    keys = [quota.key for quota in resolved]
    await sync_to_async(waiting.check_may_wait)(engine.store, keys)
    with observing.waiting(), metrics.waited(definition.name):
        return await waiting.astart_waiting(engine.store, keys, seconds, attempt)


def _checked(
    engine: Runtime, workflow: WorkflowRef, input: Any, options: StartOptions
) -> tuple[float, Presented, WorkflowDefinition, Any, tuple[quotas.Limit, ...]]:
    """What :func:`start` and :func:`astart` check before the limits are resolved, in
    this order: the ``wait`` (refused inside a body), the ticket, the definition, the
    input, the limits that apply."""
    seconds = waiting.seconds(options.wait)
    if seconds:
        waiting.refuse_in_body()
    presented = Presented(options.ticket)
    prepared = prepare(engine, workflow, input, options.concurrency, options.rate_limit)
    return (seconds, presented, *prepared)


def _attempt(
    engine: Runtime,
    definition: WorkflowDefinition,
    input: Any,
    resolved: Sequence[quotas.Quota],
    run_id: str | None,
    options: StartOptions,
    presented: Presented,
    waits: float,
) -> Callable[[], RunHandle]:
    """One attempt of :func:`start`, presenting its ticket, made as often as it
    ``waits``. A waiting start without a ``run_id`` starts the same new one in every
    attempt: one whose answer was lost with its connection after it created the run is
    found by the next (whose handle says ``created``: this start created it)."""
    own = bool(waits) and run_id is None
    if own:
        run_id = checked_run_id(None)

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
    definition, input, option = prepare(
        engine, workflow, input, options.concurrency, options.rate_limit
    )
    resolved = quotas.resolve(option, input, definition.name)
    tags, namespace = options.tags, parent.namespace
    return admit(
        engine, definition, input, resolved, run_id, tags, namespace, parent_id=parent.run_id
    )


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
    option = quota_option(definition, concurrency)
    resolved = quotas.resolve(option, run.input, run.workflow)
    with observing.start("retry", run.workflow, run.namespace, resolved) as observed:
        try:
            engine.store.retry_run(run, resolved, read_namespace=engine.read_namespace)
        except ConcurrencyLimitError as error:
            after_refusal(engine, run.workflow, error, resolved)
            raise
        if observed is not None:
            observed.run_ids.append(run_id)
            observed.created = 1
    engine.send_each((run,))
    return RunHandle(engine, run_id, run.workflow, True)


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
            after_refusal(engine, run.workflow, error, resolved, give_ticket=ticket is not False)
            raise
        if observed is not None:
            observed.run_ids.append(run.run_id)
            observed.created = int(outcome.created)
    if outcome.created:
        engine.send_each((run,))
        announce_started(engine, (run,))
    return RunHandle(engine, run.run_id, outcome.workflow, outcome.created)


__all__ = ["admit", "astart", "retry", "start", "start_child"]
