"""Workflow definitions and the registry that holds them by name and version."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core.limits import RATE_TAG_PREFIX, TAG_PREFIX, text_lengths
from .._core.serialization import validate_text
from ..errors import UnstorableValueError, WorkflowNotFound
from .concurrency import (
    Concurrency,
    ConcurrencyOption,
    RateLimit,
    RateLimitOption,
    for_workflow,
    rates_for_workflow,
)
from .windows import ScheduleSpec

WorkflowBody = Callable[[Any, Any], Any]

#: A quota or a rate limit, as declared.
Limited = TypeVar("Limited", Concurrency, RateLimit)

#: The priorities a workflow may declare: Celery's range (on RabbitMQ, a queue declared
#: with ``x-max-priority``; on Redis, 0 is the highest).
MIN_PRIORITY, MAX_PRIORITY = 0, 9


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    """Everything declared about one version of a workflow."""

    name: str
    version: str
    body: WorkflowBody | None
    queue: str = ""
    remote: bool = False
    #: The quotas every start must pass, in their declared order (empty: unlimited).
    concurrency: tuple[Concurrency, ...] = ()
    tags: tuple[str, ...] = ()
    #: The rate limits every start must pass, in their declared order (empty: none).
    rate_limits: tuple[RateLimit, ...] = ()
    on_event: tuple[str, ...] = ()
    schedules: tuple[ScheduleSpec, ...] = ()
    #: The priority of its run messages (Celery's, 0-9); ``None``: the route's.
    priority: int | None = None

    @property
    def body_path(self) -> str:
        """Where the body is defined, to tell a re-import from a different body."""
        body = self.body
        return f"{getattr(body, '__module__', '?')}.{getattr(body, '__qualname__', repr(body))}"


def validate_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """Check user tags: strings, not too long, and not in the quota's reserved prefix."""
    if isinstance(tags, str):
        raise TypeError(f"tags must be a list of str, not the str {tags!r}")
    checked = tuple(validate_text(tag, "a tag", text_lengths().tag) for tag in tags)
    reserved = [tag for tag in checked if tag.startswith(TAG_PREFIX)]
    if reserved:
        raise ValueError(
            f"tags starting with {TAG_PREFIX!r} are reserved for quotas: {reserved}; "
            f"use the concurrency option instead"
        )
    reserved = [tag for tag in checked if tag.startswith(RATE_TAG_PREFIX)]
    if reserved:
        raise ValueError(
            f"tags starting with {RATE_TAG_PREFIX!r} are reserved for rate limits: "
            f"{reserved}; use the rate_limit option instead"
        )
    return checked


