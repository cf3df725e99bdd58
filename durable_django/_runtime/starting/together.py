"""Starts made together, in one transaction, each under its own quota: an event's
subscribers (:func:`start_together`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._rules import concurrency as quotas
from ..._rules.registry import WorkflowDefinition
from ...errors import DurableError
from ..handles import RunHandle
from .single import admit

if TYPE_CHECKING:
    from ..._core.runtime import Runtime


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
                (*start.definition.concurrency, *start.definition.rate_limits),
                start.input,
                start.definition.name,
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


__all__ = ["Planned", "start_together"]
