"""How close a refusal's ``retry_after`` is to when the next slot truly frees.

Run from the repository root::

    .venv/bin/python -m benchmarks.retry_after [--probes 60] [--trials 200]

It (re)creates the PostgreSQL database ``durable_bench_retry_after`` (``--database``),
migrates it, and measures two ways, with runs that hold their slot 2 s ± 20 % (uniform):

- **driven clock**: ``--trials`` keys, each given 50 finished runs of known durations and
  ``limit`` runs part-way through runs of the same distribution (their creation times
  written, ages uniform over their durations: a key in a steady state); a start under the
  key is refused, and its ``retry_after`` compared with when the first holder's written
  duration ends. For limits 1, 3 and 10, with runs of 2 s ± 20 % and of 10 s ± 20 %.
- **real worker**: a Celery worker (``--pool=threads``, ``LIMIT`` threads, Redis broker
  ``redis://127.0.0.1:6379/13``, a queue of its own) executes ``bench.sleep`` runs
  (``benchmarks/retry_after/work.py``: one step sleeping the run's duration) under one key
  of limit ``LIMIT``. This process keeps the key full: every 0.1-0.6 s it starts a run;
  once the key has 10 finished runs, each refused start is a probe: its ``retry_after``
  against the time the first of the runs holding the key then actually finished.

The error is ``|retry_after - max(actual, 1 s)|`` (``retry_after`` is never below 1 s,
so a slot freeing sooner is counted as freeing at 1 s); the raw error (against the
actual time itself) is shown too. The table gives the median and the 90th percentile, in
seconds and as a share of the 2 s duration.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.execution_settings")

TYPICAL, SPREAD = 2.0, 0.2
HISTORY = 50


def duration(rng: random.Random, typical: float = TYPICAL) -> float:
    return rng.uniform(typical * (1 - SPREAD), typical * (1 + SPREAD))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=60, help="refusals with the real worker")
    parser.add_argument("--trials", type=int, default=200, help="keys per driven-clock limit")
    parser.add_argument("--database", default="durable_bench_retry_after")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


def driven_trial(
    engine, rng: random.Random, limit: int, typical: float = TYPICAL
) -> tuple[float, float]:
    """One refusal on a key in a steady state, its holders' durations written: the
    refusal's ``retry_after`` and when the first holder's duration truly ends."""
    from django.utils import timezone

    from durable_django import ConcurrencyLimitError
    from durable_django.models import Run, RunTag

    key = f"sim:{uuid.uuid4().hex}"
    now = timezone.now()
    runs, tags = [], []

    def add(status: str, created: datetime.datetime, finished: datetime.datetime | None) -> None:
        run_id = uuid.uuid4().hex
        runs.append(
            Run(
                id=run_id,
                workflow="bench.sleep",
                version="1",
                namespace="default",
                status=status,
                input={"key": key},
                created_at=created,
                updated_at=created,
                finished_at=finished,
            )
        )
        tags.append(
            RunTag(run_id=run_id, tag=f"concurrency:{key}", status=status, namespace="default")
        )

    for n in range(HISTORY):
        ended = now - datetime.timedelta(seconds=1 + n * typical / limit)
        add("completed", ended - datetime.timedelta(seconds=duration(rng, typical)), ended)
    left = []
    for _ in range(limit):
        total = duration(rng, typical)
        age = rng.uniform(0, total)
        left.append(total - age)
        add("running", now - datetime.timedelta(seconds=age), None)
    Run.objects.bulk_create(runs)
    RunTag.objects.bulk_create(tags)
    try:
        engine.start(
            "bench.sleep", {"key": key, "seconds": 0}, concurrency={"key": key, "limit": limit}
        )
    except ConcurrencyLimitError as error:
        late = (timezone.now() - now).total_seconds()
        return error.retry_after, min(left) - late
    raise AssertionError("the start was not refused")


def real_worker(args: argparse.Namespace, rng: random.Random) -> list[tuple[float, float]]:
    """Probes against a real worker: ``(retry_after, actual)`` pairs."""
    from django.utils import timezone

    from benchmarks.common.execution_app import app
    from benchmarks.retry_after.work import LIMIT
    from durable_django import ConcurrencyLimitError, Engine

    queue = f"durable_bench_retry_after_{uuid.uuid4().hex[:8]}"
    hostname = f"bench-{uuid.uuid4().hex[:12]}@localhost"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = tempfile.NamedTemporaryFile(prefix="durable-bench-retry-", suffix=".log", delete=False)  # noqa: SIM115
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "benchmarks.common.execution_app", "worker",
            "--pool=threads", f"--concurrency={LIMIT}", "--loglevel=warning",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--include", "benchmarks.retry_after.work", "-Q", queue, "-n", hostname,
        ],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[hostname], timeout=0.5):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(Path(log.name).read_text(errors="replace"))
        engine = Engine(queue=queue)
        key = f"real:{uuid.uuid4().hex}"
        probes: list[tuple[datetime.datetime, float, list[str]]] = []
        finished = 0
        stop_at = time.monotonic() + 30 + args.probes * 2
        while len(probes) < args.probes and time.monotonic() < stop_at:
            try:
                engine.start("bench.sleep", {"key": key, "seconds": duration(rng)})
            except ConcurrencyLimitError as error:
                at = timezone.now()
                if finished >= 10:
                    probes.append((at, error.retry_after, [h.run_id for h in error.holders()]))
            finished = engine.count_runs(tag=f"concurrency:{key}", statuses=["completed"])
            time.sleep(rng.uniform(0.1, 0.6))
        while engine.count_runs(tag=f"concurrency:{key}", statuses=["pending", "running"]):
            time.sleep(0.2)
        pairs = []
        for at, retry_after, holders in probes:
            ends = [engine.get_run(run_id).finished_at for run_id in holders]
            actual = min(end for end in ends if end is not None) - at
            pairs.append((retry_after, actual.total_seconds()))
        return pairs
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
        os.unlink(log.name)


def summary(name: str, pairs: list[tuple[float, float]], typical: float = TYPICAL) -> str:
    clamped = sorted(abs(ra - max(actual, 1.0)) for ra, actual in pairs)
    raw = sorted(abs(ra - actual) for ra, actual in pairs)

    def p90(values: list[float]) -> float:
        return values[min(len(values) - 1, int(0.9 * len(values)))]

    med, p, rmed = statistics.median(clamped), p90(clamped), statistics.median(raw)
    return (
        f"| {name} | {len(pairs)} | {med:.2f} s ({med / typical:.0%}) | {p:.2f} s "
        f"({p / typical:.0%}) | {rmed:.2f} s ({rmed / typical:.0%}) | "
        f"{min(ra for ra, _ in pairs):.2f} s |"
    )


def main() -> None:
    args = parse_args()
    from benchmarks.common.database import set_up_django

    set_up_django(args.database)

    import benchmarks.retry_after.work  # noqa: F401  (registers bench.sleep)
    from durable_django import Engine

    rng = random.Random(args.seed)
    engine = Engine(enqueue=False)
    rows = []
    for limit, typical in ((1, 2.0), (3, 2.0), (10, 2.0), (1, 10.0), (3, 10.0), (10, 10.0)):
        pairs = [driven_trial(engine, rng, limit, typical) for _ in range(args.trials)]
        rows.append(summary(f"driven clock, {typical:g} s runs, limit {limit}", pairs, typical))
    rows.append(summary("real worker, 2 s runs, limit 2", real_worker(args, rng)))
    print(
        "| measurement | refusals | median error | p90 error | median raw error "
        "| smallest retry_after |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
