"""Soak: every run ends, every slot frees, and no key is ever over its limit.

Run from the repository root::

    .venv/bin/python -m benchmarks.soak [--seconds 60] [--database postgres|mariadb|sqlite]

For ``--seconds``, ``--starters`` processes start runs of ``soak.turn``
(``benchmarks/soak/work.py``) on a few quota keys with small limits, and now and then
cancel one of their runs, retry a failed one or signal a waiting one; ``--workers`` real
Celery workers (threads pool) execute the runs on Redis, and one of them is killed with
SIGKILL every ``--kill-every`` seconds and replaced; two ``manage.py durable tick
--interval 1`` processes run side by side. With ``--restart-db-every``, the soak runs on
a PostgreSQL server of its own and restarts it in immediate mode (as a crash would) that
often; calls that fail meanwhile are counted, not errors. Meanwhile this process samples, every few
milliseconds, how many runs each key holds, counted from the runs' own statuses (and, as
the quota counts them, from the tags' status copies).

Then the starters stop and the soak waits (``--drain`` seconds at most) for every run to
end. It prints, per key, the most runs seen holding it against its limit, and overall the
runs started, refused, cancelled, retried, ended and stuck (not ended after the drain),
tag rows without a run and tag rows whose status copy differs from their run's. It exits
1 if a key was ever over its limit, a run is stuck, a starter met an unexpected error,
or a row is orphaned or out of step.

The database is made anew: PostgreSQL or MariaDB database ``durable_soak``
(``--name``), or an SQLite file in a temporary folder. The Redis database
``redis://127.0.0.1:6379/12`` is emptied first. Leases are 4 s and lost messages are
resent after 5 s (``benchmarks/soak/settings.py``), so a killed worker's runs come back
within the soak. See docs/failure-modes.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ACTIVE = ("pending", "running", "suspended", "blocked")
KIND_WEIGHTS = {"plain": 6, "sleep": 2, "signal": 2, "child": 1, "fail": 2}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60, help="how long runs are started")
    parser.add_argument("--database", choices=["postgres", "mariadb", "sqlite"], default="postgres")
    parser.add_argument("--name", default="durable_soak", help="the server database's name")
    parser.add_argument("--keys", default="a:1,b:2,c:3,d:5", help="quota keys as name:limit")
    parser.add_argument("--starters", type=int, default=3, help="starting processes")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--threads", type=int, default=3, help="threads per worker")
    parser.add_argument(
        "--kill-every", type=float, default=15, help="SIGKILL a worker this often (0: never)"
    )
    parser.add_argument(
        "--restart-db-every",
        type=float,
        default=0,
        metavar="SECONDS",
        help="run on a PostgreSQL server of the soak's own (initdb in a temporary folder, "
        "on a free port) and restart it in immediate mode this often (0: never)",
    )
    parser.add_argument("--drain", type=float, default=90, help="seconds to wait for the end")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


def configure(args: argparse.Namespace) -> None:
    """Environment of this process and of every process it starts."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.soak.settings"
    os.environ["DURABLE_SOAK_DB"] = args.database
    os.environ["DURABLE_SOAK_NAME"] = args.name
    os.environ.setdefault("DURABLE_SOAK_QUEUE", f"durable_soak_{uuid.uuid4().hex[:8]}")
    if args.database == "sqlite":
        folder = tempfile.mkdtemp(prefix="durable-soak-")
        os.environ["DURABLE_SOAK_SQLITE"] = os.path.join(folder, "soak.sqlite3")
    paths = [str(ROOT), os.environ.get("PYTHONPATH")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))


