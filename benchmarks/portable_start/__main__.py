"""What a quota start costs on MariaDB and on the portable path (MariaDB, SQLite) against
PostgreSQL's fast path, measured in one run.

Run from the repository root::

    .venv/bin/python -m benchmarks.portable_start [--starts 2000] [--batch 25]

Each database has a Django alias of its own (``benchmarks/portable_start/settings.py``): the
PostgreSQL and MariaDB databases ``durable_portable_bench`` (``--database``) are made
anew, the SQLite one is a new file in the temporary directory; each is migrated. Every
variant is ``engine.start`` of a workflow under one quota (limit 1,000,000), on an engine
whose store is ``OrmStore(using=alias)``, with ``ENQUEUE`` off: no message is published,
so what is measured is the database part of the start, which is what differs between the
paths. The variants:

- **a** PostgreSQL, the fast path (one call of ``durable_start_run_v2``);
- **b** MariaDB, the default store (one ``CALL`` of ``durable_start_run_mariadb_v1``);
- **c** SQLite (a file, ``IMMEDIATE`` transactions), the portable path;
- **d** PostgreSQL, the portable path (``OrmStore(fast_path=False)``);
- **e** MariaDB, the portable path (``OrmStore(fast_path=False)``).

They run in rounds, a batch of each per round in an order rotating from round to round;
the runs started are completed between rounds so the counts stay small. Each start is
timed on its own (wall clock) and each batch's client CPU is read with
``time.process_time``. Statements per start are counted with
``connection.execute_wrapper`` (every ``cursor.execute``); the transaction's
``BEGIN``/``COMMIT`` (and on MariaDB's portable path the ``autocommit`` toggles) come on
top. The ratios are of speed (starts/s of b, c, d or e over a's), the median of the
per-round ratios.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.portable_start.settings")

INPUT = {"tenant": "small", "message": "hello"}
GOAL = 0.7


def noop(ctx, input):  # the runs are never executed here
    return None


@dataclass
class Variant:
    label: str
    alias: str
    start: Callable[[], object]
    samples: list[float] = field(default_factory=list)  # µs, every start
    rounds: list[float] = field(default_factory=list)  # µs, each round's median
    cpu: list[float] = field(default_factory=list)  # µs of client CPU per start, per round
    statements: int = 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=2000, help="starts per variant")
    parser.add_argument("--batch", type=int, default=25, help="starts per variant per round")
    parser.add_argument("--database", default="durable_portable_bench", help="database name")
    parser.add_argument("--no-pg-portable", action="store_true", help="leave variant d out")
    parser.add_argument("--no-mariadb-portable", action="store_true", help="leave variant e out")
    return parser.parse_args()


def recreate_mariadb(name: str) -> None:
    import pymysql

    conn = pymysql.connect(
        host=os.environ.get("DURABLE_BENCH_MYSQL_HOST", "127.0.0.1"),
        port=int(os.environ.get("DURABLE_BENCH_MYSQL_PORT", "3306")),
        user=os.environ.get("DURABLE_BENCH_MYSQL_USER", "root"),
        autocommit=True,
    )
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def count_statements(alias: str, start: Callable[[], object]) -> int:
    """The statements one start sends through the alias's cursors."""
    from django.db import connections

    sent = 0

    def counting(execute, sql, params, many, context):
        nonlocal sent
        sent += 1
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(counting):
        start()
    return sent


