"""What a start costs: the plain start, the quota-checked start, the quota-checked
start on a key with a long finished history, a start under three quotas, a weighted
start, a start under a rate limit (on a fresh key and on one with a long history), side
by side, against a plain view's insert and ``.delay()`` (on a kept and on a
new connection) and Procrastinate's ``defer``; then batches of starts (``dispatch_many``)
against Procrastinate's ``batch_defer``.

Run from the repository root::

    .venv/bin/python -m benchmarks.start_path [--starts 2000] [--history 1000000]
    .venv/bin/python -m benchmarks.start_path --batches-only [--batch-size 100]
    .venv/bin/python -m benchmarks.start_path --variants b,view,bF,bF2,viewF [--history 0]
    .venv/bin/python -m benchmarks.start_path --variants b,bi,view,bS,biS,viewS,bO,biO,viewO

The rows ending in S run with sentry-sdk's Celery integration on (every transaction
sampled, sent nowhere), those ending in O with OpenTelemetry's Celery instrumentation
(spans exported to nowhere, in batches); each start (and each view) in a transaction or
span of its own, as a request's. Their messages go through ``apply_async`` in the
caller's context, so that the worker continues the trace.

The batch section needs the ``bench`` extra (Procrastinate); without it, it is skipped.

It (re)creates the PostgreSQL database ``durable_bench`` (``--database``), migrates it,
gives one quota key ``--history`` completed runs (inserted with ``generate_series``, then
``VACUUM ANALYZE``), and publishes every start's Celery message to a real Redis broker
(``redis://127.0.0.1:6379/14``, queue ``durable_bench``, purged before and after). The
Procrastinate row (the ``bench`` extra) has a database of its own,
``durable_bench_procrastinate`` (``--procrastinate-database``, '' to leave it out).

The variants are measured in rounds: each round runs a batch of every variant, in an
order that rotates from round to round, and the runs started under a quota are completed
between rounds so the active count stays small. Every start is timed on its own; the
table shows the median and mean per variant over all rounds, and the ratios are the
medians of the per-round ratios (the machine is shared, so compare rows, not absolutes).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.settings")

if TYPE_CHECKING:
    from benchmarks.start_path.procrastinate_app import ProcrastinateBench

QUEUE = "durable_bench"
INPUT_SMALL = {"tenant": "small", "message": "hello"}
INPUT_HISTORY = {"tenant": "history", "message": "hello"}
HISTORY_TAG = "concurrency:bench:history"
#: The rate limit's tag of the history key: its runs' rows, all outside the window.
RATE_HISTORY_TAG = "rate:bench:history"
#: The rate limit's window, in seconds: short, so that a window holds the starts of the
#: last moment only, as a limit of a few hundred per minute would.
RATE_PER = 1.0
SMALL_TAG = "concurrency:bench:small"
#: The keys of the start under three quotas, and of the weighted start.
MULTI_KEYS = ["bench:multi:tenant", "bench:multi:user", "bench:multi:gpu"]
WEIGHTED_KEY = "bench:weighted"
QUOTA_TAGS = [
    SMALL_TAG,
    HISTORY_TAG,
    *(f"concurrency:{key}" for key in [*MULTI_KEYS, WEIGHTED_KEY]),
]
ACTIVE = ["pending", "running", "suspended", "blocked"]


def tenant_key(input: dict) -> str:
    return f"bench:{input['tenant']}"


def noop(ctx, input):  # the runs are never executed here
    return None


@dataclass
class Variant:
    label: str
    start: Callable[[], object]
    samples: list[float] = field(default_factory=list)  # µs, every start
    rounds: list[float] = field(default_factory=list)  # µs, each round's median
    #: What the variant's starts run under (an instrumentation switched on).
    around: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext


@contextlib.contextmanager
def sentry_on() -> Iterator[None]:
    """sentry-sdk with its Celery integration, every transaction sampled, sent nowhere."""
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration
    from sentry_sdk.transport import Transport

    class Nowhere(Transport):
        def capture_envelope(self, envelope: object) -> None:
            pass

    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=Nowhere(),
        integrations=[CeleryIntegration()],
        default_integrations=False,
        auto_enabling_integrations=False,
        traces_sample_rate=1.0,
    )
    try:
        yield
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.init(default_integrations=False, auto_enabling_integrations=False)


def in_sentry_transaction(start: Callable[[], object]) -> Callable[[], object]:
    def traced() -> object:
        import sentry_sdk

        with sentry_sdk.start_transaction(op="http.server", name="bench"):
            return start()

    return traced


_tracer_provider = None


@contextlib.contextmanager
def otel_on() -> Iterator[None]:
    """OpenTelemetry's Celery instrumentation, its spans exported in batches to nowhere."""
    global _tracer_provider
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Nowhere(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if _tracer_provider is None:
        _tracer_provider = TracerProvider()
        _tracer_provider.add_span_processor(BatchSpanProcessor(Nowhere()))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=_tracer_provider)
    try:
        yield
    finally:
        instrumentor.uninstrument()


