"""What a turn writes on the server: WAL, HOT updates, round trips and the functions' time.

Run from the repository root::

    .venv/bin/python benchmarks/turn_wal.py [--turns 500]

It starts a PostgreSQL server of its own (``initdb`` and ``postgres`` from
``DURABLE_PG_BIN``, default ``/usr/lib/postgresql/15/bin``, in a temporary directory, on a
free port; ``autovacuum`` off so that nothing else writes, ``track_functions = all``,
``fsync`` and ``full_page_writes`` off: the WAL counted is the records the statements
make, not page images nor flushes), migrates a database there and, in this process (no
broker, no worker), executes:

- **ctx.step turn**: ``--turns`` turns of ``bench.three_writes`` (three ``ctx.step``
  inserts, started under a quota beforehand; the starts are not counted);
- **floor**: ``--turns`` times the same commits with the cheapest writes, as
  ``benchmarks.execution`` defines it in ``benchmarks/common/execution_work.py``
  (``floor_three_writes``: the three inserts and the claim's, two records' and the end's
  one-row inserts).

For each it prints, per turn: the WAL records and bytes (``pg_stat_wal``, and the
distance ``pg_current_wal_lsn()`` moved), the updates of ``durable_run`` and
``durable_run_tag`` and how many were HOT (``pg_stat_user_tables``), the round trips
(libpq's protocol trace: each query string sent), the commits (``xact_commit``), and
the server time of each function called (``pg_stat_user_functions``: total time over
calls). Beside each figure of the turn stands the figure measured on the code before
the schema and function changes of this release (``BEFORE``), by this same script run
in a checkout of that code. With ``--waldump`` it also prints the turn's WAL by record
type (``pg_waldump --stats=record``), per turn. ``--alter SQL`` runs statements after the
migrations (a schema change tried before it is written as one), for comparison only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.settings")

PG_BIN = Path(os.environ.get("DURABLE_PG_BIN", "/usr/lib/postgresql/15/bin"))
DATABASE = "durable_bench_turn_wal"
FUNCTIONS = (
    ("claim", "durable_claim_run_v1"),
    ("record", "durable_record_held_step_v1"),
    ("end", "durable_transition_v1"),
    ("release trigger", "durable_quota_release_notify_v1"),
)

#: The turn's figures on the code before (main at 6455a1a, ``--turns 500``, the median of
#: three runs), per turn; the functions' in µs per call.
BEFORE: dict[str, float] = {
    "records": 52.12,
    "bytes": 4508,
    "lsn": 4604,
    "durable_run updates": 2.0,
    "durable_run HOT": 0.0,
    "durable_run_tag updates": 2.0,
    "durable_run_tag HOT": 0.0,
    "round trips": 7.0,
    "commits": 7.02,
    "claim µs": 146,
    "record µs": 44,
    "end µs": 148,
    "release trigger µs": 11,
    "claim calls": 1.0,
    "record calls": 2.0,
    "end calls": 1.0,
    "release trigger calls": 1.0,
}
#: A lease renewal's, likewise.
BEFORE_RENEWAL: dict[str, float] = {
    "records": 10.22,
    "lsn": 804,
    "durable_run updates": 1.0,
    "durable_run HOT": 0.0,
    "end µs": 84,
}
#: How many times each running run is renewed.
RENEWALS = 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=500, help="turns (and floor turns) measured")
    parser.add_argument(
        "--waldump", action="store_true", help="also print the turn's WAL by record type"
    )
    parser.add_argument(
        "--alter",
        default="",
        metavar="SQL",
        help="statements run after the migrations, before any turn: a schema change "
        "measured alone, for comparison only (docs/benchmarks.md, what a turn writes)",
    )
    return parser.parse_args()


# the server ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def as_postgres() -> dict[str, object]:
    """Run PostgreSQL's programs as ``postgres`` when this runs as root."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


@contextlib.contextmanager
def server() -> Iterator[tuple[int, Path]]:
    """A PostgreSQL server of this script's own: its port and its data directory."""
    directory = Path(tempfile.mkdtemp(prefix="durable-turn-wal-"))
    options = as_postgres()
    if options:
        shutil.chown(directory, "postgres", "postgres")
    data, port = directory / "data", free_port()
    subprocess.run(
        [
            PG_BIN / "initdb",
            "-D",
            data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-N",
            "-E",
            "UTF8",
            "--locale=C",
        ],
        check=True,
        capture_output=True,
        **options,  # type: ignore[arg-type]
    )
    settings = {
        "listen_addresses": "127.0.0.1",
        "autovacuum": "off",
        "track_functions": "all",
        "fsync": "off",
        "full_page_writes": "off",
    }
    command: list[str | Path] = [PG_BIN / "postgres", "-D", data, "-p", str(port)]
    command += ["-k", directory]
    for name, value in settings.items():
        command += ["-c", f"{name}={value}"]
    log = open(directory / "server.log", "ab")  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **options)  # type: ignore[call-overload]
    try:
        deadline = time.monotonic() + 60
        while (
            subprocess.run(
                [PG_BIN / "pg_isready", "-h", "127.0.0.1", "-p", str(port), "-t", "1"],
                capture_output=True,
            ).returncode
            != 0
        ):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((directory / "server.log").read_text())
            time.sleep(0.1)
        yield port, data
    finally:
        from django.db import connections

        connections.close_all()
        process.send_signal(signal.SIGINT)  # a fast shutdown
        process.wait(timeout=60)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


