"""Quota usage: which keys hold active runs, how many, and against what limit."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._rules.concurrency import DEFAULT_CONCURRENCY_STATUSES, Concurrency, limit_for, quota_tag
from . import estimates

if TYPE_CHECKING:
    from .._core.runtime import Runtime
    from ..stores.base import BaseStore

#: How many of an idle key's latest runs are read to learn which workflows use the key.
RECENT_RUNS = 50


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    """One quota key: its active runs (in units: each run counts its weight, 1 unless
    its quota says more), the workflows they belong to, and the limit declared for it
    (``None`` when nothing declares one, or its limit function failed).

    ``limit_computed`` tells the limit came from a limit function called with this key;
    ``limit_error`` holds what a failing limit function raised.
    """

    key: str
    active: int
    limit: int | None
    workflows: tuple[str, ...]
    limit_computed: bool = False
    limit_error: str | None = None

    @property
    def tag(self) -> str:
        """The tag the key's runs carry."""
        return quota_tag(self.key)

    @property
    def full(self) -> bool:
        """Whether a start under the declared limit would be refused now."""
        return self.limit is not None and self.active >= self.limit


def estimate_for(engine: Runtime, usage: QuotaUsage) -> estimates.Estimate | None:
    """A busy key's estimate against its declared limit (against its active runs when
    no limit is known: when its next run likely ends); ``None`` for an idle key."""
    if not usage.active:
        return None
    limit = usage.limit if usage.limit is not None else usage.active
    return estimates.estimate(engine, usage.key, limit)


@dataclass(frozen=True, slots=True)
class DeclaredLimit:
    """A limit declared for one key, or the error its limit function raised."""

    limit: int | None = None
    computed: bool = False
    error: str | None = None


def active_keys(store: BaseStore, namespace: str | None) -> dict[str, dict[str, int]]:
    """``{key: {workflow: active units}}`` for every quota key holding active runs."""
    return store.quota_keys(DEFAULT_CONCURRENCY_STATUSES, namespace)


def recent_workflows(engine: Runtime, key: str) -> tuple[str, ...]:
    """The workflows of the key's latest :data:`RECENT_RUNS` runs, finished or not."""
    runs = engine.store.list_runs(
        tag=quota_tag(key), namespace=engine.read_namespace, limit=RECENT_RUNS
    )
    return tuple(sorted({run.workflow for run in runs}))


def schedule_limits(engine: Runtime) -> dict[str, list[int]]:
    """``{key: [limits]}`` of the schedules with a quota of their own: those declared on
    the registered workflows and, on a shared store, the rows of the schedule table (which
    win over a declaration of the same schedule key, as the tick does)."""
    by_schedule: dict[str, tuple[str, int | None]] = {}
    for definition in engine.registry.all():
        if definition is not engine.registry.latest(definition.name):
            continue
        for spec in definition.schedules:
            if spec.concurrency and spec.concurrency.get("key"):
                by_schedule[spec.key] = (spec.concurrency["key"], spec.concurrency.get("limit"))
    if engine.store.is_shared:
        from .schedules import own_quotas  # they read the models: once the registry is ready

        by_schedule.update(own_quotas())
    limits: dict[str, list[int]] = defaultdict(list)
    for quota_key, limit in by_schedule.values():
        if limit is not None:
            limits[quota_key].append(limit)
    return limits


def workflow_limit(engine: Runtime, workflow: str, key: str) -> DeclaredLimit | None:
    """The limit ``workflow``'s latest version declares for ``key`` (its limit function,
    sync or async, called with the key), or ``None`` when it declares no quota. A limit
    function that fails is reported, unless the key is not one of the workflow's own
    (see :func:`started_under`). Of a list of quotas, the one whose key function gives
    ``key`` for the input of the key's latest run of the workflow."""
    try:
        declared = engine.registry.latest(workflow).concurrency
    except LookupError:
        return None
    if not declared:
        return None
    if len(declared) == 1:
        concurrency = declared[0]
    else:
        found = quota_of_key(engine, workflow, declared, key)
        if found is None:
            return None
        concurrency = found
    try:
        limit = limit_for(concurrency, key, workflow)
    except Exception as error:  # the function's own error, whatever it is: shown, not raised
        if not started_under(engine, workflow, concurrency, key):
            return None  # a per-start quota's key: the function was never meant for it
        cause = error.__cause__ or error
        return DeclaredLimit(error=f"{type(cause).__qualname__}: {cause}")
    return DeclaredLimit(limit, computed=callable(concurrency.limit))


def quota_of_key(
    engine: Runtime, workflow: str, declared: Iterable[Concurrency], key: str
) -> Concurrency | None:
    """The first of ``declared`` whose key function gives ``key`` for the input of the
    key's latest run of ``workflow`` (``None``: none does, or the key has no run)."""
    runs = engine.store.list_runs(
        tag=quota_tag(key), workflow=workflow, namespace=engine.read_namespace, limit=1
    )
    if not runs:
        return None
    for concurrency in declared:
        try:
            if callable(concurrency.key) and concurrency.key(runs[0].input) == key:
                return concurrency
        except Exception:  # the key function refuses this input: not this quota
            continue
    return None


def started_under(engine: Runtime, workflow: str, concurrency: Concurrency, key: str) -> bool:
    """Whether the key's latest run of ``workflow`` was started under the workflow's own
    quota: its key function gives ``key`` for that run's input. A run started under a
    per-start quota carries that quota's key instead."""
    runs = engine.store.list_runs(
        tag=quota_tag(key), workflow=workflow, namespace=engine.read_namespace, limit=1
    )
    if not runs:
        return True
    try:
        return callable(concurrency.key) and concurrency.key(runs[0].input) == key
    except Exception:  # the key function refuses this input: not started under it
        return False


def declared_limit(
    engine: Runtime, workflows: Iterable[str], key: str, from_schedules: list[int]
) -> DeclaredLimit:
    """The smallest limit declared for ``key``. Schedules name their key literally, so
    their limits win; otherwise the limits the workflows using the key declare."""
    if from_schedules:
        return DeclaredLimit(min(from_schedules))
    declared = [found for name in workflows if (found := workflow_limit(engine, name, key))]
    known = [(found.limit, found.computed) for found in declared if found.limit is not None]
    error = next((found.error for found in declared if found.error is not None), None)
    if not known:
        return DeclaredLimit(error=error)
    limit, computed = min(known, key=lambda pair: pair[0])
    return DeclaredLimit(limit, computed, error)


def quota_usage(engine: Runtime, key: str | None = None) -> list[QuotaUsage]:
    """Every key with active runs (or just ``key``, busy or not), busiest first.

    An idle key's workflows are those of its latest runs, so its limit is known as long
    as some of its runs are kept."""
    found = active_keys(engine.store, engine.read_namespace)
    if key is not None:
        found = {key: found.get(key, {})}
    by_key = schedule_limits(engine)
    usage = []
    for name, by_workflow in found.items():
        workflows = tuple(sorted(by_workflow)) or recent_workflows(engine, name)
        declared = declared_limit(engine, workflows, name, by_key.get(name, []))
        usage.append(
            QuotaUsage(
                key=name,
                active=sum(by_workflow.values()),
                limit=declared.limit,
                workflows=workflows,
                limit_computed=declared.computed,
                limit_error=declared.error,
            )
        )
    return sorted(usage, key=lambda u: (-u.active, u.key))
