"""What the benchmark scripts share: a PostgreSQL database of their own, made anew, and
Django set up on it."""

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


def set_up_django(name: str) -> None:
    """Make the database ``name`` anew (:func:`recreate_database`), point the benchmark
    settings at it (``DURABLE_BENCH_DB``), set Django up and migrate."""
    os.environ["DURABLE_BENCH_DB"] = name
    recreate_database(name)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
