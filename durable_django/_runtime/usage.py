"""Quota usage: which keys hold active runs, how many, and against what limit; and which
rate limit keys started runs in their window, how many units, and when the next frees.

A concurrency key's limit and a rate key's are found by the same code: the
:class:`Kind` of limit says which tag its runs carry and which of a workflow's
declarations it reads."""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.utils import timezone

from .._rules.admission import rate_retry_after
from .._rules.concurrency import (
    DEFAULT_CONCURRENCY_STATUSES,
    Limit,
    Quota,
    RateLimit,
    limit_for,
    quota_tag,
    rate_tag,
)
from .._rules.overrides import Override
from . import estimates
from .overriding import overrides
from .purging import rate_windows_start

if TYPE_CHECKING:
    from .._core.runtime import Runtime
    from .._rules.registry import WorkflowDefinition
    from ..stores.base import BaseStore

#: How many of an idle key's latest runs are read to learn which workflows use the key.
RECENT_RUNS = 50


class InForce:
    """What a usage record of a key with a declared ``limit`` and maybe an operator's
    ``override`` says of the limit its starts obey now."""

    __slots__ = ()
    limit: int | None
    override: Override | None

    @property
    def limit_in_force(self) -> int | None:
        """The limit a start of the key obeys now: the override's, else the declared one."""
        return self.override.limit if self.override is not None else self.limit


@dataclass(frozen=True, slots=True)
class QuotaUsage(InForce):
    """One quota key: its active runs (in units: each run counts its weight, 1 unless
    its quota says more), the workflows they belong to, and the limit declared for it
    (``None`` when nothing declares one, or its limit function failed).

    ``limit_computed`` tells the limit came from a limit function called with this key;
    ``limit_error`` holds what a failing limit function raised; ``override`` is the
    operator's override in force for the key, if any (its limit is the one in force).
    """

    key: str
    active: int
    limit: int | None
    workflows: tuple[str, ...]
    limit_computed: bool = False
    limit_error: str | None = None
    override: Override | None = None

    @property
    def tag(self) -> str:
        """The tag the key's runs carry."""
        return quota_tag(self.key)

    @property
    def full(self) -> bool:
        """Whether a start under the limit in force would be refused now."""
        limit = self.limit_in_force
        return limit is not None and self.active >= limit


def estimate_for(engine: Runtime, usage: QuotaUsage) -> estimates.Estimate | None:
    """A busy key's estimate against its limit in force (against its active runs when
    no limit is known: when its next run likely ends); ``None`` for an idle key."""
    if not usage.active:
        return None
    limit = usage.limit_in_force if usage.limit_in_force is not None else usage.active
    return estimates.estimate(engine, usage.key, limit)


@dataclass(frozen=True, slots=True)
class RateUsage(InForce):
    """One rate limit key's window now: the ``used`` units of the runs started under it
    in the last ``per`` seconds (whatever became of them), the ``limit`` and ``per``
    declared for it (``None`` when nothing declares one, or its limit function failed;
    ``used`` then counts the units of the engine's longest declared window), the
    workflows those runs belong to, and ``retry_after``: the seconds from now until a
    start of weight 1 fits under the limit in force (``0.0`` while one does; ``None``
    when the limit or the window is unknown).

    ``limit_computed`` tells the limit came from a limit function called with this key;
    ``limit_error`` holds what a failing limit function raised; ``override`` is the
    operator's override in force for the key, if any (its limit is the one in force).
    """

    key: str
    used: int
    limit: int | None
    per: float | None
    workflows: tuple[str, ...]
    retry_after: float | None = None
    limit_computed: bool = False
    limit_error: str | None = None
    override: Override | None = None

    @property
    def tag(self) -> str:
        """The tag the key's runs carry."""
        return rate_tag(self.key)

    @property
    def full(self) -> bool:
        """Whether a start of weight 1 under the limit in force would be refused now."""
        limit = self.limit_in_force
        return limit is not None and self.used >= limit


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of limit, as the usage code reads it: the tag a key's runs carry and a
    workflow's declarations of that kind."""

    tag: Callable[[str], str]
    declared: Callable[[WorkflowDefinition], Sequence[Limit]]


