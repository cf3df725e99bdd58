"""The price of durability: durable runs against plain Celery tasks doing the same work.

Run from the repository root::

    .venv/bin/python -m benchmarks.execution [--runs 2000] [--rounds 3] [--turns 300]
        [--turn-rounds 5] [--in-process-only]

It (re)creates the PostgreSQL database ``durable_bench_exec`` (``--database``), migrates
it, creates the tables ``bench_exec_write`` and ``bench_exec_floor``, and starts three
Celery workers on the Redis broker ``redis://127.0.0.1:6379/13``, each one process with
``--pool=solo`` consuming one variant's queue (the durable variants share one), so that
each worker's peak memory is its own, and a Procrastinate worker.

- **durable**: ``--runs`` runs of ``bench.three_writes`` (three ``ctx.step`` calls, each
  inserting one row and returning a small JSON value), started under a quota;
- **plain**: ``--runs`` Celery tasks making the same three inserts;
- **floor**: the plain task plus the commits a durable turn adds (the claim's, two step
  records', the end of the turn's), each the cheapest one-row insert: what any design
  committing that often would cost at best;
- **transactional**: ``--runs`` runs of ``bench.three_transactions``, the durable workflow
  with ``ctx.transaction`` steps (each insert commits with its record), on the durable
  worker;
- **procrastinate**: ``--runs`` Procrastinate jobs making the same three inserts, run by a
  ``procrastinate worker --concurrency 1`` (``pip install -e '.[bench]'``), its schema in
  the database ``<--database>_procrastinate``.

The ratio table gives each goal, met or missed: durable / plain >= 0.5, transactional /
plain >= 0.65, durable / procrastinate >= 1.0.

A measurement empties the tables, dispatches every run (or task) from this process, and
polls the database until all are done: the time runs from the first dispatch to the last
completion. The variants take turns for ``--rounds`` rounds, each round starting with
another variant; the table shows each variant's median rate over the rounds, and
the ratio is the median of the per-round ratios (the machine is shared: compare rows, not
absolutes). It also shows the CPU time per run of each worker process and of its
PostgreSQL server process, and each worker's peak memory (``VmHWM``). Before the rounds
the script counts the PostgreSQL round trips of one run turn, executed in this process
with libpq's protocol trace on, and lists its statements.

Before starting the workers, the script measures **in-process rows** (printed after the
workers' tables): turns executed in this process as a worker executes them (no broker, no
worker), the variants interleaved:

- **ctx.step turn**: a turn of ``bench.three_writes``, ``engine.execute(run_id)`` (the call
  the ``durable_django.execute_run`` task makes);
- **ctx.transaction turn**: a turn of ``bench.three_transactions``, likewise;
- **floor**: ``floor_three_writes``'s function (the same commits with the cheapest
  writes), called directly, without Celery's task wrapper, as the turns are.

Each of ``--turn-rounds`` rounds empties the tables and starts its ``--turns`` runs of
each workflow first, under the quota, outside the timed part (the timing is the turn
alone); then each variant executes its ``--turns`` turns back to back, each round
starting with another variant. Per variant: the median rate over the rounds, the median
over the rounds of each round's mean and median turn, and the CPU per turn of this
process (``time.process_time()``) and of its connection's PostgreSQL server process. The
ratios, speed ratios (turns/s of the numerator over the denominator's), are the median of
the per-round ratios with their interquartile range, and the same by CPU (this process's,
and this process's with its server process's), with their goals: transactional / step
>= 1.0, step / floor >= 0.8. ``--in-process-only`` measures just these (and the round
trips): no worker, no broker, no Procrastinate; ``--turns 0`` leaves them out. These
rows use the script's own connection: ``--synchronous-commit`` and ``--connections`` are
the workers'; ``--prepared`` is the script's connection's too.

With ``--base PATH`` (a checkout of the code before a change, e.g. ``git worktree add
--detach /tmp/base main``), a sixth variant runs the durable workflow on a worker
importing the package from there: **durable, code before**, beside **durable** (this
checkout, with no instrumentation set up), on a queue of its own. With ``--otel``, two
more: **durable, OTel on** and **plain, OTel on**, workers of this checkout with the
OpenTelemetry SDK's tracer provider set (``opentelemetry-sdk``), its spans batched to an
exporter that drops them, and OpenTelemetry's Celery instrumentation: what the spans
cost a durable run, beside what the same instrumentation costs a plain task. With
``--sentry``, likewise **durable, Sentry on** and **plain, Sentry on**: sentry-sdk with
its Celery integration, every transaction sampled, its envelopes dropped. With
``--only`` the rounds measure just the variants named (e.g.
``--only durable,plain,otel,plain_otel``).

``--connections per-task`` leaves Celery's default (a new database connection per task);
``--prepared`` turns on Django's server-side binding with prepared statements;
``--synchronous-commit off`` shows what the commits' flushes cost. See
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import gc
import io
import math
import os
import platform
import pstats
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.execution_settings")

#: The goals: (numerator, denominator, at least) on runs/s.
GOALS = (
    ("durable", "plain", 0.5),
    ("transactional", "plain", 0.65),
    ("durable", "procrastinate", 1.0),
)
#: The goals of the in-process rows: (numerator, denominator, at least) on turns/s.
IN_PROCESS_GOALS = (
    ("transactional", "step", 1.0),
    ("step", "floor", 0.8),
)
#: The in-process variants, and their rows.
IN_PROCESS = {
    "step": "ctx.step turn: 3 steps",
    "transactional": "ctx.transaction turn: 3 steps",
    "floor": "floor: the same commits",
}
POLL = 0.02  # seconds between two counts of what is done
STALL = 60.0  # seconds without progress before a measurement is abandoned
BENCH_TABLES = ["durable_run", "durable_run_tag", "durable_step", "durable_signal"]
#: The variants on workers of their own (``--base``, ``--otel``, ``--sentry``), and their rows.
INSTRUMENTED = {
    "before": "durable: code before",
    "otel": "durable: OTel on",
    "plain_otel": "plain Celery: OTel on",
    "sentry": "durable: Sentry on",
    "plain_sentry": "plain Celery: Sentry on",
}


@dataclass
class Measurement:
    seconds: float  # first dispatch to last completion
    dispatch: float  # first dispatch to last dispatch
    drain: float  # runs/s of the worker once dispatching was over
    worker_cpu: float  # ms of CPU per run: the worker process
    server_cpu: float  # ms of CPU per run: the worker's PostgreSQL server process (NaN: unknown)
    hwm_kb: int  # the worker's VmHWM after this measurement
    rss_kb: int  # its VmRSS


@dataclass
class TurnBatch:
    """One in-process variant's turns of one round."""

    seconds: float  # wall time of the batch's turns, back to back
    cpu: float  # this process's CPU time over the batch (``time.process_time()``)
    server_cpu: float  # CPU seconds of this connection's server process (NaN: unknown)
    mean_us: float  # the batch's mean turn, µs
    median_us: float  # its median turn, µs


