"""The Celery app of ``benchmarks.publish_latency``'s worker: a task named as
durable_django's ``execute_run`` that only notes when it received its run id."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

BROKER = os.environ.get("DURABLE_BENCH_BROKER", "redis://127.0.0.1:6379/14")
#: The Redis hash the worker notes each run id's arrival in (``time.time()``).
RECEIVED = os.environ.get("DURABLE_BENCH_RECEIVED", "durable_bench_received")

app = Celery("durable_bench_latency", broker=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)
_client = redis.Redis.from_url(BROKER)


@app.task(name="durable_django.execute_run", ignore_result=True)
def execute_run(run_id: str) -> None:
    _client.hset(RECEIVED, run_id, repr(time.time()))