# the counters ----------------------------------------------------------------------------


def sql(statement: str, params: list | None = None) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def counters() -> dict[str, float]:
    """The server's counters now, this connection's own statistics flushed first."""
    sql("SELECT pg_stat_force_next_flush()")
    sql("SELECT pg_stat_clear_snapshot()")
    values: dict[str, float] = {}
    (records, size, lsn), *_ = sql(
        "SELECT wal_records, wal_bytes, pg_current_wal_lsn() - '0/0'::pg_lsn FROM pg_stat_wal"
    )
    values.update(records=records, bytes=float(size), lsn=float(lsn))
    for table, upd, hot in sql(
        "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE relname IN ('durable_run', 'durable_run_tag')"
    ):
        values[f"{table} updates"] = upd
        values[f"{table} HOT"] = hot
    ((commits,),) = sql(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )
    values["commits"] = commits
    for name, function in FUNCTIONS:
        rows = sql(
            "SELECT calls, total_time FROM pg_stat_user_functions WHERE funcname = %s",
            [function],
        )
        calls, total = rows[0] if rows else (0, 0.0)
        values[f"{name} calls"] = calls
        values[f"{name} ms"] = total
    return values


def lsn_text() -> str:
    ((lsn,),) = sql("SELECT pg_current_wal_lsn()::text")
    return str(lsn)


@contextlib.contextmanager
def traced(found: list[int]) -> Iterator[None]:
    """Count the query strings (and extended-protocol batches) sent meanwhile."""
    from django.db import connection
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield
        finally:
            pgconn.untrace()
        trace.flush()
        trace.seek(0)
        found.append(sum(1 for line in trace if re.match(r"F\t\d+\t(Query|Sync)\b", line)))


def measured(work, turns: int, data: Path, waldump: bool) -> dict[str, float]:
    """What ``work()`` made the server do, per turn (it runs ``turns`` turns)."""
    before, start_lsn, trips = counters(), lsn_text(), []
    with traced(trips):
        work()
    end_lsn = lsn_text()
    after = counters()
    per = {name: (after[name] - before[name]) / turns for name in after}
    per["round trips"] = trips[0] / turns
    for name, _ in FUNCTIONS:
        calls = after[f"{name} calls"] - before[f"{name} calls"]
        per[f"{name} µs"] = (
            (after[f"{name} ms"] - before[f"{name} ms"]) * 1000 / calls if calls else 0.0
        )
    if waldump:
        per["waldump"] = wal_by_type(data, start_lsn, end_lsn, turns)  # type: ignore[assignment]
    return per


def wal_by_type(data: Path, start: str, end: str, turns: int) -> list[tuple[str, float, float]]:
    """The WAL between ``start`` and ``end`` by record type: (type, records, bytes) per turn."""
    result = subprocess.run(
        [PG_BIN / "pg_waldump", "-p", data / "pg_wal", "-s", start, "-e", end, "--stats=record"],
        capture_output=True,
        text=True,
        **as_postgres(),  # type: ignore[arg-type]
    )
    rows = []
    for line in result.stdout.splitlines():
        match = re.match(r"^(\S+/\S+|\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)", line)
        if match and not line.startswith("Total"):
            rows.append((match.group(1), int(match.group(2)) / turns, int(match.group(3)) / turns))
    return sorted(rows, key=lambda row: -row[1])


