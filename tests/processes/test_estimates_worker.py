"""``retry_after`` against a real Celery worker: runs of 2 s ± 20 % under a key of limit
1, executed by a worker on the suite's broker; each refusal's estimate is checked against
what the key's recorded history allows, and compared with when its slot truly freed.

How close the estimate comes is measured by ``benchmarks.retry_after`` (no timing is
asserted here: the machine may be slow); this test prints the errors it saw."""

from __future__ import annotations

import random
import uuid

import pytest
from django.test import override_settings
from django.utils import timezone

from durable_django import ConcurrencyLimitError, RunStatus
from durable_django import engine as default_engine
from durable_django._runtime.estimates import HISTORY

from ..brokers import Broker
from ..estimate_workflows import nap
from ..helpers import status_is
from ..worker import running_worker, unique_queue, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_refusal_estimates_from_what_the_worker_did(broker: Broker) -> None:
    queue = unique_queue("durable-estimate")
    rng = random.Random(7)
    key = f"real:{uuid.uuid4().hex}"

    def seconds() -> float:
        return rng.uniform(1.6, 2.4)

    try:
        with (
            running_worker(queue, include=["tests.estimate_workflows"]) as worker,
            override_settings(DURABLE={"ENQUEUE": True, "QUEUE": queue}),
        ):
            for _ in range(3):
                worker.result(nap.dispatch({"key": key, "seconds": seconds()}))
            errors = []
            for _ in range(3):
                holder = nap.dispatch({"key": key, "seconds": seconds()})
                wait_until(status_is(holder.run_id, RunStatus.RUNNING), "the run", worker)
                with pytest.raises(ConcurrencyLimitError) as caught:
                    nap.dispatch({"key": key, "seconds": seconds()})
                refused_at = timezone.now()
                error = caught.value
                finished = default_engine.list_runs(
                    tag=f"concurrency:{key}", statuses=["completed"]
                )
                held = [run.finished_at - run.created_at for run in finished]
                assert error.estimate.basis == HISTORY
                assert error.estimate.samples == len(finished)
                # What the holder has left can be no more than the longest run recorded.
                assert 1.0 <= error.retry_after <= max(held).total_seconds()
                assert [h.run_id for h in error.holders()] == [holder.run_id]

                worker.result(holder)
                ended = default_engine.get_run(holder.run_id).finished_at
                actual = (ended - refused_at).total_seconds()
                errors.append(round(abs(error.retry_after - max(actual, 1.0)), 3))
            # Nothing was created by the refusals: 3 + 3 runs, all completed.
            assert default_engine.count_runs(tag=f"concurrency:{key}") == 6
            print(f"retry_after errors against a real worker (s): {errors}")
    finally:
        broker.delete_queue(queue)
