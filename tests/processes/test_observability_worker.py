"""A real Celery worker observed by the real Sentry and OpenTelemetry SDKs
(``tests/observed_worker.py``): a run whose step fails is a Sentry event with the step's
frames and the run's fields, and the turn's and step's spans, the step's an error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from durable_django import RunFailed

from ..brokers import Broker
from ..observed_worker import charge
from ..worker import WAIT, Worker, running_worker, unique_queue, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def observed(
    django_db_setup: None, broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Worker, Path]]:
    directory = tmp_path_factory.mktemp("observed")
    queue = unique_queue("durable-observed")
    try:
        with running_worker(
            queue,
            include=["tests.observed_worker"],
            env={"DURABLE_TEST_OBSERVED": str(directory)},
        ) as worker:
            yield worker, directory
    finally:
        broker.delete_queue(queue)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_failed_run_in_a_worker_is_a_sentry_event_and_an_error_span(
    observed: tuple[Worker, Path],
) -> None:
    worker, directory = observed
    with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": worker.queue}):
        handle = charge.dispatch({"amount": 12})
    with pytest.raises(RunFailed):
        handle.result(timeout=WAIT)

    def event_of_run() -> dict[str, Any] | None:
        events = lines(directory / "sentry.jsonl")
        return next(
            (e for e in events if e.get("extra", {}).get("durable_run_id") == handle.run_id),
            None,
        )

    event = wait_until(event_of_run, "the Sentry event of the failed run", worker)
    assert event["logger"] == "durable_django.runs" and event["level"] == "error"
    assert event["extra"]["durable_workflow"] == "tests.observed.charge"
    cause, raised = event["exception"]["values"]
    assert (cause["type"], raised["type"]) == ("CardDeclined", "StepError")
    assert cause["stacktrace"]["frames"][-1]["function"] == "decline"

    def spans_of_run() -> list[dict[str, Any]]:
        spans = [
            span
            for span in lines(directory / "spans.jsonl")
            if span["attributes"].get("durable.run_id") == handle.run_id
        ]
        return spans if len(spans) == 2 else []

    step, turn = sorted(
        wait_until(spans_of_run, "the run's spans", worker), key=lambda s: s["name"]
    )
    assert turn["name"] == "durable.turn tests.observed.charge"
    assert turn["kind"] == "SpanKind.CONSUMER"
    assert turn["attributes"]["durable.outcome"] == "failed"
    assert turn["status"]["status_code"] == "ERROR"
    assert step["name"] == "durable.step decline"
    assert step["parent_id"] == turn["context"]["span_id"]
    assert step["status"]["status_code"] == "ERROR"
    assert step["events"][0]["attributes"]["exception.type"] == (
        "tests.observed_worker.CardDeclined"
    )
