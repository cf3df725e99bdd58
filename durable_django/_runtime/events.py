"""Event triggers: ``engine.publish_event`` starts one run of every subscriber."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._core.limits import text_lengths
from .._core.serialization import json_copy, validate_text
from ..observability import events as observing
from ..signals import event_skipped
from ..signals import send as send_signal
from .handles import RunHandle
from .starting import Planned, start_together

if TYPE_CHECKING:
    from .._core.runtime import Runtime


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a publish did: the runs of the subscribers it ``started`` (handles; with an
    event id, a re-publish returns the runs already there, ``created`` False), and the
    subscribers it ``skipped`` as ``(workflow_name, error)`` pairs — refused by their
    quota, or unable to start on this payload."""

    started: list[RunHandle] = field(default_factory=list)
    skipped: list[tuple[str, Exception]] = field(default_factory=list)


def event_run_id(event: str, event_id: str, workflow: str) -> str:
    """The run id of ``workflow``'s run for one event: readable, or hashed when too long."""
    run_id = f"event:{event}:{event_id}:{workflow}"
    if len(run_id) <= text_lengths().run_id:
        return run_id
    digest = hashlib.sha256(f"{event}\0{event_id}\0{workflow}".encode()).hexdigest()
    return f"event:{digest}"


def publish(engine: Runtime, name: str, payload: Any, id: str | None = None) -> PublishResult:
    """Start one run of every workflow subscribed to ``name``, with ``payload`` as input.

    Each subscriber starts under its own quota; one refused (or whose key or limit
    function fails on this payload) is skipped, sending ``event_skipped``, and the others
    still start. The runs are created in one transaction and sent once it commits: an
    unexpected error (the database refusing a write, a lost connection) creates and sends
    nothing. With ``id``, each subscriber's run id is derived from it, so publishing the
    same event again starts nothing new and is never refused.
    """
    validate_text(name, "an event name")
    if id is not None:
        validate_text(id, "an event id")
    payload = json_copy(payload, f"the payload of event {name!r}")
    subscribers = engine.registry.subscribers(name)
    started, refused = start_together(
        engine,
        [
            Planned(
                definition,
                json_copy(payload, f"the payload of event {name!r}"),
                None if id is None else event_run_id(name, id, definition.name),
            )
            for definition in subscribers
        ],
    )
    skipped = {index: (subscribers[index].name, error) for index, error in refused.items()}
    for index in sorted(skipped):
        workflow, error = skipped[index]
        observing.subscriber_skipped(name, id, workflow, error)
        send_signal(
            event_skipped,
            type(engine),
            engine=engine,
            event=name,
            event_id=id,
            workflow=workflow,
            error=error,
        )
    return PublishResult(
        started=[started[i] for i in sorted(started)],
        skipped=[skipped[i] for i in sorted(skipped)],
    )
