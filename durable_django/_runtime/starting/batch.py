"""A batch of starts of one workflow (``Wf.dispatch_many``, ``engine.start_many``): every
element validated and its quotas resolved, then the store's one transaction, then the
refusals explained and the messages sent together."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from ..._core.limits import text_lengths
from ..._core.records import NewRun
from ..._core.serialization import json_copy, validate_text
from ..._rules import concurrency as quotas
from ..._rules import tickets
from ..._rules.registry import WorkflowDefinition, validate_tags
from ...errors import ConcurrencyLimitError, RateLimitError
from ...observability import events as observing
from ...signals import run_refused
from ...signals import send as send_signal
from ...stores.base import StartRequest, batch_index
from .. import estimates
from ..handles import BatchStart, RunHandle, WorkflowRef
from .fair import keep_line
from .options import DEFAULT_OPTIONS, StartOptions
from .steps import announce_started, build_run, checked_run_id, quota_option

if TYPE_CHECKING:
    from ..._core.runtime import Runtime


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
) -> tuple[WorkflowDefinition, tuple[quotas.Limit, ...], list[tuple[Any, str | None]]]:
    """Validate a batch: the definition, the quotas that apply, and each input as JSON
    with its run id; an error names the index of the element at fault."""
    definition = engine.definition(workflow)
    option = quota_option(definition, options.concurrency, options.rate_limit)
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
            checked_id = checked_run_id(run_id)
        run = build_run(config, definition, input, resolved, checked_id, tags, namespace)
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
        announce_started(engine, created)
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
    """A batch's refusals, as :func:`~durable_django._runtime.starting.steps.after_refusal` does
    one (the store's transaction has ended): each explained, then announced, in the
    batch's order. Refusals under one key, limit, counted statuses and weight share one
    estimate: it reads the key's holders and history once, whatever the number of
    elements the key refused. A batch presents no tickets and is given none; under a fair
    quota its elements wait behind the kept tickets like any start without one."""
    shared: dict[tuple[str, int, tuple[str, ...], int, int], estimates.Estimate] = {}
    for index, error in refused:
        if isinstance(error, RateLimitError):  # its retry_after is exact already
            observing.refused(workflow, error)
            send_signal(run_refused, type(engine), engine=engine, workflow=workflow, error=error)
            continue
        quota = next(q for q in requests[index].quotas if q.key == error.key and not q.rate)
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
            keep_line(engine, error, quota, line, give_ticket=False)
        observing.refused(workflow, error)
        send_signal(run_refused, type(engine), engine=engine, workflow=workflow, error=error)


__all__ = ["admit_many", "astart_many", "prepare_many", "start_many"]