def in_otel_span(start: Callable[[], object]) -> Callable[[], object]:
    def traced() -> object:
        assert _tracer_provider is not None
        with _tracer_provider.get_tracer("bench").start_as_current_span("bench"):
            return start()

    return traced


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=2000, help="starts per variant")
    parser.add_argument("--batch", type=int, default=25, help="starts per variant per round")
    parser.add_argument(
        "--history", type=int, default=1_000_000, help="completed runs under the history key"
    )
    parser.add_argument("--database", default="durable_bench", help="PostgreSQL database")
    parser.add_argument(
        "--reuse", action="store_true", help="keep an existing database and its history"
    )
    parser.add_argument(
        "--procrastinate-database",
        default="durable_bench_procrastinate",
        help="PostgreSQL database of the Procrastinate rows, made anew ('' to leave them out)",
    )
    parser.add_argument("--batch-size", type=int, default=100, help="runs per batch")
    parser.add_argument("--batches", type=int, default=60, help="batches per batch variant")
    parser.add_argument(
        "--batches-only", action="store_true", help="measure the batches alone (no history)"
    )
    parser.add_argument(
        "--variants",
        default="",
        help="the names of the variants to measure, comma-separated (default: every one),"
        " e.g. b,view,bF,bF2,viewF; the batches are then left out",
    )
    return parser.parse_args()


def insert_history(count: int) -> None:
    """``count`` completed runs under the history key, in two set-based statements."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM durable_run_tag WHERE tag = %s", [HISTORY_TAG])
        have = cursor.fetchone()[0]
        if have < count:
            cursor.execute(
                """
                INSERT INTO durable_run (
                    id, workflow, version, namespace, status, queue, input, output, error,
                    parent_id, blocked_reason, attempt, created_at, updated_at, started_at,
                    finished_at)
                SELECT 'history-' || g, 'bench.quota', '1', 'default', 'completed', %s,
                    '{"tenant": "history"}'::jsonb, 'null'::jsonb, NULL, NULL, '', 1,
                    now() - (g || ' seconds')::interval, now() - (g || ' seconds')::interval,
                    now() - (g || ' seconds')::interval, now() - (g || ' seconds')::interval
                FROM generate_series(%s, %s) AS g
                """,
                [QUEUE, have + 1, count],
            )
            cursor.execute(
                """
                INSERT INTO durable_run_tag (run_id, tag, status, namespace)
                SELECT 'history-' || g, %s, 'completed', 'default'
                FROM generate_series(%s, %s) AS g
                """,
                [HISTORY_TAG, have + 1, count],
            )
        cursor.execute("SELECT count(*) FROM durable_run_tag WHERE tag = %s", [RATE_HISTORY_TAG])
        have = cursor.fetchone()[0]
        if have < count:
            # The same runs under the rate limit's key, created an hour and more ago.
            cursor.execute(
                """
                INSERT INTO durable_run_tag (run_id, tag, status, namespace, created_at)
                SELECT 'history-' || g, %s, 'completed', 'default',
                    now() - ((g + 3600) || ' seconds')::interval
                FROM generate_series(%s, %s) AS g
                """,
                [RATE_HISTORY_TAG, have + 1, count],
            )
        cursor.execute("VACUUM ANALYZE durable_run")
        cursor.execute("VACUUM ANALYZE durable_run_tag")


def complete_quota_runs() -> None:
    """Complete the runs started under the quota keys, as workers would."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE durable_run SET status = 'completed', finished_at = now(), updated_at = now()
            WHERE status = 'pending' AND id IN (
                SELECT run_id FROM durable_run_tag WHERE tag = ANY(%s) AND status = 'pending')
            """,
            [QUOTA_TAGS],
        )
        cursor.execute(
            "UPDATE durable_run_tag SET status = 'completed' "
            "WHERE tag = ANY(%s) AND status = 'pending'",
            [QUOTA_TAGS],
        )


def purge_queue(app) -> int:
    with app.connection_for_write() as conn:
        return conn.default_channel.queue_purge(QUEUE) or 0


def settled(times: list[float]) -> list[float]:
    """``times`` (µs) with the wait for the sender thread to send what they handed over
    shared out among them: a start's message sent in the background costs the client
    what overlaps with its next starts (in their times) and what is left (this wait)."""
    from durable_django._runtime import sending

    t0 = time.perf_counter_ns()
    sending.flush()
    share = (time.perf_counter_ns() - t0) / 1000 / len(times)
    return [t + share for t in times]


def count_round_trips(start: Callable[[], object]) -> tuple[int, int]:
    """(PostgreSQL, Redis) round trips of one start: libpq's protocol trace, redis writes."""
    import redis.connection
    from django.db import connection
    from psycopg import pq

    from durable_django._runtime import sending

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sends = 0
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        nonlocal sends
        sends += 1
        return original(self, command, check_health)

    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        redis.connection.AbstractConnection.send_packed_command = counting
        try:
            start()
            sending.flush()  # the sender thread's sends count too
        finally:
            redis.connection.AbstractConnection.send_packed_command = original
            if connection.connection is not None and connection.connection.pgconn is pgconn:
                pgconn.untrace()
        trace.flush()
        trace.seek(0)
        # Each simple Query, or each Sync closing an extended-protocol batch, is one trip.
        pg = sum(1 for line in trace if re.match(r"F\t\d+\t(Query|Sync)\b", line))
    return pg, sends


