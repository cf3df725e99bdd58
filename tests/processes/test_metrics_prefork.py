"""Prometheus in multiprocess mode: the metrics a real prefork worker's children record
are scraped from ``PROMETHEUS_MULTIPROC_DIR`` by the view, with the quota gauge."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import RequestFactory, override_settings
from prometheus_client.parser import text_string_to_metric_families

from durable_django import RunFailed
from durable_django.metrics.prometheus import metrics_view

from ..brokers import Broker
from ..worker import Worker, unique_queue
from ..worker_workflows import charge, total

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class PreforkWorker(Worker):
    """A worker whose pool is two forked children, as Celery's default pool is."""

    def command(self) -> list[str]:
        swapped = {"--pool=solo": "--pool=prefork", "--concurrency=1": "--concurrency=2"}
        return [swapped.get(part, part) for part in super().command()]


def test_a_prefork_worker_s_metrics_are_served_by_the_view(
    tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = unique_queue("durable-metrics")
    worker = PreforkWorker(
        queue,
        include=["tests.worker_workflows"],
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
    )
    try:
        worker.start()
        with override_settings(DURABLE={"ENQUEUE": True, "QUEUE": queue}):
            totals = [total.dispatch({"a": n, "b": 1}) for n in range(4)]
            declined = charge.dispatch({"amount": 5})
        for handle in totals:
            worker.result(handle)
        with pytest.raises(RunFailed):
            worker.result(declined)
    finally:
        worker.stop()
        worker.discard_log()
        broker.delete_queue(queue)

    with override_settings(DURABLE={"ENQUEUE": False}):  # pending: it holds its key
        total.dispatch({"a": 1, "b": 1}, concurrency={"key": "held", "limit": 3})
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    response = metrics_view(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    duration = "durable_run_duration_seconds_count"
    assert value(duration, workflow=total.name, outcome="completed") == 4.0
    assert value(duration, workflow=charge.name, outcome="failed") == 1.0
    assert value("durable_run_queue_lag_seconds_count", workflow=total.name) == 4.0
    assert value("durable_step_failures_total", workflow=charge.name, outcome="failed") == 1.0
    assert value("durable_quota_units", key="held") == 1.0  # read from the store
    assert list(tmp_path.glob("*.db")), "the children wrote the values to the directory"
