"""Quota usage: which keys hold active runs, how many, and against what limit."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .concurrency import DEFAULT_CONCURRENCY_STATUSES, TAG_PREFIX, limit_for, quota_tag

if TYPE_CHECKING:
    from .engines import Engine


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    """One quota key: its active runs, the workflows they belong to, and the limit the
    workflows declare for it (``None`` when none of them declares one)."""

    key: str
    active: int
    limit: int | None
    workflows: tuple[str, ...]

    @property
    def tag(self) -> str:
        """The tag the key's runs carry."""
        return quota_tag(self.key)

    @property
    def full(self) -> bool:
        """Whether a start under the declared limit would be refused now."""
        return self.limit is not None and self.active >= self.limit


def active_keys(store: Any, namespace: str | None) -> dict[str, dict[str, int]]:
    """``{key: {workflow: active runs}}`` for every quota key holding active runs."""
    keys = getattr(store, "quota_keys", None)
    if keys is not None:
        return keys(DEFAULT_CONCURRENCY_STATUSES, namespace)
    found: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for run in store.list_runs(statuses=DEFAULT_CONCURRENCY_STATUSES, namespace=namespace):
        for tag in run.tags:
            if tag.startswith(TAG_PREFIX):
                found[tag[len(TAG_PREFIX) :]][run.workflow] += 1
    return {key: dict(by_workflow) for key, by_workflow in found.items()}


def declared_limit(engine: Engine, workflows: tuple[str, ...], key: str) -> int | None:
    """The smallest limit the workflows declare for ``key`` (their limit functions are
    called), or ``None``. A run started with a per-start quota is not known here."""
    limits = []
    for name in workflows:
        try:
            concurrency = engine.registry.latest(name).concurrency
        except LookupError:
            continue
        if concurrency is None:
            continue
        try:
            limits.append(limit_for(concurrency, key, name))
        except (TypeError, ValueError):
            continue  # a limit function failing here fails the start too: nothing to show
    return min(limits) if limits else None


def quota_usage(engine: Engine, key: str | None = None) -> list[QuotaUsage]:
    """Every key with active runs (or just ``key``), busiest first."""
    found = active_keys(engine.store, engine.read_namespace)
    if key is not None:
        found = {key: found.get(key, {})}
    usage = []
    for name, by_workflow in found.items():
        workflows = tuple(sorted(by_workflow))
        usage.append(
            QuotaUsage(
                key=name,
                active=sum(by_workflow.values()),
                limit=declared_limit(engine, workflows, name),
                workflows=workflows,
            )
        )
    return sorted(usage, key=lambda u: (-u.active, u.key))