def message_bytes(app, start: Callable[[], object]) -> int:
    """The bytes of the Celery messages one call of ``start`` leaves on the Redis queue
    (every priority's list), as the broker stores them."""
    import redis

    from durable_django._runtime import sending

    sending.flush()
    purge_queue(app)
    start()
    sending.flush()
    client = redis.Redis.from_url(app.conf.broker_url)
    try:
        keys = client.keys(f"{QUEUE}*")
        total = sum(len(raw) for key in keys for raw in client.lrange(key, 0, -1))
    finally:
        client.close()
    purge_queue(app)
    return total


def explain_count(history: int, start: Callable[[], object]) -> str:
    """The plans ``durable_start_run_v2`` uses for the count during one start on the history
    key, captured with ``auto_explain``; a plain EXPLAIN of the same statement without it."""
    from django.db import connection
    from django.db.utils import DatabaseError

    out = [f"-- the quota count on the key with {history:,} completed runs"]
    connection.ensure_connection()
    notices: list[str] = []
    pgconn = connection.connection
    try:
        with connection.cursor() as cursor:
            cursor.execute("LOAD 'auto_explain'")
    except DatabaseError:
        with connection.cursor() as cursor:
            for status in ACTIVE:
                cursor.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT count(*) FROM durable_run_tag t "
                    "WHERE t.tag = %s AND t.status = %s",
                    [HISTORY_TAG, status],
                )
                out += [row[0] for row in cursor.fetchall()]
    else:
        settings = {
            "log_min_duration": "0",
            "log_nested_statements": "on",
            "log_analyze": "on",
            "log_buffers": "on",
            "log_level": "notice",
        }

        def keep(diagnostic) -> None:
            notices.append(diagnostic.message_primary or "")

        with connection.cursor() as cursor:
            for name, value in settings.items():
                cursor.execute(f"SET auto_explain.{name} = {value}")
        pgconn.add_notice_handler(keep)
        try:
            start()
        finally:
            pgconn.remove_notice_handler(keep)
            with connection.cursor() as cursor:
                cursor.execute("SET auto_explain.log_min_duration = -1")
        out.append("-- as run inside durable_start_run_v2 by one start (auto_explain):")
        for notice in notices:
            if "FROM durable_run_tag t" in notice and "sum(counted.weight)" in notice:
                lines = notice.splitlines()
                plan = lines[lines.index(next(x for x in lines if x.startswith("Aggregate"))) :]
                out.append(lines[0].strip())
                out += plan
    with connection.cursor() as cursor:
        # The first start function counted with one `status = ANY(...)`: its plan on the
        # key whose finished runs all came after the last ANALYZE (the b variant's key).
        cursor.execute(
            "SELECT count(*) FROM durable_run_tag WHERE tag = %s AND status = 'completed'",
            [SMALL_TAG],
        )
        finished = cursor.fetchone()[0]
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT count(*) FROM durable_run_tag t "
            "WHERE t.tag = %s AND t.status = ANY(%s)",
            [SMALL_TAG, ACTIVE],
        )
        out.append(
            f"-- for comparison, the single `status = ANY(...)` count of the first function on "
            f"{SMALL_TAG!r}, whose {finished:,} completed runs came after the last ANALYZE:"
        )
        out += [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT pg_size_pretty(pg_relation_size('durable_tag_count_idx')), "
            "pg_size_pretty(pg_relation_size('durable_run_tag'))"
        )
        index_size, table_size = cursor.fetchone()
    out.append(f"-- durable_tag_count_idx: {index_size}; durable_run_tag: {table_size}")
    return "\n".join(out)


