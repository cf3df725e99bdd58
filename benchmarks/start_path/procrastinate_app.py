"""Procrastinate, the PostgreSQL task queue the start benchmarks compare with: an app on a
database of its own, made anew with Procrastinate's schema, and a task that does nothing.

Needs the ``bench`` extra (``pip install -e '.[bench]'``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

#: The queue the benchmark's Procrastinate jobs go to (no worker ever takes them).
QUEUE = "durable_bench"


@dataclass
class ProcrastinateBench:
    """An open Procrastinate app and its task ``bench.noop``; :meth:`close` it at the end."""

    app: Any
    task: Any
    database: str

    def close(self) -> None:
        self.app.close()

    def job_count(self) -> int:
        with self.app.connector.pool.connection() as conn:
            row = conn.execute("SELECT count(*) FROM procrastinate_jobs").fetchone()
        return int(row[0])


def procrastinate_app(database: str = "durable_bench_procrastinate") -> ProcrastinateBench:
    """(Re)create PostgreSQL database ``database``, install Procrastinate's schema in it,
    and open an app on it with one connection, as the Django side has, on the server of
    the ``DURABLE_BENCH_HOST``/``PORT``/``USER`` environment variables."""
    import procrastinate
    from procrastinate.sync_psycopg_connector import SyncPsycopgConnector

    from benchmarks.common.database import recreate_database

    recreate_database(database)
    conninfo = (
        f"host={os.environ.get('DURABLE_BENCH_HOST', '127.0.0.1')} "
        f"port={os.environ.get('DURABLE_BENCH_PORT', '5432')} "
        f"user={os.environ.get('DURABLE_BENCH_USER', 'postgres')} dbname={database}"
    )
    app = procrastinate.App(
        connector=SyncPsycopgConnector(conninfo=conninfo, min_size=1, max_size=1)
    )

    @app.task(name="bench.noop", queue=QUEUE)
    def noop(**kwargs: Any) -> None:  # the jobs are never executed here
        return None

    app.open()
    app.schema_manager.apply_schema()
    return ProcrastinateBench(app, noop, database)