def make_definition(
    name: str,
    version: str,
    body: WorkflowBody | None,
    *,
    queue: str = "",
    remote: bool = False,
    concurrency: ConcurrencyOption = None,
    tags: Iterable[str] = (),
    on_event: Iterable[str] = (),
    schedule: Any = None,
    priority: int | None = None,
    rate_limit: RateLimitOption = None,
) -> WorkflowDefinition:
    """Build a definition, refusing bad options with a clear error.

    ``schedule`` is a :class:`~durable_django._runtime.schedules.ScheduleSpec`, a dict with the
    same keys, or a list of them.
    """
    lengths = text_lengths()
    validate_text(name, "workflow name", lengths.workflow)
    validate_text(version, "workflow version", lengths.version)
    if body is not None and not callable(body):
        raise TypeError(f"workflow {name!r}: the body must be callable, not {type(body).__name__}")
    if remote:
        validate_text(queue, f"workflow {name!r}: queue", lengths.queue)
    if isinstance(on_event, str):
        raise TypeError(f"workflow {name!r}: on_event must be a list of event names")
    if priority is not None and (
        type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise ValueError(
            f"workflow {name!r}: priority must be an int from {MIN_PRIORITY} to "
            f"{MAX_PRIORITY} (Celery's message priority), not {priority!r}"
        )
    return WorkflowDefinition(
        name=name,
        version=version,
        body=body,
        queue=queue,
        remote=remote,
        concurrency=for_workflow(concurrency, name),
        rate_limits=rates_for_workflow(rate_limit, name),
        tags=validate_tags(tags),
        on_event=tuple(validate_text(e, "an event name") for e in on_event),
        schedules=_schedules(name, schedule),
        priority=priority,
    )


def _schedules(workflow: str, schedule: Any) -> tuple[ScheduleSpec, ...]:
    if schedule is None:
        return ()
    specs = schedule if isinstance(schedule, list | tuple) else [schedule]
    try:
        built = tuple(ScheduleSpec.build(spec) for spec in specs)
    except UnstorableValueError as error:
        raise UnstorableValueError(
            f"workflow {workflow!r}: {error.what}", error.path, error.rule
        ) from None
    except (TypeError, ValueError) as error:
        raise type(error)(f"workflow {workflow!r}: {error}") from None
    keys = [spec.key for spec in built]
    if len(set(keys)) != len(keys):
        raise ValueError(f"workflow {workflow!r}: schedule keys must be unique, got {keys}")
    return built


class Registry:
    """Workflow definitions by name; each name may hold several versions.

    Starting a workflow by name uses the version registered last; executing a run uses
    the exact version the run was started with.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[str, dict[str, WorkflowDefinition]] = {}
        self._latest: dict[str, WorkflowDefinition] = {}

    def add(self, definition: WorkflowDefinition) -> WorkflowDefinition:
        """Register ``definition``; registering the same one again is a no-op."""
        with self._lock:
            versions = self._versions.setdefault(definition.name, {})
            known = versions.get(definition.version)
            if known is not None:
                if _same_registration(known, definition):
                    return known
                raise ValueError(
                    f"workflow {definition.name!r} version {definition.version!r} is already "
                    f"registered with a different body or options ({known.body_path}); "
                    f"register the new body under a new version"
                )
            for other in self._latest.values():
                taken = {s.key for s in other.schedules} & {s.key for s in definition.schedules}
                if other.name != definition.name and taken:
                    raise ValueError(
                        f"workflow {definition.name!r}: schedule key(s) {sorted(taken)} are "
                        f"already declared by workflow {other.name!r}"
                    )
            versions[definition.version] = definition
            self._latest[definition.name] = definition
            return definition

    def latest(self, name: str) -> WorkflowDefinition:
        """The version of ``name`` to start, or :class:`WorkflowNotFound`."""
        try:
            return self._latest[name]
        except KeyError:
            raise WorkflowNotFound(name) from None

    def get(self, name: str, version: str) -> WorkflowDefinition | None:
        """The exact version, or ``None`` when this process does not have it."""
        return self._versions.get(name, {}).get(version)

    def all(self) -> list[WorkflowDefinition]:
        """Every registered definition, every version."""
        with self._lock:
            return [d for versions in self._versions.values() for d in versions.values()]

    def subscribers(self, event: str) -> list[WorkflowDefinition]:
        """The workflows (their latest versions) started by ``event``."""
        with self._lock:
            return [d for d in self._latest.values() if event in d.on_event]

    def remove(self, name: str) -> None:
        """Forget every version of ``name`` (for tests)."""
        with self._lock:
            self._versions.pop(name, None)
            self._latest.pop(name, None)


def _same_registration(a: WorkflowDefinition, b: WorkflowDefinition) -> bool:
    return (
        a.body_path == b.body_path
        and a.remote == b.remote
        and a.queue == b.queue
        and a.tags == b.tags
        and a.on_event == b.on_event
        and a.schedules == b.schedules
        and a.priority == b.priority
        and _same_limits(
            a.concurrency, b.concurrency, lambda x, y: x.count_statuses == y.count_statuses
        )
        and _same_limits(a.rate_limits, b.rate_limits, lambda x, y: x.per == y.per)
    )


def _same_limits(
    a: tuple[Limited, ...], b: tuple[Limited, ...], same: Callable[[Limited, Limited], bool]
) -> bool:
    """Whether two declarations' quotas (or rate limits) are the same: ``same`` compares
    what their kind adds, the key, limit and weight compare as callables."""
    return len(a) == len(b) and all(
        same(x, y)
        and all(
            _same_callable(p, q)
            for p, q in ((x.key, y.key), (x.limit, y.limit), (x.weight, y.weight))
        )
        for x, y in zip(a, b, strict=True)
    )


def _same_callable(a: Any, b: Any) -> bool:
    if callable(a) and callable(b):
        return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
            getattr(b, "__module__", None),
            getattr(b, "__qualname__", None),
        )
    return bool(a == b)


#: The registry shared by every engine that is not given its own.
default_registry = Registry()
