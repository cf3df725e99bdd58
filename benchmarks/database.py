"""What the benchmark scripts share: a PostgreSQL database of their own, made anew."""

from __future__ import annotations

import os


def recreate_database(name: str) -> None:
    """Drop the database ``name`` (forcing its connections off) and create it empty.

    The server comes from the ``DURABLE_BENCH_HOST``/``PORT``/``USER`` environment
    variables (default ``postgres`` on 127.0.0.1:5432).
    """
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=os.environ.get("DURABLE_BENCH_HOST", "127.0.0.1"),
        port=os.environ.get("DURABLE_BENCH_PORT", "5432"),
        user=os.environ.get("DURABLE_BENCH_USER", "postgres"),
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
