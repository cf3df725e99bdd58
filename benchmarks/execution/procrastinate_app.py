"""The Procrastinate variant of ``benchmarks.execution``: one job making the three
inserts of the plain Celery task.

Procrastinate keeps its queue in PostgreSQL: its schema is in a database of the
benchmark's own (``DURABLE_BENCH_PROCRASTINATE_DB``), and the job writes to the
benchmark's table in the benchmark's database (``DURABLE_BENCH_DB``), over one
connection the worker keeps open, one autocommitted ``INSERT`` per write. Its worker
runs ``python -m procrastinate --app benchmarks.execution.procrastinate_app.app worker
--concurrency 1``; the job is a coroutine, Procrastinate's own way (a plain function
would run in a thread).
"""

from __future__ import annotations

import os
from typing import Any

import procrastinate
import psycopg

#: The table of ``benchmarks.common.execution_work`` (``TABLE``), which needs Django to import.
TABLE = "bench_exec_write"

QUEUE = "durable_bench_exec_procrastinate"


def conninfo(database: str) -> dict[str, Any]:
    return {
        "host": os.environ.get("DURABLE_BENCH_HOST", "127.0.0.1"),
        "port": os.environ.get("DURABLE_BENCH_PORT", "5432"),
        "user": os.environ.get("DURABLE_BENCH_USER", "postgres"),
        "dbname": database,
        "application_name": os.environ.get("DURABLE_BENCH_APPLICATION", "durable_bench"),
    }


app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        kwargs=conninfo(
            os.environ.get("DURABLE_BENCH_PROCRASTINATE_DB", "durable_bench_exec_procrastinate")
        )
    )
)

_connection: psycopg.AsyncConnection[Any] | None = None


async def _writes() -> psycopg.AsyncConnection[Any]:
    global _connection
    if _connection is None or _connection.closed:
        _connection = await psycopg.AsyncConnection.connect(
            **conninfo(os.environ.get("DURABLE_BENCH_DB", "durable_bench_exec")), autocommit=True
        )
    return _connection


async def write(source: str, step: int) -> dict[str, Any]:
    connection = await _writes()
    cursor = await connection.execute(
        f"INSERT INTO {TABLE} (source, step) VALUES (%s, %s) RETURNING id", [source, step]
    )
    row = await cursor.fetchone()
    assert row is not None
    return {"id": row[0], "step": step}


@app.task(name="bench.procrastinate_three_writes", queue=QUEUE)
async def procrastinate_three_writes(job_id: str) -> None:
    await write(job_id, 1)
    await write(job_id, 2)
    await write(job_id, 3)
