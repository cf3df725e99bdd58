"""The work the variants of ``benchmarks.execution`` do: three small database writes
(also executed by ``benchmarks/instrumentation.py`` and ``benchmarks/turn_wal.py``).

- **durable**: ``three_writes``, a workflow of three ``ctx.step`` calls, each inserting one
  row and returning a small JSON value; its runs are started under a quota (one key per
  tenant, a limit never reached), as the project's runs are.
- **transactional**: ``three_transactions``, the same workflow with ``ctx.transaction``
  steps: each insert commits with its step's record.
- **plain**: ``plain_three_writes``, a Celery task making the same three inserts.
- **floor**: ``floor_three_writes``, the plain task plus, in the same order, the commits a
  durable turn adds, each the cheapest write there is (a one-row insert without a
  function, a lock or a check): the claim's (not waiting for the disk), two step
  records' and the end of the turn's. No design that commits as often can beat it.

Both write through the Django connection of the worker, one autocommitted ``INSERT`` per
write.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import connection

from durable_django import Concurrency, workflow

#: The table the variants write to (made by :func:`create_tables`).
TABLE = "bench_exec_write"
#: The floor variant's stand-ins for the bookkeeping go here.
FLOOR_TABLE = "bench_exec_floor"
PLAIN_QUEUE = "durable_bench_exec_plain"
FLOOR_QUEUE = "durable_bench_exec_floor"
TENANTS = 10


def create_tables() -> None:
    """Create the tables the variants write to, ``TABLE`` and ``FLOOR_TABLE``."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, source text NOT NULL, "
            f"step integer NOT NULL, written_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor.execute(
            f"CREATE TABLE {FLOOR_TABLE} (id bigserial PRIMARY KEY, source text NOT NULL, "
            f"kind text NOT NULL, written_at timestamptz NOT NULL DEFAULT now())"
        )


def write(source: str, step: int) -> dict[str, Any]:
    """Insert one row; return its id and the step, as a small JSON value."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (source, step) VALUES (%s, %s) RETURNING id", [source, step]
        )
        return {"id": cursor.fetchone()[0], "step": step}


def tenant_key(input: dict[str, Any]) -> str:
    return f"bench:{input['tenant']}"


@workflow(name="bench.three_writes", concurrency=Concurrency(key=tenant_key, limit=1_000_000))
def three_writes(ctx, input):
    first = ctx.step("first", write, ctx.run_id, 1)
    second = ctx.step("second", write, ctx.run_id, 2)
    third = ctx.step("third", write, ctx.run_id, 3)
    return {"ids": [first["id"], second["id"], third["id"]]}


@workflow(name="bench.three_transactions", concurrency=Concurrency(key=tenant_key, limit=1_000_000))
def three_transactions(ctx, input):
    first = ctx.transaction("first", write, ctx.run_id, 1)
    second = ctx.transaction("second", write, ctx.run_id, 2)
    third = ctx.transaction("third", write, ctx.run_id, 3)
    return {"ids": [first["id"], second["id"], third["id"]]}


@shared_task(name="bench.plain_three_writes", ignore_result=True, serializer="json")
def plain_three_writes(job_id: str) -> None:
    write(job_id, 1)
    write(job_id, 2)
    write(job_id, 3)


def commit_like(source: str, kind: str, *, synchronous: bool = True) -> None:
    """One autocommitted one-row insert, standing for one bookkeeping statement."""
    if synchronous:
        statement = f"INSERT INTO {FLOOR_TABLE} (source, kind) VALUES (%s, %s)"
    else:
        # As the claim does: this transaction's commit does not wait for the disk.
        statement = (
            "WITH async AS (SELECT set_config('synchronous_commit', 'off', true)) "
            f"INSERT INTO {FLOOR_TABLE} (source, kind) SELECT %s, %s FROM async"
        )
    with connection.cursor() as cursor:
        cursor.execute(statement, [source, kind])


@shared_task(name="bench.floor_three_writes", ignore_result=True, serializer="json")
def floor_three_writes(job_id: str) -> None:
    commit_like(job_id, "claim", synchronous=False)
    write(job_id, 1)
    commit_like(job_id, "record")
    write(job_id, 2)
    commit_like(job_id, "record")
    write(job_id, 3)
    commit_like(job_id, "end")