def open_procrastinate(database: str) -> ProcrastinateBench | None:
    """The Procrastinate app of the ``defer`` and ``batch_defer`` rows, on ``database``
    made anew (:func:`benchmarks.start_path.procrastinate_app.procrastinate_app`); ``None`` when
    ``database`` is '' or Procrastinate is not installed (the ``bench`` extra)."""
    if not database:
        return None
    try:
        from benchmarks.start_path.procrastinate_app import procrastinate_app

        return procrastinate_app(database)
    except ImportError:
        print("Procrastinate rows skipped: Procrastinate is not installed (the bench extra)")
        return None


def measure_batches(
    args: argparse.Namespace,
    fast,
    portable,
    fast_no_publish,
    bench: ProcrastinateBench | None,
    inline,
) -> None:
    """Batches of ``--batch-size`` starts under one quota key: ``dispatch_many`` (one call
    of ``durable_start_runs_v2``, the messages sent together on commit) against
    Procrastinate's ``batch_defer`` (one INSERT of the jobs, in a database of its own),
    against as many single starts, and beside the publish of as many messages alone.
    Measured in rounds like the starts; the ratio is the median of the per-round ratios of
    runs per second. Beside each, the bytes of the messages a batch leaves on the Redis
    queue, per run."""
    if bench is None:
        print("batches skipped: no Procrastinate app (the bench extra, --procrastinate-database)")
        return
    from celery import current_app

    from durable_django._runtime.publishing import RunMessage, publish_runs

    app = current_app._get_current_object()
    size = args.batch_size
    inputs = [{**INPUT_SMALL, "n": n} for n in range(size)]
    messages = [RunMessage(uuid.uuid4().hex, QUEUE, "bench.quota") for _ in range(size)]

    def loop() -> None:
        for input in inputs:
            fast.start("bench.quota", input)

    variants = {
        "dm": Variant("dispatch_many, quota", lambda: fast.start_many("bench.quota", inputs)),
        "dmi": Variant(
            "   dispatch_many, sent inline",
            lambda: inline.start_many("bench.quota", inputs),
        ),
        "pt": Variant(
            "   portable: dispatch_many", lambda: portable.start_many("bench.quota", inputs)
        ),
        "np": Variant(
            "   no publish: dispatch_many",
            lambda: fast_no_publish.start_many("bench.quota", inputs),
        ),
        "loop": Variant(f"   {size} x start, quota", loop),
        "pub": Variant(f"   {size} messages' publish alone", lambda: publish_runs(messages)),
        "proc": Variant("Procrastinate batch_defer", lambda: bench.task.batch_defer(*inputs)),
    }
    for variant in variants.values():
        for _ in range(3):
            variant.start()
    complete_quota_runs()
    trips = {n: count_round_trips(v.start) for n, v in variants.items() if n != "proc"}
    sizes = {n: message_bytes(app, v.start) / size for n, v in variants.items() if n != "proc"}
    complete_quota_runs()
    names = list(variants)
    per_round = 3
    rounds = max(1, -(-args.batches // per_round))
    print(
        f"measuring {len(names)} batch variants x {rounds} rounds x {per_round} batches "
        f"of {size} ...",
        flush=True,
    )
    clock = time.perf_counter_ns
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            variant = variants[name]
            times = []
            gc.collect()
            gc.disable()
            try:
                for _ in range(per_round):
                    t0 = clock()
                    variant.start()
                    times.append((clock() - t0) / 1000)
                times = settled(times)
            finally:
                gc.enable()
            variant.samples += times
            variant.rounds.append(statistics.median(times))
        complete_quota_runs()
    jobs = bench.job_count()

    print()
    print(f"batches of {size} runs; {rounds} rounds x {per_round} batches per variant")
    print()
    header = (
        f"| {'variant':<30} | {'runs/s':>7} | {'ms/batch':>8} | {'median ms':>9} "
        f"| {'PG trips':>8} | {'Redis trips':>11} | {'msg bytes/run':>13} |"
    )
    print(header)
    print("| " + " | ".join("-" * (len(c) - 2) for c in header.split("|")[1:-1]) + " |")
    for name, variant in variants.items():
        mean = statistics.fmean(variant.samples)
        pg, rd = trips.get(name, ("n/a", "n/a"))
        sent = f"{sizes[name]:.0f}" if name in sizes else "n/a"
        print(
            f"| {variant.label:<30} | {size * 1e6 / mean:>7.0f} | {mean / 1000:>8.2f} "
            f"| {statistics.median(variant.samples) / 1000:>9.2f} | {pg:>8} | {rd:>11} "
            f"| {sent:>13} |"
        )
    print()
    for top, bottom, goal in (
        ("dm", "proc", 1.0),
        ("dmi", "proc", None),
        ("np", "proc", None),
        ("dm", "loop", None),
    ):
        # runs per second of top over bottom: bottom's time over top's, round by round
        per_round_ratios = [
            b / t for t, b in zip(variants[top].rounds, variants[bottom].rounds, strict=True)
        ]
        med = statistics.median(per_round_ratios)
        lo, _, hi = (
            statistics.quantiles(per_round_ratios, n=4)
            if len(per_round_ratios) > 1
            else (med, med, med)
        )
        verdict = f"  goal >= {goal}x: {'met' if med >= goal else 'MISSED'}" if goal else ""
        print(
            f"runs/s {variants[top].label.strip()} / {variants[bottom].label.strip()} = "
            f"{med:.2f}x  (per-round IQR {lo:.2f}-{hi:.2f}){verdict}"
        )
    print(f"({jobs:,} Procrastinate jobs in {bench.database!r})")
    print()


def main() -> None:
    args = parse_args()
    os.environ["DURABLE_BENCH_DB"] = args.database
    if not args.reuse:
        from benchmarks.common.database import recreate_database

        recreate_database(args.database)

    import django

    django.setup()

    from celery import Celery
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    from durable_django import Concurrency, Engine, RateLimit
    from durable_django._rules.registry import Registry
    from durable_django._runtime.publishing import publish_run
    from durable_django.engines import send_run
    from durable_django.models import Run, RunTag
    from durable_django.stores.orm import OrmStore
    from durable_django.tasks import execute_run

    app = Celery("durable_bench", set_as_current=True)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.task_default_queue = QUEUE  # where a plain task's .delay() goes

    @app.task(name="bench.plain_task", ignore_result=True)
    def plain_task(run_id: str) -> None:  # never executed here
        return None

    class CelerySendEngine(Engine):
        """The engine as it sent before the lean publish: Celery's ``apply_async``."""

        def send(self, run_id: str, queue: str, **_: object) -> None:
            self.store.on_commit(
                lambda: execute_run.apply_async((run_id,), queue=queue, serializer="json")
            )

    call_command("migrate", verbosity=0)
    if not args.batches_only:
        began = time.perf_counter()
        insert_history(args.history)
        print(
            f"history: {args.history:,} completed runs under {HISTORY_TAG!r} "
            f"ready in {time.perf_counter() - began:.1f} s",
            flush=True,
        )
    complete_quota_runs()
    purged = purge_queue(app)

    registry = Registry()
    quota = Concurrency(key=tenant_key, limit=1_000_000)
    three = [Concurrency(key=lambda i, key=key: key, limit=1_000_000) for key in MULTI_KEYS]
    weighted = Concurrency(key=lambda i: WEIGHTED_KEY, limit=1_000_000, weight=lambda i: 3)
    rate = RateLimit(key=tenant_key, limit=1_000_000, per=RATE_PER)

    def engine(
        *, fast_path: bool = True, enqueue: bool = True, store=None, publish: str = "background"
    ) -> Engine:
        return Engine(
            store=store or OrmStore(fast_path=fast_path),
            namespace="default",
            scope_reads=False,
            queue=QUEUE,
            enqueue=enqueue,
            publish=publish,
            registry=registry,
        )

    fast, portable, fast_no_publish = engine(), engine(fast_path=False), engine(enqueue=False)
    inline = engine(publish="inline")
    celery_send = CelerySendEngine(
        store=OrmStore(), namespace="default", scope_reads=False, queue=QUEUE, registry=registry
    )

    class FunctionFirst(OrmStore):
        """The start before the first start on a connection was sent as statements: the
        function's call, its first in the server process on a new connection."""

        def _start_on_postgresql(self, run, quotas, check_existing, read_namespace):
            from durable_django.stores.postgres import first_start

            connection.ensure_connection()
            first_start._STARTED.add(connection.connection)
            return super()._start_on_postgresql(run, quotas, check_existing, read_namespace)

    function_first = engine(store=FunctionFirst())
    fast.register("bench.plain", "1", noop, tags=["bench"])
    fast.register("bench.quota", "1", noop, concurrency=quota)
    fast.register("bench.three", "1", noop, concurrency=three)
    fast.register("bench.weighted", "1", noop, concurrency=weighted)
    fast.register("bench.rate", "1", noop, rate_limit=rate)

    def raw_orm() -> None:
        run_id = uuid.uuid4().hex
        now = timezone.now()
        with transaction.atomic():
            Run.objects.create(
                id=run_id,
                workflow="bench.plain",
                version="1",
                namespace="default",
                status="pending",
                queue=QUEUE,
                input=INPUT_SMALL,
                created_at=now,
                updated_at=now,
            )
            RunTag.objects.create(run_id=run_id, tag="bench", status="pending", namespace="default")
            transaction.on_commit(lambda: send_run(run_id, QUEUE))

    def publish_only() -> None:
        execute_run.apply_async((uuid.uuid4().hex,), queue=QUEUE, serializer="json")

    def lean_publish_only() -> None:
        publish_run(uuid.uuid4().hex, QUEUE)

    def view() -> None:
        """What a plain view does: insert a row (autocommit) and ``.delay()`` a task."""
        now = timezone.now()
        run = Run.objects.create(
            id=uuid.uuid4().hex,
            workflow="bench.plain",
            version="1",
            namespace="default",
            status="completed",
            queue=QUEUE,
            input=INPUT_SMALL,
            created_at=now,
            updated_at=now,
        )
        plain_task.delay(run.id)

    def fresh(start: Callable[[], object]) -> Callable[[], object]:
        """``start`` on a new connection, as with ``CONN_MAX_AGE = 0``."""

        def on_a_new_connection() -> object:
            connection.close()
            return start()

        return on_a_new_connection

    def dispatch_quota() -> object:
        return fast.start("bench.quota", INPUT_SMALL)

    closers: list[Callable[[], None]] = []

    variants = {
        "a": Variant("a  start, no quota", lambda: fast.start("bench.plain", INPUT_SMALL)),
        "b": Variant("b  start, quota", lambda: fast.start("bench.quota", INPUT_SMALL)),
        "c": Variant(
            "c  start, quota, 1M-history key", lambda: fast.start("bench.quota", INPUT_HISTORY)
        ),
        "m": Variant("m  start, 3 quotas", lambda: fast.start("bench.three", INPUT_SMALL)),
        "r": Variant("r  start, rate limit", lambda: fast.start("bench.rate", INPUT_SMALL)),
        "rh": Variant(
            "rh start, rate limit, 1M-history key",
            lambda: fast.start("bench.rate", INPUT_HISTORY),
        ),
        "pr": Variant("   portable: rate limit", lambda: portable.start("bench.rate", INPUT_SMALL)),
        "w": Variant(
            "w  start, quota, weight 3", lambda: fast.start("bench.weighted", INPUT_SMALL)
        ),
        "pa": Variant("   portable: no quota", lambda: portable.start("bench.plain", INPUT_SMALL)),
        "pb": Variant("   portable: quota", lambda: portable.start("bench.quota", INPUT_SMALL)),
        "pc": Variant(
            "   portable: quota, 1M history",
            lambda: portable.start("bench.quota", INPUT_HISTORY),
        ),
        "pm": Variant("   portable: 3 quotas", lambda: portable.start("bench.three", INPUT_SMALL)),
        "pw": Variant(
            "   portable: quota, weight 3", lambda: portable.start("bench.weighted", INPUT_SMALL)
        ),
        "raw": Variant("   raw ORM: Run + RunTag + publish", raw_orm),
        "bi": Variant(
            "   b, its message sent inline",
            lambda: inline.start("bench.quota", INPUT_SMALL),
        ),
        "bt": Variant(
            "   b with Celery's apply_async publish",
            lambda: celery_send.start("bench.quota", INPUT_SMALL),
        ),
        "pub": Variant("   Celery apply_async alone", publish_only),
        "lean": Variant("   lean publish alone", lean_publish_only),
        "view": Variant("   view: Model.objects.create + .delay()", view),
        "bF": Variant("   fresh connection: b", fresh(dispatch_quota)),
        "bF2": Variant(
            "   fresh connection: b, function first",
            fresh(lambda: function_first.start("bench.quota", INPUT_SMALL)),
        ),
        "viewF": Variant("   fresh connection: view", fresh(view)),
        "bS": Variant("   Sentry on: b", in_sentry_transaction(dispatch_quota), around=sentry_on),
        "biS": Variant(
            "   Sentry on: bi",
            in_sentry_transaction(lambda: inline.start("bench.quota", INPUT_SMALL)),
            around=sentry_on,
        ),
        "viewS": Variant("   Sentry on: view", in_sentry_transaction(view), around=sentry_on),
        "bO": Variant("   OTel on: b", in_otel_span(dispatch_quota), around=otel_on),
        "biO": Variant(
            "   OTel on: bi",
            in_otel_span(lambda: inline.start("bench.quota", INPUT_SMALL)),
            around=otel_on,
        ),
        "viewO": Variant("   OTel on: view", in_otel_span(view), around=otel_on),
        "na": Variant(
            "   no publish: no quota", lambda: fast_no_publish.start("bench.plain", INPUT_SMALL)
        ),
        "nb": Variant(
            "   no publish: quota", lambda: fast_no_publish.start("bench.quota", INPUT_SMALL)
        ),
        "nc": Variant(
            "   no publish: quota, 1M history",
            lambda: fast_no_publish.start("bench.quota", INPUT_HISTORY),
        ),
    }
    bench = open_procrastinate(args.procrastinate_database)
    if bench is not None:
        closers.append(bench.close)
    if args.batches_only:
        measure_batches(args, fast, portable, fast_no_publish, bench, inline)
        purged += purge_queue(app)
        for close in closers:
            close()
        print(f"purged {purged} messages from Redis queue {QUEUE!r}")
        return
    if bench is not None:
        task = bench.task
        variants["defer"] = Variant(
            "   Procrastinate defer (sync)", lambda: task.defer(**INPUT_SMALL)
        )
    if args.variants:
        chosen = args.variants.split(",")
        unknown = set(chosen) - set(variants)
        if unknown:
            raise SystemExit(f"unknown variants {sorted(unknown)}; known: {list(variants)}")
        variants = {name: variants[name] for name in chosen}
    if args.history != 1_000_000 and "c" in variants:
        label = f"{args.history:,}-history"
        for name, text in (
            ("c", f"c  start, quota, {label} key"),
            ("pc", f"   portable: quota, {label}"),
            ("nc", f"   no publish: quota, {label}"),
        ):
            if name in variants:
                variants[name].label = text

    # Warm up: connections, Celery's producer pool and queue declaration, cached plans.
    for variant in variants.values():
        with variant.around():
            for _ in range(20):
                variant.start()
    complete_quota_runs()
    trips = {}
    for name, variant in variants.items():
        with variant.around():
            trips[name] = count_round_trips(variant.start)
    untraced = {"bF", "bF2", "viewF", "defer"}  # on a connection the trace does not follow
    complete_quota_runs()

    names = list(variants)
    rounds = max(1, -(-args.starts // args.batch))
    clock = time.perf_counter_ns
    print(
        f"measuring {len(names)} variants x {rounds} rounds x {args.batch} starts ...",
        flush=True,
    )
    began = time.perf_counter()
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            variant = variants[name]
            start = variant.start
            times = []
            gc.collect()
            with variant.around():
                gc.disable()
                try:
                    for _ in range(args.batch):
                        t0 = clock()
                        start()
                        times.append((clock() - t0) / 1000)
                    times = settled(times)
                finally:
                    gc.enable()
            variant.samples += times
            variant.rounds.append(statistics.median(times))
        complete_quota_runs()
    elapsed = time.perf_counter() - began

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]

    print()
    print(
        f"{datetime.date.today().isoformat()}, Python {platform.python_version()}, "
        f"PostgreSQL {server.split()[0]}, Redis broker, {os.cpu_count()} cores (shared); "
        f"{rounds} rounds x {args.batch} starts per variant, measured in {elapsed:.0f} s"
    )
    print()
    header = (
        f"| {'variant':<36} | {'starts/s':>8} | {'mean µs':>8} | {'median µs':>9} "
        f"| {'p90 µs':>7} | {'PG trips':>8} | {'Redis trips':>11} |"
    )
    print(header)
    print("| " + " | ".join("-" * (len(c) - 2) for c in header.split("|")[1:-1]) + " |")
    for name, variant in variants.items():
        mean = statistics.fmean(variant.samples)
        median = statistics.median(variant.samples)
        p90 = statistics.quantiles(variant.samples, n=10)[-1]
        pg, rd = trips[name]
        pg_text = "-" if name in untraced else str(pg)
        print(
            f"| {variant.label:<36} | {1e6 / mean:>8.0f} | {mean:>8.0f} | {median:>9.0f} "
            f"| {p90:>7.0f} | {pg_text:>8} | {rd:>11} |"
        )
    print()

    def ratio(top: str, bottom: str) -> tuple[float, float, float, float]:
        per_round = [
            t / b for t, b in zip(variants[top].rounds, variants[bottom].rounds, strict=True)
        ]
        if len(per_round) > 1:
            q1, _, q3 = statistics.quantiles(per_round, n=4)
        else:
            q1 = q3 = per_round[0]
        overall = statistics.median(variants[top].samples) / statistics.median(
            variants[bottom].samples
        )
        return statistics.median(per_round), q1, q3, overall

    # (top, bottom, goal): top/bottom of the times, with a goal "<= x"; against
    # Procrastinate's defer, the speed of top instead (bottom/top), with a goal ">= x".
    goals: list[tuple[str, str, str | None]] = [
        ("b", "a", "<= 1.3"),
        ("c", "b", "<= 1.1"),
        ("b", "defer", ">= 1.0"),
        ("bi", "defer", ">="),
        ("bt", "defer", ">="),
        ("nb", "defer", ">="),
        ("b", "view", "<= 1.1"),
        ("bF", "viewF", "<= 1.15"),
        ("bF2", "viewF", None),
        ("bF", "bF2", None),
        ("pub", "lean", None),
        ("bi", "b", None),
        ("bt", "b", None),
        ("m", "b", "<= 1.3"),
        ("r", "b", "<= 1.15"),
        ("rh", "r", "<= 1.1"),
        ("pr", "r", None),
        ("w", "b", "<= 1.05"),
        ("pb", "pa", None),
        ("pc", "pb", None),
        ("pm", "pb", None),
        ("pw", "pb", None),
        ("nb", "na", None),
        ("nc", "nb", None),
        ("a", "raw", None),
        ("b", "raw", None),
        ("bS", "b", None),
        ("viewS", "view", None),
        ("biS", "viewS", None),
        ("bO", "b", None),
        ("viewO", "view", None),
        ("biO", "viewO", None),
    ]
    for top, bottom, goal in goals:
        if top not in variants or bottom not in variants:
            continue
        speed = goal is not None and goal.startswith(">=")
        first, second = (bottom, top) if speed else (top, bottom)
        med, q1, q3, overall = ratio(first, second)
        verdict = ""
        if goal is not None and " " in goal:
            bound = float(goal.split()[1])
            met = med >= bound if speed else med <= bound
            verdict = f"  goal {goal}: {'met' if met else 'MISSED'}"
        name = f"{first}/{second}" + (f" (speed of {top} vs {bottom})" if speed else "")
        print(
            f"{name:>12} = {med:.3f}  (per-round IQR {q1:.3f}-{q3:.3f}; "
            f"ratio of overall medians {overall:.3f}){verdict}"
        )
    print()
    if args.variants:
        purged += purge_queue(app)
        for close in closers:
            close()
        print(f"purged {purged} messages from Redis queue {QUEUE!r}")
        return
    print(explain_count(args.history, variants["c"].start))
    complete_quota_runs()
    measure_batches(args, fast, portable, fast_no_publish, bench, inline)
    purged += purge_queue(app)
    for close in closers:
        close()
    print()
    print(f"purged {purged} messages from Redis queue {QUEUE!r}")


if __name__ == "__main__":
    main()
