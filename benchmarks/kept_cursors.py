"""What a statement on the kept cursors costs (``stores/postgres/bound.py``): this
checkout's ``fetch_one`` against another checkout's (``--before``) and against Django's
own cursor, with no instrumentation, with sentry-sdk's Django integration on (a
transaction sampled, so every statement is a span), and with OpenTelemetry's psycopg
instrumentation on (spans to the SDK's in-memory exporter); then, with ``--before``, a
whole start and turn with this checkout's kept cursors and with the other's.

Run from the repository root::

    .venv/bin/python benchmarks/kept_cursors.py [--before ../main] [--calls 300] [--rounds 12]

The statement is a turn's kind: six parameters of mixed types (text, integer, a time, a
JSON document, a boolean), one row back. Each way has a connection of its own to the
PostgreSQL database ``--database`` (nothing is written). The ways take turns within
each round, in an order that rotates from round to round; the table shows each way's
median per round of the client's CPU time (this thread's) and wall time per statement,
and the ratios are the medians of the per-round ratios, with their interquartile range
(the machine is shared: compare rows, not absolutes). ``sentry`` and ``otel`` need the
``dev`` extra.

The start and turn (``--turns`` per way per round, 0 to leave them out) run in the
database ``--turn-database``, created if missing and migrated: ``Engine(enqueue=False)``
starts a run under a quota, then executes its turn (two steps and a transactional
step), timed apart, the other checkout's ``fetch_one`` and ``execute_kept`` put in place
of this one's for its batches. Everything else is this checkout's code: the difference
is the kept cursors' alone.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STATEMENT = "SELECT %s::text, %s::text, %s::integer, %s::timestamptz, %s::jsonb, %s::boolean"
PARAMS: list[Any] = [
    "3f1c0e8a-run",
    "worker-1",
    7,
    datetime.datetime(2026, 12, 4, 5, 0, tzinfo=datetime.UTC),
    '{"result": [1, 2, 3], "name": "charge"}',
    True,
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before", default="", help="another checkout whose bound.py to compare with"
    )
    parser.add_argument("--calls", type=int, default=300, help="statements per way per round")
    parser.add_argument("--rounds", type=int, default=12, help="rounds per mode")
    parser.add_argument("--database", default="postgres", help="PostgreSQL database")
    parser.add_argument(
        "--modes", default="none,sentry,otel", help="instrumentations, comma-separated"
    )
    parser.add_argument("--turns", type=int, default=100, help="starts and turns per way")
    parser.add_argument(
        "--turn-database", default="durable_bench_kept", help="PostgreSQL database of the runs"
    )
    return parser.parse_args()


def configure(database: str, turn_database: str) -> None:
    import django
    from django.conf import settings

    alias = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": database,
        "USER": os.environ.get("DURABLE_BENCH_USER", "postgres"),
        "HOST": os.environ.get("DURABLE_BENCH_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DURABLE_BENCH_PORT", "5432"),
    }
    databases = {name: dict(alias) for name in ("default", "before", "django")}
    databases["runs"] = {**alias, "NAME": turn_database}
    settings.configure(
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=["durable_django"],
        DATABASES=databases,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        DURABLE={"ENQUEUE": False},
    )
    django.setup()


def load_before(checkout: str) -> Any:
    """The ``bound`` module of ``checkout``, loaded under a name of its own."""
    path = Path(checkout).resolve() / "durable_django" / "stores" / "postgres" / "bound.py"
    spec = importlib.util.spec_from_file_location("bound_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ways(before: Any) -> dict[str, Callable[[], Any]]:
    from django.db import connections

    from durable_django.stores.postgres.bound import fetch_one

    def django_cursor() -> Any:
        with connections["django"].cursor() as cursor:
            cursor.execute(STATEMENT, PARAMS)
            return cursor.fetchone()

    found = {"kept": lambda: fetch_one(connections["default"], STATEMENT, PARAMS)}
    if before is not None:
        found["kept before"] = lambda: before.fetch_one(connections["before"], STATEMENT, PARAMS)
    found["Django's cursor"] = django_cursor
    return found


@contextmanager
def instrumentation(mode: str) -> Iterator[Callable[[], AbstractContextManager[Any]]]:
    """Turn ``mode`` on; yields what to wrap each batch in (Sentry's transaction)."""
    from django.db import connections

    connections.close_all()
    if mode == "none":
        yield nullcontext
    elif mode == "sentry":
        import sentry_sdk
        from sentry_sdk.integrations.django import DjangoIntegration
        from sentry_sdk.transport import Transport

        class Dropped(Transport):
            def capture_envelope(self, envelope: Any) -> None:
                pass

        sentry_sdk.init(
            dsn="https://key@sentry.invalid/1",
            transport=Dropped(),
            integrations=[DjangoIntegration()],
            default_integrations=False,
            auto_enabling_integrations=False,
            traces_sample_rate=1.0,
        )
        try:
            yield lambda: sentry_sdk.start_transaction(name="batch", op="bench")
        finally:
            sentry_sdk.get_client().close()
            sentry_sdk.get_global_scope().set_client(None)
    elif mode == "otel":
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        instrumentor = PsycopgInstrumentor()
        instrumentor.instrument(tracer_provider=provider)

        @contextmanager
        def batch() -> Iterator[None]:
            yield
            exporter.clear()

        try:
            yield batch
        finally:
            instrumentor.uninstrument()
    else:
        raise SystemExit(f"unknown mode {mode!r}: none, sentry or otel")
    connections.close_all()


def measure(mode: str, found: dict[str, Callable[[], Any]], args: argparse.Namespace) -> None:
    cpu: dict[str, list[float]] = {name: [] for name in found}
    wall: dict[str, list[float]] = {name: [] for name in found}
    names = list(found)
    with instrumentation(mode) as around:
        for call in found.values():
            call()  # connect, make the kept cursors
        for number in range(args.rounds):
            order = names[number % len(names) :] + names[: number % len(names)]
            for name in order:
                call = found[name]
                with around():
                    started_cpu, started = time.thread_time_ns(), time.perf_counter_ns()
                    for _ in range(args.calls):
                        call()
                    ended_cpu, ended = time.thread_time_ns(), time.perf_counter_ns()
                cpu[name].append((ended_cpu - started_cpu) / args.calls / 1000)
                wall[name].append((ended - started) / args.calls / 1000)
    print(f"\n{mode}: {args.rounds} rounds x {args.calls} statements per way\n")
    print("| way | client CPU µs | wall µs |")
    print("| --- | ---: | ---: |")
    for name in names:
        cpu_us, wall_us = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"| {name} | {cpu_us:.1f} | {wall_us:.1f} |")
    print()
    for other in names[1:]:
        print_ratios(cpu, "kept", other, "CPU")
        print_ratios(wall, "kept", other, "wall")


