"""Where the time of a start on a new PostgreSQL connection goes.

Run from the repository root, after ``benchmarks/start_path.py`` made its database::

    .venv/bin/python benchmarks/fresh_connection.py [--database durable_bench] [--connections 200]

For each of ``--connections`` new connections (psycopg, autocommit, as Django opens them
with ``CONN_MAX_AGE = 0``) it times, one after the other: the connection itself; the
``SET TIME ZONE 'UTC'`` Django sends on a new connection when the server's ``TimeZone``
is not literally ``UTC``; then, in separate sessions, the first and second
``durable_start_run_v1`` call, the same call after the tables were read once, and a
plain view's first and second one-row ``INSERT``. Medians in µs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

START = (
    "SELECT outcome FROM durable_start_run_v1(md5(random()::text), false, 'bench.quota', '1',"
    " 'default', '{\"tenant\": \"fresh\"}'::jsonb, ARRAY['concurrency:bench:fresh']::text[],"
    " 'durable_bench', NULL, 1, 'concurrency:bench:fresh',"
    " ARRAY['pending', 'running', 'suspended', 'blocked']::text[], 1000000, NULL)"
)
READ_TABLES = (
    "SELECT (SELECT count(*) FROM durable_run WHERE id = 'none')"
    " + (SELECT count(*) FROM durable_run_tag WHERE tag = 'none' AND status = 'pending')"
)
INSERT = (
    "INSERT INTO durable_run (id, workflow, version, namespace, status, queue, input,"
    " blocked_reason, attempt, created_at, updated_at) VALUES (md5(random()::text),"
    " 'bench.plain', '1', 'default', 'completed', 'durable_bench', '{}'::jsonb, '', 1,"
    " now(), now())"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="durable_bench")
    parser.add_argument("--connections", type=int, default=200)
    args = parser.parse_args()
    params = {
        "host": os.environ.get("DURABLE_BENCH_HOST", "127.0.0.1"),
        "port": os.environ.get("DURABLE_BENCH_PORT", "5432"),
        "user": os.environ.get("DURABLE_BENCH_USER", "postgres"),
        "dbname": args.database,
        "autocommit": True,
    }
    times: dict[str, list[float]] = {}

    def timed(label: str, action: Callable[..., Any], *arguments: Any, **options: Any) -> Any:
        began = time.perf_counter()
        result = action(*arguments, **options)
        times.setdefault(label, []).append((time.perf_counter() - began) * 1e6)
        return result

    sessions: list[list[tuple[str, str]]] = [
        [("the first start call", START), ("the second start call", START)],
        [("reading the tables first", READ_TABLES), ("then the first start call", START)],
        [("a view's first insert", INSERT), ("a view's second insert", INSERT)],
    ]
    server_zone = ""
    for number in range(args.connections):
        for statements in sessions[number % 3 :] + sessions[: number % 3]:
            with timed("connect", psycopg.connect, **params) as conn:
                server_zone = conn.info.parameter_status("TimeZone") or ""
                timed(
                    "SET TIME ZONE 'UTC' (Django, when the server's zone is not 'UTC')",
                    conn.execute,
                    "SET TIME ZONE 'UTC'",
                )
                for label, statement in statements:
                    timed(label, conn.execute, statement)
    print(f"server TimeZone {server_zone!r}; {args.connections} connections per session kind\n")
    print("| step | median µs |")
    print("| --- | ---: |")
    for label, values in times.items():
        print(f"| {label} | {statistics.median(values):.0f} |")


if __name__ == "__main__":
    main()