def main() -> None:
    args = parse_args()
    os.environ["DURABLE_BENCH_DB"] = args.database

    from benchmarks.common.database import recreate_database

    recreate_database(args.database)
    recreate_mariadb(args.database)

    import django

    django.setup()

    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    from durable_django import Concurrency, Engine
    from durable_django._rules.registry import Registry
    from durable_django.models import Run, RunTag
    from durable_django.stores.orm import OrmStore

    sqlite_file = Path(settings.DATABASES["sqlite"]["NAME"])
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{sqlite_file}{suffix}").unlink(missing_ok=True)
    for alias in ("default", "mariadb", "sqlite"):
        call_command("migrate", database=alias, verbosity=0)

    registry = Registry()
    quota = Concurrency(key=lambda input: f"bench:{input['tenant']}", limit=1_000_000)

    def engine(alias: str, *, fast_path: bool = True) -> Engine:
        return Engine(
            store=OrmStore(using=alias, fast_path=fast_path),
            namespace="default",
            scope_reads=False,
            queue="durable_bench",
            enqueue=False,
            registry=registry,
        )

    engines = {
        "a": ("a  PostgreSQL, fast path", "default", engine("default")),
        "b": ("b  MariaDB, one CALL", "mariadb", engine("mariadb")),
        "c": ("c  SQLite file, portable", "sqlite", engine("sqlite")),
        "d": ("d  PostgreSQL, portable", "default", engine("default", fast_path=False)),
        "e": ("e  MariaDB, portable", "mariadb", engine("mariadb", fast_path=False)),
    }
    if args.no_pg_portable:
        del engines["d"]
    if args.no_mariadb_portable:
        del engines["e"]
    engines["a"][2].register("bench.quota", "1", noop, concurrency=quota)
    variants = {
        name: Variant(label, alias, lambda e=eng: e.start("bench.quota", INPUT))
        for name, (label, alias, eng) in engines.items()
    }

    def complete_runs() -> None:
        for alias in ("default", "mariadb", "sqlite"):
            Run.objects.using(alias).filter(status="pending").update(status="completed")
            RunTag.objects.using(alias).filter(status="pending").update(status="completed")

    for variant in variants.values():  # connections, lock rows, cached statements
        for _ in range(20):
            variant.start()
    for variant in variants.values():
        variant.statements = count_statements(variant.alias, variant.start)
    complete_runs()

    names = list(variants)
    rounds = max(1, -(-args.starts // args.batch))
    clock = time.perf_counter_ns
    print(f"measuring {len(names)} variants x {rounds} rounds x {args.batch} starts ...")
    began = time.perf_counter()
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            variant = variants[name]
            start = variant.start
            times = []
            gc.collect()
            gc.disable()
            try:
                cpu0 = time.process_time()
                for _ in range(args.batch):
                    t0 = clock()
                    start()
                    times.append((clock() - t0) / 1000)
                variant.cpu.append((time.process_time() - cpu0) * 1e6 / args.batch)
            finally:
                gc.enable()
            variant.samples += times
            variant.rounds.append(statistics.median(times))
        complete_runs()
    elapsed = time.perf_counter() - began

    versions = {}
    for alias in ("default", "mariadb", "sqlite"):
        connection = connections[alias]
        with connection.cursor() as cursor:
            cursor.execute("SELECT sqlite_version()" if alias == "sqlite" else "SELECT version()")
            versions[alias] = cursor.fetchone()[0].split()[0 if alias != "default" else 1]
    print()
    print(
        f"Python {platform.python_version()}, PostgreSQL {versions['default']}, "
        f"MariaDB {versions['mariadb'].split('-')[0]}, SQLite {versions['sqlite']}, "
        f"{os.cpu_count()} cores (shared); ENQUEUE off; "
        f"{rounds} rounds x {args.batch} starts per variant, measured in {elapsed:.0f} s"
    )
    print()
    header = (
        f"| {'variant':<26} | {'starts/s':>8} | {'median µs':>9} | {'CPU µs/start':>12} "
        f"| {'statements':>10} |"
    )
    print(header)
    print("| " + " | ".join("-" * (len(c) - 2) for c in header.split("|")[1:-1]) + " |")
    for variant in variants.values():
        mean = statistics.fmean(variant.samples)
        print(
            f"| {variant.label:<26} | {1e6 / mean:>8.0f} | "
            f"{statistics.median(variant.samples):>9.0f} | "
            f"{statistics.median(variant.cpu):>12.0f} | {variant.statements:>10} |"
        )
    print()
    for name in [n for n in ("b", "c", "d", "e") if n in variants]:
        per_round = [
            fast / slow
            for fast, slow in zip(variants["a"].rounds, variants[name].rounds, strict=True)
        ]
        med = statistics.median(per_round)
        q1, _, q3 = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else (med,) * 3
        verdict = f"  goal >= {GOAL}: {'met' if med >= GOAL else 'MISSED'}" if name in "bc" else ""
        extra = statistics.median(variants[name].cpu) - statistics.median(variants["a"].cpu)
        print(
            f"speed {name}/a = {med:.3f}  (per-round IQR {q1:.3f}-{q3:.3f}; "
            f"CPU {extra:+.0f} µs/start vs a){verdict}"
        )
    complete_runs()


if __name__ == "__main__":
    main()
