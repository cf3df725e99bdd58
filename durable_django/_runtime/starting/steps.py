"""The steps every start shares: validate it (:func:`prepare`, :func:`new_run`), build its
run, explain and announce a refusal, announce the runs started."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..._core.limits import text_lengths
from ..._core.records import NewRun
from ..._core.serialization import json_copy, validate_text
from ..._rules import concurrency as quotas
from ..._rules import tickets
from ..._rules.registry import WorkflowDefinition, validate_tags
from ...errors import ConcurrencyLimitError, RateLimitError
from ...observability import events as observing
from ...signals import listened, run_refused, run_started
from ...signals import send as send_signal
from .. import estimates
from ..handles import WorkflowRef
from .fair import keep_line

if TYPE_CHECKING:
    from ..._core.runtime import EngineConfig, Runtime


def prepare(
    engine: Runtime,
    workflow: WorkflowRef,
    input: Any,
    concurrency: quotas.ConcurrencyOption,
    rate_limit: quotas.RateLimitOption = None,
) -> tuple[WorkflowDefinition, Any, tuple[quotas.Limit, ...]]:
    """Validate a start: the definition, the input as JSON, and the limits that apply:
    its quotas (a per-start list, or one, replaces the workflow's whole list), then its
    rate limits (likewise, replacing the workflow's rate limits only)."""
    definition = engine.definition(workflow)
    input = json_copy(input, f"the input of workflow {definition.name!r}")
    return definition, input, quota_option(definition, concurrency, rate_limit)


def quota_option(
    definition: WorkflowDefinition,
    concurrency: quotas.ConcurrencyOption,
    rate_limit: quotas.RateLimitOption = None,
) -> tuple[quotas.Limit, ...]:
    """The quotas, then the rate limits, of a start: each kind the per-start option's
    when given, else the workflow's."""
    own = definition.concurrency if concurrency is None else quotas.for_start(concurrency)
    rates = definition.rate_limits if rate_limit is None else quotas.rates_for_start(rate_limit)
    return (*own, *rates)


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
    run_id = checked_run_id(run_id)
    tags = validate_tags(tags)
    namespace = _namespace(engine, namespace)
    return build_run(engine.config, definition, input, resolved, run_id, tags, namespace, parent_id)


def checked_run_id(run_id: str | None) -> str:
    """``run_id`` checked, or a new one when it is ``None``."""
    if run_id is None:
        return uuid.uuid4().hex
    return validate_text(run_id, "run_id", text_lengths().run_id)


def _namespace(engine: Runtime, namespace: str | None) -> str:
    """``namespace`` checked, or the engine's when it is ``None``."""
    if namespace is None:
        return engine.config.namespace
    return validate_text(namespace, "namespace", text_lengths().namespace)


def build_run(
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


def after_refusal(
    engine: Runtime,
    workflow: str,
    error: ConcurrencyLimitError,
    resolved: Sequence[quotas.Quota],
    *,
    give_ticket: bool = False,
) -> None:
    """A refusal: explained (the store's transaction has ended; under a fair quota, when
    the start's turn likely comes, after the tickets ahead of it), its line's tickets
    kept (:func:`~durable_django._runtime.starting.fair.keep_line`), then announced."""
    quota = next((quota for quota in resolved if quota.key == error.key), None)
    line: tickets.Line | None = error.line
    if isinstance(error, RateLimitError):  # its retry_after is exact already
        observing.refused(workflow, error)
        send_signal(run_refused, type(engine), engine=engine, workflow=workflow, error=error)
        return
    estimates.explain(
        engine,
        error,
        quota.count_statuses if quota else quotas.DEFAULT_CONCURRENCY_STATUSES,
        needed=quota.weight if quota else 1,
        ahead=line.ahead if line else 0,
    )
    if line is not None and quota is not None and quota.fair_window is not None:
        keep_line(engine, error, quota, line, give_ticket)
    observing.refused(workflow, error)
    send_signal(run_refused, type(engine), engine=engine, workflow=workflow, error=error)


def announce_started(engine: Runtime, runs: Sequence[NewRun]) -> None:
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
    "after_refusal",
    "announce_started",
    "build_run",
    "checked_run_id",
    "new_run",
    "prepare",
    "quota_option",
]