class OwnPostgres:
    """A PostgreSQL server of the soak's own, in a temporary folder, on a free port.

    Run as the ``postgres`` system user when this process is root (the server refuses
    root). ``restart()`` stops it in immediate mode, as a crash would, and starts it again.
    """

    def __init__(self) -> None:
        import glob
        import shutil
        import socket

        self.bin = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1])
        self.folder = Path(tempfile.mkdtemp(prefix="durable-soak-pg-"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self.data = self.folder / "data"
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()

    def _run(self, program: str, *arguments: str) -> None:
        command = [str(self.bin / program), *arguments]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, cwd=self.folder)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.folder / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def restart(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.start()

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


def recreate_database(args: argparse.Namespace) -> None:
    if args.database == "postgres":
        from benchmarks.common.database import recreate_database as recreate_postgres

        recreate_postgres(args.name)
    elif args.database == "mariadb":
        import pymysql

        connection = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{args.name}`")
            cursor.execute(f"CREATE DATABASE `{args.name}` CHARACTER SET utf8mb4")
        connection.close()
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def empty_broker() -> None:
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


# the processes ------------------------------------------------------------------------


class Child:
    """A subprocess in a session of its own, its output in a temporary file."""

    def __init__(self, name: str, command: list[str]) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix=f"durable-soak-{name}-", suffix=".log", delete=False
        )
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

    def tail(self, lines: int = 20) -> str:
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])


def start_worker(index: int, threads: int) -> Child:
    queue = os.environ["DURABLE_SOAK_QUEUE"]
    return Child(
        f"worker{index}",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "benchmarks.soak.app",
            "worker",
            "--pool=threads",
            f"--concurrency={threads}",
            "--loglevel=warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--include",
            "benchmarks.soak.work",
            "-Q",
            queue,
            "-n",
            f"soak{index}-{uuid.uuid4().hex[:6]}@localhost",
        ],
    )


def start_ticker(index: int) -> Child:
    return Child(
        f"ticker{index}",
        [sys.executable, "-m", "benchmarks.soak.manage", "durable", "tick", "--interval", "1"],
    )


def starter_main(
    index: int, deadline: float, keys: list[str], seed: int, results: Any
) -> None:  # pragma: no cover - runs in a spawned process
    """Start runs until ``deadline``; now and then cancel, retry or signal one."""
    import django

    django.setup()
    from django.db import DatabaseError, close_old_connections

    import benchmarks.soak.app  # noqa: F401  (messages go to the soak's broker)
    from benchmarks.soak.work import turn
    from durable_django import ConcurrencyLimitError, DurableError
    from durable_django import engine as default_engine

    rng = random.Random(seed * 1000 + index)
    counts: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    mine: list[str] = []
    kinds, weights = zip(*KIND_WEIGHTS.items(), strict=True)
    while time.time() < deadline:
        key = rng.choice(keys)
        input = {"key": key, "kind": rng.choices(kinds, weights)[0], "ms": rng.choice([5, 20, 60])}
        try:
            handle = turn.dispatch(input)
        except ConcurrencyLimitError:
            counts["refused"] += 1
        except DatabaseError:
            # The server went away (a restart): as a web request would, give up this one.
            counts["database unavailable"] += 1
            close_old_connections()
        except Exception as error:  # anything else is a finding
            counts["errors"] += 1
            errors.append(f"dispatch: {error!r}")
        else:
            counts["started"] += 1
            mine = [*mine[-30:], handle.run_id]
        roll = rng.random()
        try:
            if roll < 0.05 and mine:
                counts["cancelled"] += default_engine.cancel(rng.choice(mine))
            elif roll < 0.12:
                failed = default_engine.list_runs(
                    statuses=["failed"], workflow="soak.turn", limit=10
                )
                if failed:
                    default_engine.retry(rng.choice(failed).run_id)
                    counts["retried"] += 1
            elif roll < 0.20 and mine:
                run_id = rng.choice(mine)
                default_engine.signal(f"soak:{run_id}", {"from": index})
                counts["signalled"] += 1
        except ConcurrencyLimitError:
            counts["retry refused"] += 1
        except DurableError:
            # Another starter retried or cancelled the same run first.
            counts["raced"] += 1
        except DatabaseError:
            counts["database unavailable"] += 1
            close_old_connections()
        except Exception as error:
            counts["errors"] += 1
            errors.append(f"operator call: {error!r}")
        time.sleep(rng.uniform(0, 0.02))
    results.put((index, dict(counts), errors[:10]))


# sampling -----------------------------------------------------------------------------


def sql(statement: str, params: list[Any] | None = None) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return cursor.fetchall() if cursor.description else []


ACTIVE_SQL = ", ".join(f"'{status}'" for status in ACTIVE)
BY_RUN_SQL = (
    "SELECT t.tag, COUNT(*) FROM durable_run r JOIN durable_run_tag t ON t.run_id = r.id "
    f"WHERE t.tag LIKE 'concurrency:soak:%%' AND r.status IN ({ACTIVE_SQL}) GROUP BY t.tag"
)
BY_TAG_SQL = (
    "SELECT tag, COUNT(*) FROM durable_run_tag "
    f"WHERE tag LIKE 'concurrency:soak:%%' AND status IN ({ACTIVE_SQL}) GROUP BY tag"
)


@dataclass
class Peaks:
    """The most runs seen holding each key: by the runs' statuses and by the tag copies."""

    by_run: dict[str, int] = field(default_factory=collections.Counter)
    by_tag: dict[str, int] = field(default_factory=collections.Counter)
    samples: int = 0
    unavailable: int = 0

    def sample(self) -> None:
        from django.db import DatabaseError, connection

        try:
            for target, statement in ((self.by_run, BY_RUN_SQL), (self.by_tag, BY_TAG_SQL)):
                for tag, count in sql(statement):
                    key = tag[len("concurrency:") :]
                    target[key] = max(target[key], count)
        except DatabaseError:
            # The server is restarting: a new connection next time.
            connection.close()
            self.unavailable += 1
            return
        self.samples += 1


def runs_failed_by_a_fault() -> list[tuple[str, str]]:
    """Failed runs whose error is not the soak's failing step: a run failed by a fault
    (a killed worker, a restarted database) instead of being recovered."""
    import json

    found = []
    for run_id, error in sql("SELECT id, error FROM durable_run WHERE status = 'failed'"):
        error = json.loads(error) if isinstance(error, str) else error
        message = str((error or {}).get("message", ""))
        if "the soak's failing step" not in message:
            found.append((run_id, message[:200]))
    return found


def active_runs() -> int:
    from django.db import DatabaseError, connection

    try:
        return sql(f"SELECT COUNT(*) FROM durable_run WHERE status IN ({ACTIVE_SQL})")[0][0]
    except DatabaseError:
        connection.close()
        return -1


# the soak -----------------------------------------------------------------------------


def main() -> int:
    args = parse_args()
    configure(args)
    server = None
    if args.restart_db_every:
        if args.database != "postgres":
            raise SystemExit("--restart-db-every runs on a PostgreSQL of the soak's own")
        server = OwnPostgres()
        os.environ["DURABLE_SOAK_PG_PORT"] = os.environ["DURABLE_BENCH_PORT"] = str(server.port)
    try:
        return soak(args, server)
    finally:
        if server is not None:
            server.stop()


def soak(args: argparse.Namespace, server: OwnPostgres | None) -> int:
    recreate_database(args)
    empty_broker()
    from django.db import connection

    limits = {}
    for item in args.keys.split(","):
        name, limit = item.split(":")
        limits[f"soak:{name}:{limit}"] = int(limit)
    keys = list(limits)

    workers = [start_worker(i, args.threads) for i in range(args.workers)]
    tickers = [start_ticker(i) for i in range(2)]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    deadline = time.time() + args.seconds
    starters = [
        context.Process(target=starter_main, args=(i, deadline, keys, args.seed, results))
        for i in range(args.starters)
    ]
    for process in starters:
        process.start()

    peaks = Peaks()
    killed = restarts = 0
    next_kill = time.monotonic() + args.kill_every if args.kill_every else float("inf")
    every = args.restart_db_every
    next_restart = time.monotonic() + every if every else float("inf")
    counts: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    try:
        while time.time() < deadline:
            peaks.sample()
            if time.monotonic() >= next_kill:
                victim = random.Random(killed).randrange(len(workers))
                workers[victim].kill()
                workers[victim].stop()
                workers[victim] = start_worker(len(workers) + killed, args.threads)
                killed += 1
                next_kill = time.monotonic() + args.kill_every
            if server is not None and time.monotonic() >= next_restart:
                server.restart()
                restarts += 1
                next_restart = time.monotonic() + every
            time.sleep(0.005)
        for _ in starters:
            _, starter_counts, starter_errors = results.get(timeout=120)
            counts.update(starter_counts)
            errors += starter_errors
        for process in starters:
            process.join(timeout=30)
        drain_started = time.monotonic()
        while active_runs() and time.monotonic() - drain_started < args.drain:
            peaks.sample()
            time.sleep(0.05)
        drained = time.monotonic() - drain_started
        report = summarise(limits, peaks, counts, errors, (killed, restarts), drained, args)
    finally:
        for child in [*workers, *tickers]:
            child.stop()
        for process in starters:
            if process.is_alive():
                process.kill()
        connection.close()
    return report


def summarise(
    limits: dict[str, int],
    peaks: Peaks,
    counts: collections.Counter[str],
    errors: list[str],
    faults: tuple[int, int],
    drained: float,
    args: argparse.Namespace,
) -> int:
    by_status = dict(sql("SELECT status, COUNT(*) FROM durable_run GROUP BY status"))
    stuck = {s: n for s, n in by_status.items() if s in ACTIVE}
    orphan_tags = sql(
        "SELECT COUNT(*) FROM durable_run_tag t LEFT JOIN durable_run r ON r.id = t.run_id "
        "WHERE r.id IS NULL"
    )[0][0]
    drifted_tags = sql(
        "SELECT COUNT(*) FROM durable_run_tag t JOIN durable_run r ON r.id = t.run_id "
        "WHERE t.status <> r.status"
    )[0][0]
    faulted = runs_failed_by_a_fault()
    over = [k for k, limit in limits.items() if max(peaks.by_run[k], peaks.by_tag[k]) > limit]

    killed, restarts = faults
    print(
        f"soak on {args.database}: {args.seconds:.0f} s, {args.starters} starters, "
        f"{args.workers} workers x {args.threads} threads, 2 tickers, "
        f"{killed} worker(s) killed with SIGKILL, {restarts} database restart(s), "
        f"{peaks.samples} samples"
    )
    print()
    print(f"{'key':<14} {'limit':>5} {'max active (runs)':>18} {'max active (tags)':>18}")
    for key, limit in limits.items():
        print(f"{key:<14} {limit:>5} {peaks.by_run[key]:>18} {peaks.by_tag[key]:>18}")
    print()
    finished = {s: n for s, n in by_status.items() if s not in ACTIVE}
    ended = sum(finished.values())
    rows = [
        ("runs started", counts["started"]),
        ("starts refused by the quota", counts["refused"]),
        ("runs cancelled", counts["cancelled"]),
        ("runs retried (refused)", f"{counts['retried']} ({counts['retry refused']})"),
        ("signals sent", counts["signalled"]),
        ("runs in the database", sum(by_status.values())),
        ("runs ended", f"{ended}  {dict(sorted(finished.items()))}"),
        ("runs failed by a fault, not their step", len(faulted)),
        ("runs stuck after the drain", f"{sum(stuck.values())}  {stuck or ''}".rstrip()),
        ("drain took (s)", f"{drained:.1f}"),
        ("tag rows without a run", orphan_tags),
        ("tag rows out of step with their run", drifted_tags),
        ("calls failed: database unavailable", counts["database unavailable"]),
        ("unexpected errors in starters", counts["errors"]),
    ]
    for label, value in rows:
        print(f"{label:<38} {value}")
    for error in errors:
        print(f"  {error}")
    for run_id, message in faulted[:5]:
        print(f"  {run_id}: {message}")
    failed = bool(faulted or over or stuck or orphan_tags or drifted_tags or counts["errors"])
    print()
    print("FAILED" if failed else "OK: never over a limit, every run ended, no orphan or drift")
    return 1 if failed else 0
