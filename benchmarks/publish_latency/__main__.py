"""How long from a start's commit until a worker receives its run: sent by the sender
thread (the default), by the committing caller (the lean publish inline), and
against Celery's ``apply_async``, interleaved.

Run from the repository root::

    .venv/bin/python -m benchmarks.publish_latency [--starts 1000]

It (re)creates the PostgreSQL database ``durable_bench_latency`` (``--database``) and
starts a Celery worker (``benchmarks/publish_latency/worker.py``, solo pool, on a queue of its
own on ``redis://127.0.0.1:6379/14``) whose ``durable_django.execute_run`` only notes,
in a Redis hash, when it received each run id. Each start is an ``engine.start`` in an
``atomic()`` block with an ``on_commit`` callback, registered before the start's own,
noting the time of the commit; the latency is the worker's time minus that one. Starts
go one at a time, alternating the two ways of sending, each waiting for its run to
arrive, so the worker is always idle when a message comes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=1000, help="starts per way of sending")
    parser.add_argument("--database", default="durable_bench_latency")
    args = parser.parse_args()
    os.environ["DURABLE_BENCH_DB"] = args.database
    from benchmarks.common.database import recreate_database

    recreate_database(args.database)

    import django

    django.setup()
    import redis
    from celery import Celery
    from django.core.management import call_command
    from django.db import transaction

    from benchmarks.publish_latency.worker import BROKER
    from durable_django import Engine
    from durable_django._rules.registry import Registry
    from durable_django.stores.orm import OrmStore
    from durable_django.tasks import execute_run

    call_command("migrate", verbosity=0)
    app = Celery("durable_bench", set_as_current=True)
    app.config_from_object("django.conf:settings", namespace="CELERY")

    token = uuid.uuid4().hex[:8]
    queue, received = f"durable_bench_latency_{token}", f"durable_bench_received_{token}"
    client = redis.Redis.from_url(BROKER)

    class CelerySendEngine(Engine):
        """The engine as it sent before the lean publish: Celery's ``apply_async``."""

        def send(self, run_id: str, queue: str, **_: object) -> None:
            self.store.on_commit(
                lambda: execute_run.apply_async((run_id,), queue=queue, serializer="json")
            )

    registry = Registry()
    options = dict(namespace="default", scope_reads=False, queue=queue, registry=registry)
    background = Engine(store=OrmStore(), publish="background", **options)
    lean = Engine(store=OrmStore(), publish="inline", **options)
    celery = CelerySendEngine(store=OrmStore(), **options)
    lean.register("bench.plain", "1", lambda ctx, input: None)

    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "--quiet",
            "-A",
            "benchmarks.publish_latency.worker",
            "worker",
            "-P",
            "solo",
            "-Q",
            queue,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "warning",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "DURABLE_BENCH_RECEIVED": received},
    )
    latencies: dict[str, list[float]] = {
        "sender thread (the default)": [],
        "lean publish, inline": [],
        "Celery apply_async": [],
    }
    try:

        def one(engine: Engine) -> float:
            committed: list[float] = []
            with transaction.atomic():
                transaction.on_commit(lambda: committed.append(time.time()))
                run_id = engine.start("bench.plain", {"n": 1}).run_id
            deadline = time.monotonic() + 30
            while (value := client.hget(received, run_id)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the worker never received {run_id}")
                time.sleep(0.0002)
            return (float(value) - committed[0]) * 1e6

        one(lean)  # waits for the worker to be ready
        for _ in range(20):
            one(background), one(lean), one(celery)
        ways = list(zip(latencies, (background, lean, celery), strict=True))
        for number in range(args.starts):
            shift = number % len(ways)
            for label, engine in ways[shift:] + ways[:shift]:
                latencies[label].append(one(engine))
                time.sleep(0.002)
    finally:
        worker.terminate()
        worker.wait()
        client.delete(received, queue)

    print(
        f"\n{time.strftime('%Y-%m-%d')}, Python {platform.python_version()}, Redis broker, "
        f"{os.cpu_count()} cores (shared); {args.starts} starts per way, interleaved\n"
    )
    print("| sending | p50 µs | p95 µs | p99 µs | mean µs |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, values in latencies.items():
        cuts = statistics.quantiles(values, n=100)
        print(
            f"| {label} | {statistics.median(values):.0f} | {cuts[94]:.0f} | {cuts[98]:.0f} "
            f"| {statistics.fmean(values):.0f} |"
        )


if __name__ == "__main__":
    main()