@dataclass
class Variant:
    name: str
    label: str
    worker: Worker
    queue: str
    dispatch: object  # (index) -> None
    done: object  # () -> (done, failed)
    reset: object = None  # () -> None: empties what the variant keeps elsewhere
    measurements: list[Measurement] = field(default_factory=list)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs (tasks) per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per variant")
    parser.add_argument("--database", default="durable_bench_exec", help="PostgreSQL database")
    parser.add_argument(
        "--connections",
        choices=["reuse", "per-task"],
        default="reuse",
        help="the workers keep their database connection across tasks (reuse), or open "
        "one per task as Celery's Django fixup does by default (per-task)",
    )
    parser.add_argument(
        "--prepared",
        action="store_true",
        help="the connections (the workers' and the in-process rows') bind parameters on "
        "the server and prepare repeated statements (OPTIONS server_side_binding and "
        "prepare_threshold)",
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="the workers' synchronous_commit; 'off' (commits not waiting for the disk) "
        "shows how much of the cost is the commits' flushes; for comparison only",
    )
    parser.add_argument(
        "--base",
        default="",
        metavar="PATH",
        help="also run the durable workflow on a worker of the checkout at PATH (the code "
        "before a change), on a queue of its own",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="also run the durable workflow and the plain task on workers with "
        "OpenTelemetry's SDK tracer provider and Celery instrumentation, spans dropped",
    )
    parser.add_argument(
        "--sentry",
        action="store_true",
        help="also run the durable workflow and the plain task on workers with sentry-sdk "
        "and its Celery integration, every transaction sampled, envelopes dropped",
    )
    parser.add_argument(
        "--only",
        default="",
        help="the variants to measure, comma-separated (default: every one)",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=300,
        metavar="N",
        help="turns per variant and round of the in-process rows (0: no in-process rows)",
    )
    parser.add_argument(
        "--turn-rounds",
        type=int,
        default=5,
        metavar="N",
        help="rounds of the in-process rows",
    )
    parser.add_argument(
        "--in-process-only",
        action="store_true",
        help="only the in-process rows (and the round trips): no worker, broker nor Procrastinate",
    )
    parser.add_argument(
        "--alter",
        default="",
        metavar="SQL",
        help="statements run after the migrations, before any run: a schema change "
        "measured alone, for comparison only",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile N run turns executed in this process (cProfile, by CPU time) "
        "and print the top",
    )
    return parser.parse_args()


def sql(statement: str, params: list | None = None) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def empty_tables() -> None:
    from benchmarks.common.execution_work import FLOOR_TABLE, TABLE

    # No ANALYZE: the tables fill from empty, and autovacuum analyses them as they grow.
    sql(f"TRUNCATE {', '.join([*BENCH_TABLES, TABLE, FLOOR_TABLE])} RESTART IDENTITY CASCADE")


