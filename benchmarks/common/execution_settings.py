"""Settings of ``benchmarks.execution`` and of the workers it starts, also those of
``benchmarks.retry_after`` and ``benchmarks/instrumentation.py``.

The shared benchmark settings, with a database and a Redis database of their own.

Database connections: Celery's Django fixup closes every database connection before and
after each task unless ``CELERY_DB_REUSE_MAX`` is set, so by default each task opens a
new PostgreSQL connection. ``DURABLE_BENCH_CONNECTIONS=reuse`` (the script's default)
keeps the worker's connection open across tasks; ``per-task`` leaves Celery's default.
"""

import os

from benchmarks.common.settings import *  # noqa: F403
from benchmarks.common.settings import DATABASES

DATABASES["default"]["NAME"] = os.environ.get("DURABLE_BENCH_DB", "durable_bench_exec")
DATABASES["default"]["CONN_MAX_AGE"] = None
# So that the script can find each worker's server process, and read its CPU time.
DATABASES["default"]["OPTIONS"] = {
    "application_name": os.environ.get("DURABLE_BENCH_APPLICATION", "durable_bench")
}
if os.environ.get("DURABLE_BENCH_PREPARED") == "1":
    # Django's opt-in to server-side binding, with psycopg preparing a statement once a
    # connection has run it this many times: planned once, executed many times.
    DATABASES["default"]["OPTIONS"]["server_side_binding"] = True
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5
if os.environ.get("DURABLE_BENCH_SYNCHRONOUS_COMMIT", "on") != "on":
    # For comparison only: commits that do not wait for the WAL to reach the disk.
    DATABASES["default"]["OPTIONS"]["options"] = (
        f"-c synchronous_commit={os.environ['DURABLE_BENCH_SYNCHRONOUS_COMMIT']}"
    )

if os.environ.get("DURABLE_BENCH_CONNECTIONS", "reuse") == "reuse":
    # Close the connection only every million tasks (the fixup counts two per task).
    CELERY_DB_REUSE_MAX = 1_000_000

CELERY_BROKER_URL = os.environ.get("DURABLE_BENCH_BROKER", "redis://127.0.0.1:6379/13")

DURABLE = {"QUEUE": "durable_bench_exec", "ENQUEUE": True}