#: Concurrency quotas: ``concurrency:<key>`` tags, ``concurrency=`` declarations.
CONCURRENCY = Kind(quota_tag, lambda definition: definition.concurrency)
#: Rate limits: ``rate:<key>`` tags, ``rate_limit=`` declarations.
RATE = Kind(rate_tag, lambda definition: definition.rate_limits)


@dataclass(frozen=True, slots=True)
class DeclaredLimit:
    """A limit declared for one key (with its window, ``per``, for a rate limit), or the
    error its limit function raised."""

    limit: int | None = None
    computed: bool = False
    error: str | None = None
    per: float | None = None


def active_keys(store: BaseStore, namespace: str | None) -> dict[str, dict[str, int]]:
    """``{key: {workflow: active units}}`` for every quota key holding active runs."""
    return store.quota_keys(DEFAULT_CONCURRENCY_STATUSES, namespace)


def recent_workflows(engine: Runtime, key: str, kind: Kind = CONCURRENCY) -> tuple[str, ...]:
    """The workflows of the key's latest :data:`RECENT_RUNS` runs, finished or not."""
    runs = engine.store.list_runs(
        tag=kind.tag(key), namespace=engine.read_namespace, limit=RECENT_RUNS
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


def workflow_limit(
    engine: Runtime, workflow: str, key: str, kind: Kind = CONCURRENCY
) -> DeclaredLimit | None:
    """The limit ``workflow``'s latest version declares for ``key`` (its limit function,
    sync or async, called with the key), or ``None`` when it declares no quota. A limit
    function that fails is reported, unless the key is not one of the workflow's own
    (see :func:`started_under`). Of a list of quotas, the one whose key function gives
    ``key`` for the input of the key's latest run of the workflow. Of ``kind``'s
    declarations: the workflow's quotas, or its rate limits."""
    try:
        declared = kind.declared(engine.registry.latest(workflow))
    except LookupError:
        return None
    if not declared:
        return None
    if len(declared) == 1:
        concurrency = declared[0]
    else:
        found = quota_of_key(engine, workflow, declared, key, kind)
        if found is None:
            return None
        concurrency = found
    try:
        limit = limit_for(concurrency, key, workflow)
    except Exception as error:  # the function's own error, whatever it is: shown, not raised
        if not started_under(engine, workflow, concurrency, key, kind):
            return None  # a per-start quota's key: the function was never meant for it
        cause = error.__cause__ or error
        return DeclaredLimit(error=f"{type(cause).__qualname__}: {cause}")
    per = concurrency.per if isinstance(concurrency, RateLimit) else None
    return DeclaredLimit(limit, computed=callable(concurrency.limit), per=per)


def quota_of_key(
    engine: Runtime, workflow: str, declared: Iterable[Limit], key: str, kind: Kind = CONCURRENCY
) -> Limit | None:
    """The first of ``declared`` whose key function gives ``key`` for the input of the
    key's latest run of ``workflow`` (``None``: none does, or the key has no run)."""
    runs = engine.store.list_runs(
        tag=kind.tag(key), workflow=workflow, namespace=engine.read_namespace, limit=1
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


def started_under(
    engine: Runtime, workflow: str, concurrency: Limit, key: str, kind: Kind = CONCURRENCY
) -> bool:
    """Whether the key's latest run of ``workflow`` was started under the workflow's own
    quota (or rate limit): its key function gives ``key`` for that run's input. A run
    started under a per-start quota carries that quota's key instead."""
    runs = engine.store.list_runs(
        tag=kind.tag(key), workflow=workflow, namespace=engine.read_namespace, limit=1
    )
    if not runs:
        return True
    try:
        return callable(concurrency.key) and concurrency.key(runs[0].input) == key
    except Exception:  # the key function refuses this input: not started under it
        return False


def declared_limit(
    engine: Runtime,
    workflows: Iterable[str],
    key: str,
    from_schedules: list[int],
    kind: Kind = CONCURRENCY,
) -> DeclaredLimit:
    """The smallest limit declared for ``key`` (a rate limit's with its ``per``).
    Schedules name their key literally, so their limits win; otherwise the limits the
    workflows using the key declare."""
    if from_schedules:
        return DeclaredLimit(min(from_schedules))
    declared = [found for name in workflows if (found := workflow_limit(engine, name, key, kind))]
    known = [found for found in declared if found.limit is not None]
    error = next((found.error for found in declared if found.error is not None), None)
    if not known:
        return DeclaredLimit(error=error)
    smallest = min(known, key=lambda found: found.limit or 0)
    return DeclaredLimit(smallest.limit, smallest.computed, error, smallest.per)


def overridden(engine: Runtime, key: str | None, kind: Kind) -> dict[str, Override]:
    """``{key: override}`` of the overrides of ``kind`` in force now (of ``key`` only,
    when given), in the engine's scope."""
    return {
        o.key: o for o in overrides(engine, key, "concurrency" if kind is CONCURRENCY else "rate")
    }


def quota_usage(engine: Runtime, key: str | None = None) -> list[QuotaUsage]:
    """Every key with active runs or an override in force (or just ``key``, busy or
    not), busiest first.

    An idle key's workflows are those of its latest runs, so its limit is known as long
    as some of its runs are kept."""
    found = active_keys(engine.store, engine.read_namespace)
    forced = overridden(engine, key, CONCURRENCY)
    if key is not None:
        found = {key: found.get(key, {})}
    else:
        found = {**{name: {} for name in forced}, **found}
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
                override=forced.get(name),
            )
        )
    return sorted(usage, key=lambda u: (-u.active, u.key))


