"""Where the time of a start on a new PostgreSQL connection goes.

Run from the repository root, after ``benchmarks.start_path`` made its database::

    .venv/bin/python benchmarks/fresh_connection.py [--database durable_bench] [--connections 200]

For each of ``--connections`` new connections (psycopg, autocommit, as Django opens them
with ``CONN_MAX_AGE = 0``) per kind of session it times, one after the other: the
connection itself; the ``SET TIME ZONE 'UTC'`` Django sends on a new connection when the
server's ``TimeZone`` is not literally ``UTC``; then, in sessions of their own, taken in
an order that rotates from connection to connection:

- the first and second ``durable_start_run_v2`` call (one quota of weight 1, as
  ``OrmStore`` sends it), and its first call after the tables were read once;
- the first and second start sent as statements (``first_start.statements``: what
  ``OrmStore`` sends for the first start on a connection), and a first
  ``durable_start_run_v2`` call after it (what a kept connection's second start pays);
- the parts of those statements on their own: the key's lock; the lock and the count;
  the run's and its tag's inserts;
- the first start as statements with one part left out, each in a session of its own:
  its override read (the declared limit in its place), its tag's insert, the triggers'
  work (``SET session_replication_role = replica`` first, which skips the foreign key
  checks a database migrated before ``0006_tag_rows_deleted_with_their_run`` makes, and
  finds none to skip after it), and its count (0 in its place); beside them the same
  first start after ``SET session_replication_role = origin``, which changes nothing, so
  that the ``SET`` itself is accounted for;
- a plain view's first and second one-row ``INSERT``.

Medians in µs. Then, on 20 more new connections, the shared buffers (hit or read, in
planning and execution: ``EXPLAIN (ANALYZE, BUFFERS)``) of a first and a second one-row
``INSERT`` into ``durable_run``: the first reads the catalogs of the table and of each of
its indexes, which the second finds cached. A count of pages, not a time, so the load of
a shared machine does not move it; run it against databases migrated by two checkouts to
compare their schemas.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KEY = "bench:fresh"
STATUSES = "ARRAY[ARRAY['pending', 'running', 'suspended', 'blocked']]::text[]"


def start_v2(run_id: str) -> str:
    return (
        f"SELECT outcome FROM durable_start_run_v2('{run_id}', false, 'bench.quota', '1',"
        " 'default', '{\"tenant\": \"fresh\"}'::jsonb, ARRAY['concurrency:bench:fresh']::text[],"
        " 'durable_bench', NULL, 1, ARRAY['bench:fresh']::text[], ARRAY[1000000]::integer[],"
        f" ARRAY[1]::integer[], {STATUSES}, NULL)"
    )


READ_TABLES = (
    "SELECT (SELECT count(*) FROM durable_run WHERE id = 'none')"
    " + (SELECT count(*) FROM durable_run_tag WHERE tag = 'none' AND status = 'pending')"
)
LOCK = f"SELECT durable_lock_quota_key_v1('{KEY}')"
COUNT = (
    "SELECT coalesce(sum(weight), 0) FROM ("
    + " UNION ALL ".join(
        f"SELECT weight FROM durable_run_tag WHERE tag = 'concurrency:{KEY}' AND status = '{s}'"
        for s in ("pending", "running", "suspended", "blocked")
    )
    + ") AS counted"
)


def view_insert(run_id: str) -> str:
    return (
        "INSERT INTO durable_run (id, workflow, version, namespace, status, queue, input,"
        f" blocked_reason, attempt, created_at, updated_at) VALUES ('{run_id}',"
        " 'bench.plain', '1', 'default', 'completed', 'durable_bench', '{}'::jsonb, '', 1,"
        " now(), now())"
    )


def both_inserts(run_id: str) -> str:
    return (
        view_insert(run_id) + "; INSERT INTO durable_run_tag (run_id, tag, status, namespace,"
        f" weight) VALUES ('{run_id}', 'concurrency:{KEY}', 'completed', 'default', 1)"
    )


def statements_maker(conn: psycopg.Connection[Any]) -> Callable[[str], str]:
    """The first start's statements as ``OrmStore`` sends them, with their values."""
    from durable_django._core.records import NewRun
    from durable_django._rules.concurrency import Quota
    from durable_django.stores.postgres.first_start import statements as start_statements

    quota = Quota(KEY, 1_000_000, ("pending", "running", "suspended", "blocked"))
    cursor = psycopg.ClientCursor(conn)

    def statements(run_id: str) -> str:
        run = NewRun(
            run_id=run_id,
            workflow="bench.quota",
            version="1",
            namespace="default",
            input={"tenant": "fresh"},
            tags=(f"concurrency:{KEY}",),
            queue="durable_bench",
        )
        sql, params = start_statements(run, (quota,), False, None)
        return cursor.mogrify(sql, params)

    return statements