# workers ------------------------------------------------------------------------------


def execution_modules(root: Path) -> tuple[str, str, str]:
    """The settings, Celery app and work modules of the checkout at ``root``: in
    ``benchmarks/common/``, or at the top of ``benchmarks/`` in a checkout from before
    the benchmarks were packages (a ``--base`` worker runs the checkout's own)."""
    prefix = "benchmarks.common." if (root / "benchmarks" / "common").is_dir() else "benchmarks."
    return f"{prefix}execution_settings", f"{prefix}execution_app", f"{prefix}execution_work"


class Worker:
    """A ``celery worker --pool=solo`` subprocess consuming one queue."""

    def __init__(
        self,
        name: str,
        queue: str,
        app,
        *,
        procrastinate: bool = False,
        root: Path = ROOT,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.queue = queue
        self.app = app
        #: The checkout whose package the worker imports, and its extra environment.
        self.root = root
        self.extra_env = env or {}
        #: A Procrastinate worker (concurrency 1) instead of a Celery one.
        self.procrastinate = procrastinate
        self.hostname = f"bench-{uuid.uuid4().hex[:12]}@localhost"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="durable-bench-worker-", suffix=".log", delete=False
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, connections: str, synchronous_commit: str, prepared: bool) -> None:
        settings_module, app_module, work_module = execution_modules(self.root)
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE=settings_module,
            DURABLE_BENCH_CONNECTIONS=connections,
            DURABLE_BENCH_APPLICATION=self.application,
            DURABLE_BENCH_SYNCHRONOUS_COMMIT=synchronous_commit,
            DURABLE_BENCH_PREPARED="1" if prepared else "0",
            PYTHONPATH=os.pathsep.join(filter(None, [str(self.root), env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
            **self.extra_env,
        )
        if self.procrastinate:
            self._start_procrastinate(env)
            return
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app_module,
                "worker",
                "--pool=solo",
                "--concurrency=1",
                "--loglevel=warning",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--include",
                work_module,
                "-Q",
                self.queue,
                "-n",
                self.hostname,
            ],
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(
            lambda: bool(self.app.control.ping(destination=[self.hostname], timeout=0.5))
        )

    def _start_procrastinate(self, env: dict[str, str]) -> None:
        """``procrastinate worker --concurrency 1`` on the queue; ready once it is
        connected to its database (without ``--verbose``: a log line per job would cost
        it time the Celery workers, at ``--loglevel=warning``, do not spend)."""
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "procrastinate",
                "--app",
                "benchmarks.execution.procrastinate_app.app",
                "worker",
                "--concurrency",
                "1",
                "--queues",
                self.queue,
                "--delete-jobs",
                "never",
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(lambda: bool(self.server_cpu()[0]), pause=0.1)

    def _wait_ready(self, ready: Callable[[], bool], pause: float = 0.0) -> None:
        """Return once ``ready()`` says the started worker is ready; raise with its log
        when it exits or is not ready within 60 s."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.read_log()}")
            if ready():
                return
            time.sleep(pause)
        raise RuntimeError(f"worker not ready after 60 s:\n{self.read_log()}")

    @property
    def application(self) -> str:
        """The ``application_name`` of the worker's database connections."""
        return f"durable_bench_{self.name}"

    def cpu(self) -> float:
        """CPU seconds the worker process has used (user + system)."""
        assert self.process is not None
        return cpu_seconds(self.process.pid)

    def server_cpu(self) -> tuple[frozenset[int], float]:
        """The worker's PostgreSQL server processes, and the CPU seconds they have used."""
        pids = frozenset(
            pid
            for (pid,) in sql(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                [self.application],
            )
        )
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        return pids, total

    def memory(self) -> tuple[int, int]:
        """(VmHWM, VmRSS) of the worker process, in kB."""
        values = {}
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0])
        return values["VmHWM"], values["VmRSS"]

    def read_log(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.log.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.log.name)


def shown(value: float, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals, or "n/a" for NaN (not measured)."""
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def verdict(value: float, goal: float | None) -> str:
    """The goal's line of a ratio: ">= goal: met" or "MISSED" ("" without a goal)."""
    return "" if goal is None else f">= {goal}: {'met' if value >= goal else 'MISSED'}"


def per_round(values: list[float]) -> str:
    """Per-round ratios, as the ratio tables show them."""
    return ", ".join(f"{value:.3f}" for value in values)


def iqr(values: list[float]) -> str:
    """The interquartile range of ``values``, "n/a" for fewer than two."""
    if len(values) < 2:
        return "n/a"
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:.2f}-{high:.2f}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def purge(app, queue: str) -> int:
    with app.connection_for_write() as conn:
        return conn.default_channel.queue_purge(queue) or 0