def has_window(usage: RateUsage) -> bool:
    """Whether a rate key is worth showing beside a quota key of the same name: runs in
    its window, a limit declared for it (found, or failed), or an override."""
    return (
        bool(usage.used)
        or usage.limit is not None
        or usage.limit_error is not None
        or usage.override is not None
    )


def rate_usage(engine: Runtime, key: str | None = None) -> list[RateUsage]:
    """Every rate limit key with runs inside its window or an override in force (or
    just ``key``, busy or not), busiest first: one grouped read of the rate tags created
    in the engine's longest declared window, then each key's own window."""
    now = timezone.now()
    found = engine.store.rate_keys(rate_windows_start(engine, now), engine.read_namespace)
    forced = overridden(engine, key, RATE)
    if key is not None:
        found = {key: found.get(key, {})}
    else:
        found = {**{name: {} for name in forced}, **found}
    usage = [
        rate_window(engine, name, by_workflow, now, forced.get(name))
        for name, by_workflow in found.items()
    ]
    if key is None:
        usage = [u for u in usage if u.used or u.override is not None]
    return sorted(usage, key=lambda u: (-u.used, u.key))


def rate_window(
    engine: Runtime,
    key: str,
    by_workflow: dict[str, int],
    now: datetime.datetime,
    override: Override | None = None,
) -> RateUsage:
    """``key``'s window at ``now`` against the limit in force: ``override``'s, else the
    one its workflows declare (the units of ``by_workflow``, the longest window's, when
    no window is known)."""
    workflows = tuple(sorted(by_workflow)) or recent_workflows(engine, key, RATE)
    declared = declared_limit(engine, workflows, key, [], RATE)
    if declared.limit is None or declared.per is None:
        used = sum(by_workflow.values())
        return RateUsage(
            key, used, None, None, workflows, limit_error=declared.error, override=override
        )
    limit = override.limit if override is not None else declared.limit
    quota = Quota(key, limit, (), per=declared.per)
    window = engine.store.rate_window(quota, now, engine.read_namespace)
    return RateUsage(
        key=key,
        used=sum(weight for _, weight in window),
        limit=declared.limit,
        per=declared.per,
        workflows=workflows,
        retry_after=rate_retry_after(quota, window, now),
        limit_computed=declared.computed,
        limit_error=declared.error,
        override=override,
    )