def left_out(sql: str, start: str, end: str, replacement: str) -> str:
    """``sql`` with the text from ``start`` up to ``end`` (``end`` kept) replaced."""
    begin = sql.index(start)
    return sql[:begin] + replacement + sql[sql.index(end, begin) :]


def parts_left_out(statements: Callable[[str], str]) -> list[tuple[str, Callable[[str], str]]]:
    """The first start as statements with one of its parts left out, one per session."""

    def no_override(run_id: str) -> str:
        return left_out(statements(run_id), "(SELECT o.quota_limit", ", 1000000)", "NULL")

    def no_tag(run_id: str) -> str:
        return left_out(statements(run_id), ",\ntags AS (", "\nSELECT NULL, NULL", "")

    def no_count(run_id: str) -> str:
        sql = statements(run_id)
        return left_out(sql, "SELECT coalesce(sum(c.weight)", "\n),\nl1 AS", "SELECT 0 AS active")

    return [
        (
            "the first start, after SET session_replication_role = origin",
            lambda run_id: "SET session_replication_role = origin; " + statements(run_id),
        ),
        ("... without its override read", no_override),
        ("... without its tag's insert", no_tag),
        (
            "... without the tag's foreign key check, if any (replica)",
            lambda run_id: "SET session_replication_role = replica; " + statements(run_id),
        ),
        ("... without its count", no_count),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="durable_bench")
    parser.add_argument("--connections", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.settings")
    os.environ["DURABLE_BENCH_DB"] = args.database
    import django

    django.setup()
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

    def fixed(sql: str) -> Callable[[str], str]:
        return lambda run_id: sql

    quoting = psycopg.connect(**params)  # quotes the statements' values
    statements = statements_maker(quoting)
    sessions: list[list[tuple[str, Callable[[str], str]]]] = [
        [("the first v2 call", start_v2), ("the second v2 call", start_v2)],
        [("reading the tables first", fixed(READ_TABLES)), ("then the first v2 call", start_v2)],
        [
            ("the first start as statements", statements),
            ("the second start as statements", statements),
        ],
        [
            ("a first start as statements", statements),
            ("then the first v2 call (a kept connection's second start)", start_v2),
        ],
        [("the key's lock alone, first", fixed(LOCK))],
        [("the lock and the count, first", fixed(LOCK + "; " + COUNT))],
        [("the run's and the tag's inserts, first", both_inserts)],
        [("a view's first insert", view_insert), ("a view's second insert", view_insert)],
        *([part] for part in parts_left_out(statements)),
    ]
    server_zone = ""
    for number in range(args.connections):
        shift = number % len(sessions)
        for steps in sessions[shift:] + sessions[:shift]:
            with timed("connect", psycopg.connect, **params) as conn:
                server_zone = conn.info.parameter_status("TimeZone") or ""
                timed(
                    "SET TIME ZONE 'UTC' (Django, when the server's zone is not 'UTC')",
                    conn.execute,
                    "SET TIME ZONE 'UTC'",
                )
                for label, statement in steps:
                    sql = statement(f"fresh-{uuid.uuid4().hex}")
                    timed(label, conn.execute, sql)
    quoting.close()
    with psycopg.connect(**params) as conn:
        conn.execute("DELETE FROM durable_run_tag WHERE run_id LIKE 'fresh-%'")
        conn.execute("DELETE FROM durable_run WHERE id LIKE 'fresh-%'")
    print(f"server TimeZone {server_zone!r}; {args.connections} connections per session kind\n")
    print("| step | median µs |")
    print("| --- | ---: |")
    for label, values in times.items():
        print(f"| {label} | {statistics.median(values):.0f} |")
    first, second = insert_buffers(params)
    print("\n| a run's insert, new connection | median shared buffers |")
    print("| --- | ---: |")
    print(f"| first | {first:.0f} |")
    print(f"| second | {second:.0f} |")


def insert_buffers(params: dict[str, Any], connections: int = 20) -> tuple[float, float]:
    """The median shared buffers of the first and the second ``INSERT`` into
    ``durable_run`` on ``connections`` new connections, each rolled back."""
    counts: list[tuple[int, int]] = []
    for _ in range(connections):
        with psycopg.connect(**{**params, "autocommit": False}) as conn:
            made = [_buffers(conn, view_insert(f"fresh-{uuid.uuid4().hex}")) for _ in range(2)]
            conn.rollback()
        counts.append((made[0], made[1]))
    return statistics.median(c[0] for c in counts), statistics.median(c[1] for c in counts)


def _buffers(conn: psycopg.Connection[Any], statement: str) -> int:
    row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}").fetchone()
    assert row is not None
    plan = row[0][0]
    parts = (plan.get("Planning", {}), plan["Plan"])
    return sum(int(part.get(kind, 0)) for part in parts for kind in _BUFFER_KINDS)


_BUFFER_KINDS = ("Shared Hit Blocks", "Shared Read Blocks")


if __name__ == "__main__":
    main()