# measuring ----------------------------------------------------------------------------


def measure(variant: Variant, runs: int) -> Measurement:
    """Dispatch ``runs`` runs (tasks) and wait until all are done."""
    empty_tables()
    if variant.reset is not None:
        variant.reset()
    gc.collect()
    worker_cpu = variant.worker.cpu()
    server_pids, server_cpu = variant.worker.server_cpu()
    clock = time.perf_counter
    began = clock()
    for index in range(runs):
        variant.dispatch(index)
    dispatched = clock()
    done_at_dispatch, failed = variant.done()
    last, last_progress = done_at_dispatch, clock()
    while True:
        done, failed = variant.done()
        now = clock()
        if failed:
            raise RuntimeError(
                f"{variant.name}: {failed} runs failed:\n{variant.worker.read_log()}"
            )
        if done >= runs:
            break
        if done != last:
            last, last_progress = done, now
        elif now - last_progress > STALL:
            raise RuntimeError(
                f"{variant.name}: stuck at {done}/{runs}:\n{variant.worker.read_log()}"
            )
        time.sleep(POLL)
    ended = clock()
    worker_cpu = variant.worker.cpu() - worker_cpu
    pids, server_cpu_after = variant.worker.server_cpu()
    # Known only when the worker kept one connection (and so one server process) throughout.
    server_cpu = server_cpu_after - server_cpu if pids == server_pids and pids else float("nan")
    hwm, rss = variant.worker.memory()
    left = runs - done_at_dispatch
    drain = left / (ended - dispatched) if left and ended > dispatched else float("nan")
    return Measurement(
        ended - began,
        dispatched - began,
        drain,
        worker_cpu * 1000 / runs,
        server_cpu * 1000 / runs,
        hwm,
        rss,
    )


def turn_round_trips(engine, workflow) -> tuple[int, list[str]]:
    """PostgreSQL round trips of one turn of a fresh run, and their statements."""
    from django.db import connection
    from psycopg import pq

    handle = engine.start(workflow, {"tenant": "t0", "n": -1})
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            assert engine.execute(handle.run_id)
        finally:
            pgconn.untrace()
        trace.flush()
        trace.seek(0)
        statements = []
        for line in trace:
            # Django's psycopg cursors bind client-side: every statement is one Query.
            match = re.match(r'F\t\d+\tQuery\t "(.*)"', line)
            if match:
                statements.append(match.group(1))
            elif re.match(r"F\t\d+\tSync\b", line):
                statements.append("(extended-protocol batch)")
    assert engine.get_run(handle.run_id).status == "completed"
    return len(statements), statements


def short(statement: str, width: int = 96) -> str:
    statement = re.sub(r"'[^']*'", "'…'", statement)
    statement = re.sub(r"\s+", " ", statement)
    return statement if len(statement) <= width else statement[: width - 1] + "…"


def profile_turns(engine, workflow, turns: int) -> str:
    """cProfile of ``turns`` run turns executed in this process, by CPU time (the waits
    for the server are left out): the top by own time."""
    handles = [engine.start(workflow, {"tenant": f"t{i % 10}", "n": i}) for i in range(turns)]
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for handle in handles:
        engine.execute(handle.run_id)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    return out.getvalue()


def timed_turns(turn, items: list) -> TurnBatch:
    """Call ``turn(item)`` for each of ``items``, back to back, and time each call."""
    gc.collect()
    ((pid,),) = sql("SELECT pg_backend_pid()")
    server_before = cpu_seconds(pid)
    clock = time.perf_counter
    durations = []
    cpu_before = time.process_time()
    began = clock()
    for item in items:
        start = clock()
        turn(item)
        durations.append(clock() - start)
    seconds = clock() - began
    cpu = time.process_time() - cpu_before
    server_cpu = cpu_seconds(pid) - server_before
    # Known only when the connection (and so its server process) was the same throughout.
    if sql("SELECT pg_backend_pid()")[0][0] != pid:
        server_cpu = float("nan")
    return TurnBatch(
        seconds,
        cpu,
        server_cpu,
        statistics.fmean(durations) * 1e6,
        statistics.median(durations) * 1e6,
    )