# the work ------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    with server() as (port, data):
        os.environ.update(
            DURABLE_BENCH_HOST="127.0.0.1", DURABLE_BENCH_PORT=str(port), DURABLE_BENCH_DB=DATABASE
        )
        from benchmarks.common.database import set_up_django

        set_up_django(DATABASE)
        from django.utils import timezone

        import durable_django
        from benchmarks.common.execution_work import create_tables, floor_three_writes
        from benchmarks.common.execution_work import three_writes as workflow
        from durable_django import Engine

        create_tables()
        if args.alter:
            sql(args.alter)
        engine = Engine(enqueue=False)
        # warm up: the connection's caches, the functions compiled, the tables' first pages
        for index in range(20):
            handle = engine.start(workflow, {"tenant": f"t{index % 10}", "n": index})
            assert engine.execute(handle.run_id)
            floor_three_writes(uuid.uuid4().hex)
        run_ids = [
            engine.start(workflow, {"tenant": f"t{index % 10}", "n": index}).run_id
            for index in range(args.turns)
        ]
        sql("CHECKPOINT")

        def turns() -> None:
            for run_id in run_ids:
                engine.execute(run_id)

        def floors() -> None:
            for _ in range(args.turns):
                floor_three_writes(uuid.uuid4().hex)

        turn = measured(turns, args.turns, data, args.waldump)
        assert engine.count_runs(statuses=["completed"]) == args.turns + 20
        floor = measured(floors, args.turns, data, args.waldump)

        # Lease renewals, as the keeper of a long turn makes them: runs claimed (and not
        # ended), each renewed RENEWALS times in turn.
        store, owner = engine.store, "bench-worker"
        held = [
            engine.start(workflow, {"tenant": f"t{index % 10}", "n": index}).run_id
            for index in range(args.turns)
        ]
        for run_id in held:
            now = timezone.now()
            claim = {"lease_owner": owner, "lease_expires_at": now, "started_at": now}
            assert store.claim_run(run_id, **claim, wake_at=None) is not None
        sql("CHECKPOINT")

        def renewals() -> None:
            for _ in range(RENEWALS):
                for run_id in held:
                    later = timezone.now() + datetime.timedelta(seconds=60)
                    assert store.transition(
                        run_id, ["running"], "running", owner=owner, lease_expires_at=later
                    )

        renewal = measured(renewals, args.turns * RENEWALS, data, False)

    package = Path(durable_django.__file__).parent
    print(f"# What a turn writes ({args.turns} turns; package {package})")
    print()
    print("| per turn | ctx.step turn | code before | floor |")
    print("| --- | ---: | ---: | ---: |")
    rows = [
        ("WAL records", "records", 1),
        ("WAL bytes (pg_stat_wal)", "bytes", 0),
        ("WAL bytes (LSN moved)", "lsn", 0),
        ("durable_run updates", "durable_run updates", 1),
        ("of which HOT", "durable_run HOT", 1),
        ("durable_run_tag updates", "durable_run_tag updates", 1),
        ("of which HOT", "durable_run_tag HOT", 1),
        ("round trips", "round trips", 1),
        ("commits (with the counters' reads)", "commits", 1),
    ]
    rows += [(f"{name}: µs per call", f"{name} µs", 0) for name, _ in FUNCTIONS]
    rows += [(f"{name}: calls", f"{name} calls", 1) for name, _ in FUNCTIONS]
    for label, name, digits in rows:
        before = f"{BEFORE[name]:.{digits}f}" if name in BEFORE else "—"
        print(
            f"| {label} | {turn.get(name, 0.0):.{digits}f} | {before} | "
            f"{floor.get(name, 0.0):.{digits}f} |"
        )
    print()
    print(f"WAL records, turn / floor: {turn['records'] / floor['records']:.2f}")
    if args.waldump:
        for label, figures in (("ctx.step turn", turn), ("floor", floor)):
            print()
            print(f"## {label}: WAL by record type, per turn")
            print()
            print("| record | count | bytes |")
            print("| --- | ---: | ---: |")
            for kind, count, size in figures["waldump"]:  # type: ignore[union-attr]
                print(f"| {kind} | {count:.2f} | {size:.0f} |")
    print()
    print(f"## A lease renewal ({args.turns} running runs, renewed {RENEWALS} times each)")
    print()
    print("| per renewal | now | code before |")
    print("| --- | ---: | ---: |")
    renewal_rows = [
        ("WAL records", "records", 1),
        ("WAL bytes (LSN moved)", "lsn", 0),
        ("durable_run updates", "durable_run updates", 2),
        ("of which HOT", "durable_run HOT", 2),
        ("durable_transition_v1: µs per call", "end µs", 0),
    ]
    for label, name, digits in renewal_rows:
        before = f"{BEFORE_RENEWAL[name]:.{digits}f}" if name in BEFORE_RENEWAL else "—"
        print(f"| {label} | {renewal.get(name, 0.0):.{digits}f} | {before} |")
    print()
    print("BEFORE-style constants of this run:")
    print({name: round(turn[name], 2) for _, name, _ in rows})
    print({name: round(renewal[name], 2) for _, name, _ in renewal_rows})


if __name__ == "__main__":
    main()
