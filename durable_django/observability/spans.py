"""OpenTelemetry spans of starts, turns and steps, from the seam (:mod:`.events`).

Imported only when ``opentelemetry-api`` is installed (the ``otel`` extra), and silent
until the project sets a tracer provider (the SDK's, or a distribution's): until then
the seam asks once a second whether one was set, and the moments cost nothing more.

- ``durable.start <workflow>`` (``PRODUCER``; a batch's ``durable.start_many``), around
  the admission in the store: the quotas checked (``durable.quota.keys``, ``.limits``,
  ``.weights``), the decision (``durable.refused``, and for a refusal the key's
  ``durable.quota.active`` and ``durable.retry_after``), ``durable.waited`` for a start
  with ``wait=``, the run ids admitted (``messaging.message.id``, single starts).
- ``durable.turn <workflow>`` (``CONSUMER``), from the claim to the turn's end written:
  the run's fields and ``durable.outcome``; status ``ERROR`` with the exception recorded
  when the run failed.
- ``durable.step <step>`` (``INTERNAL``), around the step's function: status ``ERROR``
  with the exception recorded when the attempt failed.

Every span carries ``messaging.system`` = ``durable_django`` and ``durable.workflow``;
turns and steps ``messaging.message.id`` / ``durable.run_id``, ``durable.version``,
``durable.namespace``, ``durable.attempt``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode

from .._core.records import RunRecord
from ..errors import ConcurrencyLimitError, RateLimitError
from .events import Observer, StartEvent, StepEvent, TurnEvent

tracer = trace.get_tracer("durable_django")

SYSTEM = {"messaging.system": "durable_django"}


def _run_attributes(run: RunRecord) -> dict[str, Any]:
    return {
        **SYSTEM,
        "messaging.message.id": run.run_id,
        "messaging.destination.name": run.queue,
        "durable.run_id": run.run_id,
        "durable.workflow": run.workflow,
        "durable.version": run.version,
        "durable.namespace": run.namespace,
    }


class SpanObserver(Observer):
    """Makes the spans of starts, turns and steps (see the module's docstring)."""

    def ready(self) -> bool:
        # Until a provider is set, every span would be dropped. It is set once.
        return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider)

    def start(self, start: StartEvent) -> contextlib.AbstractContextManager[Any]:
        return _start_span(start)

    def turn(self, turn: TurnEvent) -> contextlib.AbstractContextManager[Any]:
        return _turn_span(turn)

    def step(self, step: StepEvent) -> contextlib.AbstractContextManager[Any]:
        return tracer.start_as_current_span(
            f"durable.step {step.name}",
            kind=SpanKind.INTERNAL,
            attributes={
                **_run_attributes(step.run),
                "durable.step": step.name,
                "durable.step.kind": step.kind,
                "durable.attempt": step.attempt,
            },
        )


@contextlib.contextmanager
def _start_span(start: StartEvent) -> Iterator[None]:
    name = "durable.start_many" if start.kind == "batch" else "durable.start"
    attributes: dict[str, Any] = {
        **SYSTEM,
        "messaging.operation.type": "send",
        "durable.workflow": start.workflow,
        "durable.namespace": start.namespace,
        "durable.start.kind": start.kind,
        "durable.quota.keys": [quota.key for quota in start.quotas],
        "durable.quota.limits": [quota.limit for quota in start.quotas],
        "durable.quota.weights": [quota.weight for quota in start.quotas],
    }
    if start.kind == "batch":
        attributes["messaging.batch.message_count"] = start.size
    if start.waited:
        attributes["durable.waited"] = start.waited
    with tracer.start_as_current_span(
        f"{name} {start.workflow}",
        kind=SpanKind.PRODUCER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except ConcurrencyLimitError:
            raise  # a decision, not an error: the attributes below say it
        except BaseException as error:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise
        finally:
            span.set_attributes(_decision(start))


def _decision(start: StartEvent) -> dict[str, Any]:
    decided: dict[str, Any] = {
        "durable.refused": bool(start.refused),
        "durable.created": start.created,
    }
    if start.kind != "batch" and len(start.run_ids) == 1:
        decided["messaging.message.id"] = start.run_ids[0]
        decided["durable.run_id"] = start.run_ids[0]
    if start.refused:
        first = start.refused[0]
        decided.update(
            {
                "durable.refused_count": len(start.refused),
                "durable.refused.key": first.key,
                "durable.quota.active": first.active,
                "durable.retry_after": first.retry_after,
            }
        )
        if isinstance(first, RateLimitError):
            decided["durable.rate_limit.per"] = first.per
    return decided


@contextlib.contextmanager
def _turn_span(turn: TurnEvent) -> Iterator[None]:
    run = turn.run
    with tracer.start_as_current_span(
        f"durable.turn {run.workflow}",
        kind=SpanKind.CONSUMER,
        attributes={
            **_run_attributes(run),
            "messaging.operation.type": "process",
            "durable.attempt": run.attempt,
        },
    ) as span:
        try:
            yield
        finally:
            span.set_attribute("durable.outcome", turn.outcome)
            if turn.outcome == "failed":
                if turn.error is not None:
                    span.record_exception(turn.error)
                span.set_status(Status(StatusCode.ERROR, "the run failed"))