def measure_in_process(
    engine, step_flow, transaction_flow, turns: int, rounds: int
) -> dict[str, list[TurnBatch]]:
    """The in-process rows: ``rounds`` rounds of ``turns`` turns of each variant, executed
    in this process as a worker executes them (``engine.execute(run_id)``, the call of
    the ``durable_django.execute_run`` task; the floor's task function itself).

    Each round empties the tables and starts its runs first (not timed); then each
    variant executes its turns back to back, each round starting with another variant.
    """
    from benchmarks.common.execution_work import TENANTS, floor_three_writes

    flows = {"step": step_flow, "transactional": transaction_flow}

    def prepare(name: str, count: int) -> list[str]:
        if name == "floor":
            return [uuid.uuid4().hex for _ in range(count)]
        return [
            engine.start(flows[name], {"tenant": f"t{i % TENANTS}", "n": i}).run_id
            for i in range(count)
        ]

    work = {"step": engine.execute, "transactional": engine.execute}
    work["floor"] = floor_three_writes.run  # the function, without Celery's call wrapper
    names = list(IN_PROCESS)
    batches: dict[str, list[TurnBatch]] = {name: [] for name in names}
    # Warm up: the connection's caches, the functions compiled, the tables' first pages.
    empty_tables()
    for name in names:
        timed_turns(work[name], prepare(name, 50))
    print(
        f"measuring in this process: {len(names)} variants x {rounds} rounds x {turns} turns ...",
        flush=True,
    )
    for number in range(rounds):
        empty_tables()
        prepared = {name: prepare(name, turns) for name in names}
        order = names[number % len(names) :] + names[: number % len(names)]
        for name in order:
            batch = timed_turns(work[name], prepared[name])
            batches[name].append(batch)
            print(
                f"  round {number + 1} {name:<13} {turns / batch.seconds:7.0f} turns/s "
                f"(mean {batch.mean_us:.0f} µs, median {batch.median_us:.0f} µs; "
                f"CPU µs/turn: this process {batch.cpu * 1e6 / turns:.0f}, "
                f"its server process {shown(batch.server_cpu * 1e6 / turns, 0)})",
                flush=True,
            )
        completed = engine.count_runs(statuses=["completed"])
        assert completed == 2 * turns, f"{completed} of {2 * turns} runs completed"
    return batches


def print_in_process(batches: dict[str, list[TurnBatch]], turns: int) -> None:
    """The in-process rows and their ratios, each with its goal."""
    rounds = len(next(iter(batches.values())))
    rates = {name: [turns / b.seconds for b in bs] for name, bs in batches.items()}
    shown_rates = {name: " ".join(f"{r:.0f}" for r in rs) for name, rs in rates.items()}
    column = max(9, *(len(text) for text in shown_rates.values()))
    header = (
        f"| {'in process':<30} | {'turns/s':>7} | {'per round':>{column}} | {'mean µs':>7} "
        f"| {'median µs':>9} | {'CPU µs/turn':>11} | {'its PG CPU µs/turn':>18} |"
    )
    print(header)
    print("| " + " | ".join("-" * (len(c) - 2) for c in header.split("|")[1:-1]) + " |")
    for name, label in IN_PROCESS.items():
        bs = batches[name]
        print(
            f"| {label:<30} | {statistics.median(rates[name]):>7.0f} "
            f"| {shown_rates[name]:>{column}} "
            f"| {statistics.median(b.mean_us for b in bs):>7.0f} "
            f"| {statistics.median(b.median_us for b in bs):>9.0f} "
            f"| {statistics.median(b.cpu for b in bs) * 1e6 / turns:>11.0f} "
            f"| {shown(statistics.median(b.server_cpu for b in bs) * 1e6 / turns, 0):>18} |"
        )
    print()
    width = max(23, 7 * rounds - 2)
    print(
        f"| {'ratio (in process, turns/s)':<52} | {'value':>5} | {'IQR':<9} "
        f"| {'per round':<{width}} | {'by CPU':>6} | {'by CPU + PG':>11} | {'goal':<16} |"
    )
    print(
        f"| {'-' * 52} | {'-' * 4}: | {'-' * 9} | {'-' * width} | {'-' * 5}: | {'-' * 10}: "
        f"| {'-' * 16} |"
    )
    goals = {(n, d): at_least for n, d, at_least in IN_PROCESS_GOALS}
    for numerator, denominator in (
        ("transactional", "step"),
        ("step", "floor"),
        ("transactional", "floor"),
    ):
        pairs = list(zip(batches[numerator], batches[denominator], strict=True))
        ratios = [d.seconds / n.seconds for n, d in pairs]
        by_cpu = statistics.median(d.cpu / n.cpu for n, d in pairs)
        with_server = statistics.median(
            (d.cpu + d.server_cpu) / (n.cpu + n.server_cpu) for n, d in pairs
        )
        value = statistics.median(ratios)
        print(
            f"| {numerator + ' / ' + denominator:<52} | {value:.3f} | {iqr(ratios):<9} "
            f"| {per_round(ratios):<{width}} | {by_cpu:.3f} | {shown(with_server, 3):>11} "
            f"| {verdict(value, goals.get((numerator, denominator))):<16} |"
        )
    print()