def print_ratios(series: dict[str, list[float]], first: str, other: str, label: str) -> None:
    ratios = sorted(a / b for a, b in zip(series[first], series[other], strict=True))
    quartiles = statistics.quantiles(ratios, n=4)
    print(
        f"{first} / {other}, {label}: {statistics.median(ratios):.3f}"
        f" (per-round IQR {quartiles[0]:.3f}-{quartiles[2]:.3f})"
    )


def prepare_runs(database: str) -> None:
    """Create ``database`` if missing, and migrate it."""
    import psycopg
    from django.core.management import call_command
    from django.db import connections

    params = connections["runs"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True) as admin:
        found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
        if found.fetchone() is None:
            admin.execute(f'CREATE DATABASE "{database}"')
    call_command("migrate", database="runs", verbosity=0)


def measure_turns(before: Any, args: argparse.Namespace) -> None:
    """Starts and turns with this checkout's kept cursors and with ``before``'s."""
    from django.db import connections

    from durable_django import Concurrency, Engine
    from durable_django._rules.registry import Registry
    from durable_django.stores import OrmStore
    from durable_django.stores.orm import postgres as orm_postgres
    from durable_django.stores.postgres import bound, committing

    prepare_runs(args.turn_database)
    engine = Engine(store=OrmStore(using="runs"), registry=Registry(), enqueue=False)

    def body(ctx: Any, input: Any) -> int:
        ctx.step("one", lambda: 1)
        ctx.step("two", lambda: 2)
        return int(ctx.transaction("three", lambda: 3))

    engine.register(
        "bench.kept", "1", body, concurrency=Concurrency(key=lambda input: "bench:kept", limit=10)
    )
    kept = {
        "kept": (bound.fetch_one, bound.execute_kept),
        "kept before": (before.fetch_one, before.execute_kept),
    }
    starts: dict[str, list[float]] = {name: [] for name in kept}
    turns: dict[str, list[float]] = {name: [] for name in kept}
    names = list(kept)
    connection = connections["runs"]
    try:
        for number in range(args.rounds + 1):
            order = names[number % len(names) :] + names[: number % len(names)]
            for name in order:
                orm_postgres.fetch_one, committing.execute_kept = kept[name]
                # Each version keeps its cursors its own way.
                connection.__dict__.pop("_durable_kept_cursors", None)
                start_cpu = turn_cpu = 0
                for _ in range(args.turns):
                    started = time.thread_time_ns()
                    handle = engine.start("bench.kept", {})
                    between = time.thread_time_ns()
                    assert engine.execute(handle.run_id)
                    ended = time.thread_time_ns()
                    start_cpu += between - started
                    turn_cpu += ended - between
                if number:  # the first round warms up
                    starts[name].append(start_cpu / args.turns / 1000)
                    turns[name].append(turn_cpu / args.turns / 1000)
    finally:
        orm_postgres.fetch_one, committing.execute_kept = kept["kept"]
    print(f"\nstart and turn: {args.rounds} rounds x {args.turns} runs per way\n")
    print("| way | start, client CPU µs | turn, client CPU µs |")
    print("| --- | ---: | ---: |")
    for name in names:
        start_us, turn_us = statistics.median(starts[name]), statistics.median(turns[name])
        print(f"| {name} | {start_us:.0f} | {turn_us:.0f} |")
    print()
    print_ratios(starts, "kept", "kept before", "start CPU")
    print_ratios(turns, "kept", "kept before", "turn CPU")


def main() -> None:
    args = parse_args()
    configure(args.database, args.turn_database)
    before = load_before(args.before) if args.before else None
    found = ways(before)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for mode in filter(None, args.modes.split(",")):
        measure(mode, found, args)
    if before is not None and args.turns:
        measure_turns(before, args)
    print(f"\nload average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