def main() -> None:
    args = parse_args()
    os.environ["DURABLE_BENCH_DB"] = args.database
    os.environ["DURABLE_BENCH_CONNECTIONS"] = args.connections
    # The in-process rows' connection too: a turn and the floor, both prepared.
    os.environ["DURABLE_BENCH_PREPARED"] = "1" if args.prepared else "0"
    procrastinate_database = f"{args.database}_procrastinate"
    os.environ["DURABLE_BENCH_PROCRASTINATE_DB"] = procrastinate_database
    from benchmarks.common.database import recreate_database

    recreate_database(args.database)
    if not args.in_process_only:
        recreate_database(procrastinate_database)

    import django

    django.setup()

    from django.core.management import call_command
    from django.db import connection

    from benchmarks.common.execution_app import app
    from benchmarks.common.execution_work import (
        FLOOR_QUEUE,
        FLOOR_TABLE,
        PLAIN_QUEUE,
        TABLE,
        TENANTS,
        create_tables,
        floor_three_writes,
        plain_three_writes,
        three_transactions,
    )
    from benchmarks.common.execution_work import three_writes as workflow
    from durable_django import Engine
    from durable_django.engines import default_engine

    call_command("migrate", verbosity=0)
    create_tables()
    if args.alter:
        sql(args.alter)

    # One turn's round trips, and the in-process rows, in this process (no worker yet).
    local = Engine(enqueue=False)
    trips, statements = turn_round_trips(local, workflow)
    tx_trips, tx_statements = turn_round_trips(local, three_transactions)
    in_process: dict[str, list[TurnBatch]] = {}
    if args.turns:
        in_process_load = os.getloadavg()
        began = time.perf_counter()
        in_process = measure_in_process(
            local, workflow, three_transactions, args.turns, args.turn_rounds
        )
        in_process_elapsed = time.perf_counter() - began
        in_process_load += os.getloadavg()

    def machine(load: tuple[float, ...], broker: str = "") -> str:
        """The date, the versions, the cores and the load average before and after."""
        server = sql("SHOW server_version")[0][0]
        return (
            f"{datetime.date.today().isoformat()}, Python {platform.python_version()}, "
            f"PostgreSQL {server.split()[0]}{broker}, {os.cpu_count()} cores (shared), "
            f"load average {load[0]:.2f} before, {load[3]:.2f} after"
        )

    def print_in_process_rows() -> None:
        if not in_process:
            return
        print(
            f"in this process: {machine(in_process_load)}; {args.turn_rounds} rounds x "
            f"{args.turns} turns per variant in {in_process_elapsed:.0f} s; the runs "
            f"started before each round, not timed"
        )
        print()
        print_in_process(in_process, args.turns)

    def print_round_trips() -> None:
        for flow, count, listed in (
            (workflow, trips, statements),
            (three_transactions, tx_trips, tx_statements),
        ):
            print(f"one run turn of {flow.name!r}: {count} PostgreSQL round trips")
            for number, statement in enumerate(listed, 1):
                print(f"  {number:>2}. {short(statement)}")
            print()

    if args.in_process_only:
        profile = profile_turns(local, workflow, args.profile) if args.profile else ""
        print()
        print_in_process_rows()
        print_round_trips()
        if profile:
            print(f"profile of {args.profile} run turns in this process:")
            print(profile)
        connection.close()
        return

    durable_queue = default_engine.config.queue
    queues = [durable_queue, PLAIN_QUEUE, FLOOR_QUEUE]
    purged = sum(purge(app, queue) for queue in queues)

    # Procrastinate's schema, in its database; this process defers through a sync pool.
    from benchmarks.execution.procrastinate_app import QUEUE as PROCRASTINATE_QUEUE
    from benchmarks.execution.procrastinate_app import app as procrastinate_app
    from benchmarks.execution.procrastinate_app import procrastinate_three_writes

    procrastinate_app.open()
    procrastinate_app.schema_manager.apply_schema()

    def durable_dispatch(index: int) -> None:
        workflow.dispatch({"tenant": f"t{index % TENANTS}", "n": index})

    def dispatch_to(queue: str):
        """The durable workflow's dispatch, sent to ``queue``."""
        engine = Engine(queue=queue)

        def dispatch(index: int) -> None:
            engine.start(workflow, {"tenant": f"t{index % TENANTS}", "n": index})

        return dispatch

    def transactional_dispatch(index: int) -> None:
        three_transactions.dispatch({"tenant": f"t{index % TENANTS}", "n": index})

    def procrastinate_dispatch(index: int) -> None:
        procrastinate_three_writes.defer(job_id=uuid.uuid4().hex)

    def procrastinate_sql(statement: str) -> list[tuple]:
        with procrastinate_app.connector.get_sync_connector().pool.connection() as conn:
            return conn.execute(statement).fetchall() if "SELECT" in statement else []

    def procrastinate_done() -> tuple[int, int]:
        failed = procrastinate_sql(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'"
        )[0][0]
        return sql(f"SELECT count(*) FROM {TABLE}")[0][0] // 3, failed

    def procrastinate_reset() -> None:
        procrastinate_sql("TRUNCATE procrastinate_jobs RESTART IDENTITY CASCADE")

    def durable_done() -> tuple[int, int]:
        return sql(
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status IN ('failed', 'cancelled', 'blocked')) "
            "FROM durable_run"
        )[0]

    def plain_to(queue: str):
        """The plain task's dispatch, sent to ``queue``."""

        def dispatch(index: int) -> None:
            plain_three_writes.apply_async((uuid.uuid4().hex,), queue=queue)

        return dispatch

    def plain_done() -> tuple[int, int]:
        return sql(f"SELECT count(*) FROM {TABLE}")[0][0] // 3, 0

    def floor_dispatch(index: int) -> None:
        floor_three_writes.apply_async((uuid.uuid4().hex,), queue=FLOOR_QUEUE)

    def floor_done() -> tuple[int, int]:
        return sql(f"SELECT count(*) FROM {FLOOR_TABLE} WHERE kind = 'end'")[0][0], 0

    workers = {
        "durable": Worker("durable", durable_queue, app),
        "plain": Worker("plain", PLAIN_QUEUE, app),
        "floor": Worker("floor", FLOOR_QUEUE, app),
        "procrastinate": Worker(
            "procrastinate", PROCRASTINATE_QUEUE, procrastinate_app, procrastinate=True
        ),
    }
    if args.base:
        workers["before"] = Worker(
            "before", f"{durable_queue}_before", app, root=Path(args.base).resolve()
        )
    for name, on, setting in (("otel", args.otel, "OTEL"), ("sentry", args.sentry, "SENTRY")):
        if on:
            env = {f"DURABLE_BENCH_{setting}": "1"}
            workers[name] = Worker(name, f"{durable_queue}_{name}", app, env=env)
            plain = f"plain_{name}"
            workers[plain] = Worker(plain, f"{PLAIN_QUEUE}_{name}", app, env=env)
    queues += [worker.queue for name, worker in workers.items() if name in INSTRUMENTED]
    try:
        for worker in workers.values():
            worker.start(args.connections, args.synchronous_commit, args.prepared)
        variants = {
            "durable": Variant(
                "durable",
                "durable: 3-step workflow",
                workers["durable"],
                durable_queue,
                durable_dispatch,
                durable_done,
            ),
            "transactional": Variant(
                "transactional",
                "durable: 3 ctx.transaction",
                workers["durable"],
                durable_queue,
                transactional_dispatch,
                durable_done,
            ),
            "plain": Variant(
                "plain",
                "plain Celery: 3-write task",
                workers["plain"],
                PLAIN_QUEUE,
                plain_to(PLAIN_QUEUE),
                plain_done,
            ),
            "floor": Variant(
                "floor",
                "floor: plain + turn commits",
                workers["floor"],
                FLOOR_QUEUE,
                floor_dispatch,
                floor_done,
            ),
            "procrastinate": Variant(
                "procrastinate",
                "Procrastinate: 3-write job",
                workers["procrastinate"],
                PROCRASTINATE_QUEUE,
                procrastinate_dispatch,
                procrastinate_done,
                procrastinate_reset,
            ),
        }
        for name, label in INSTRUMENTED.items():
            if name in workers:
                queue = workers[name].queue
                plain = name.startswith("plain_")
                dispatch = plain_to(queue) if plain else dispatch_to(queue)
                done = plain_done if plain else durable_done
                variants[name] = Variant(name, label, workers[name], queue, dispatch, done)
        if args.only:
            variants = {name: variants[name] for name in args.only.split(",")}
        # Warm up: imports, connections, cached plans, Celery's producer pool.
        for variant in variants.values():
            measure(variant, 100)
        print(
            f"measuring {len(variants)} variants x {args.rounds} rounds x {args.runs} runs, "
            f"one worker of concurrency 1 per variant (the two durable ones share theirs) ...",
            flush=True,
        )
        load = os.getloadavg()
        began = time.perf_counter()
        for number in range(args.rounds):
            # Each round starts with another variant.
            names = list(variants)
            order = names[number % len(names) :] + names[: number % len(names)]
            for name in order:
                variant = variants[name]
                m = measure(variant, args.runs)
                variant.measurements.append(m)
                print(
                    f"  round {number + 1} {name:<12} {args.runs / m.seconds:7.0f} runs/s "
                    f"({m.seconds:.2f} s, dispatch {m.dispatch:.2f} s, "
                    f"then {m.drain:.0f}/s; CPU ms/run: worker {m.worker_cpu:.2f}, "
                    f"its server process {shown(m.server_cpu)}; VmHWM {m.hwm_kb / 1024:.1f} MiB)",
                    flush=True,
                )
        elapsed = time.perf_counter() - began
        load += os.getloadavg()
        profile = profile_turns(local, workflow, args.profile) if args.profile else ""
    finally:
        for worker in workers.values():
            worker.stop()
        purged += sum(purge(app, queue) for queue in queues)
        procrastinate_app.close()

    print()
    print(
        f"{machine(load, ', Redis broker')}; "
        f"{args.rounds} rounds x {args.runs} runs per variant in {elapsed:.0f} s; "
        f"worker connections: {args.connections}; "
        f"workers' synchronous_commit: {args.synchronous_commit}; "
        f"prepared statements: {'on' if args.prepared else 'off'}"
    )
    print()
    header = (
        f"| {'variant':<28} | {'runs/s':>6} | {'per round':>17} | {'dispatch s':>10} "
        f"| {'drain/s':>7} | {'worker CPU ms/run':>17} | {'PG CPU ms/run':>13} "
        f"| {'VmHWM MiB':>9} | {'VmRSS MiB':>9} |"
    )
    print(header)
    print("| " + " | ".join("-" * (len(c) - 2) for c in header.split("|")[1:-1]) + " |")
    for variant in variants.values():
        ms = variant.measurements
        rates = [args.runs / m.seconds for m in ms]
        print(
            f"| {variant.label:<28} | {statistics.median(rates):>6.0f} "
            f"| {' '.join(f'{r:.0f}' for r in rates):>17} "
            f"| {statistics.median(m.dispatch for m in ms):>10.2f} "
            f"| {statistics.median(m.drain for m in ms):>7.0f} "
            f"| {statistics.median(m.worker_cpu for m in ms):>17.2f} "
            f"| {shown(statistics.median(m.server_cpu for m in ms)):>13} "
            f"| {max(m.hwm_kb for m in ms) / 1024:>9.1f} | {ms[-1].rss_kb / 1024:>9.1f} |"
        )
    print()
    measured = {name: variant.measurements for name, variant in variants.items()}

    def ratio(numerator: str, denominator: str) -> tuple[float, list[float]]:
        """The median of the per-round rate ratios numerator/denominator, and the ratios."""
        rounds = [
            d.seconds / n.seconds
            for n, d in zip(measured[numerator], measured[denominator], strict=True)
        ]
        return statistics.median(rounds), rounds

    width = max(23, 7 * args.rounds - 2)  # the per-round ratios, "0.123, " each
    print(f"| {'ratio (runs/s)':<52} | {'value':>5} | {'per round':<{width}} | {'goal':<16} |")
    print(f"| {'-' * 52} | {'-' * 4}: | {'-' * width} | {'-' * 16} |")
    goals = {(n, d): at_least for n, d, at_least in GOALS}
    for numerator, denominator, note in (
        ("durable", "plain", ""),
        ("transactional", "plain", ""),
        ("durable", "procrastinate", ""),
        ("transactional", "procrastinate", ""),
        ("transactional", "durable", ""),
        ("procrastinate", "plain", ""),
        ("floor", "plain", " (the best this many commits allow)"),
        ("durable", "floor", " (how close to it)"),
        ("durable", "before", " (no instrumentation)"),
        ("otel", "durable", " (OTel on, against off)"),
        ("plain_otel", "plain", " (OTel on, against off)"),
        ("otel", "plain_otel", " (both OTel on)"),
        ("sentry", "durable", " (Sentry on, against off)"),
        ("plain_sentry", "plain", " (Sentry on, against off)"),
        ("sentry", "plain_sentry", " (both Sentry on)"),
    ):
        if numerator not in measured or denominator not in measured:
            continue
        value, rounds = ratio(numerator, denominator)
        goal = verdict(value, goals.get((numerator, denominator)))
        print(
            f"| {numerator + ' / ' + denominator + note:<52} | {value:.3f} "
            f"| {per_round(rounds):<{width}} | {goal:<16} |"
        )
    print()
    if "durable" in measured and "plain" in measured:
        durable, plain = measured["durable"], measured["plain"]
        drains = [d.drain / p.drain for d, p in zip(durable, plain, strict=True)]
        print(f"durable/plain, drain rates after dispatching = {statistics.median(drains):.3f}")
    for name in ("durable", "transactional", "procrastinate", *INSTRUMENTED):
        if name not in measured or "plain" not in measured:
            continue
        plain = measured["plain"]
        for label, attribute in (("worker", "worker_cpu"), ("its PostgreSQL", "server_cpu")):
            costs = [
                getattr(d, attribute) / getattr(p, attribute)
                for d, p in zip(measured[name], plain, strict=True)
            ]
            print(f"CPU per run, {label}: {name}/plain = {shown(statistics.median(costs))}x")
    print()
    print_in_process_rows()
    print_round_trips()
    if profile:
        print(f"profile of {args.profile} run turns in this process:")
        print(profile)
    connection.close()
    print(f"purged {purged} messages from the Redis queues")


if __name__ == "__main__":
    main()
