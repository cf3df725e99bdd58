"""What the observability seam costs: the CPU time of a start and of a turn, executed in
one process on PostgreSQL (no broker, no worker), for this checkout against the code
before (``--base PATH``), and with OpenTelemetry's SDK tracer provider set (its spans
dropped by the exporter), side by side.

Run from the repository root::

    .venv/bin/python benchmarks/instrumentation.py --base /tmp/base [--rounds 8]

(``git worktree add --detach /tmp/base main`` makes the checkout before.) Each round
runs one child process per variant, in an order that rotates: **code before** (the
package of ``--base``), **no instrumentation** (this checkout, nothing set up), **OTel
on** (this checkout, the SDK's provider set; needs ``opentelemetry-sdk``). A child
starts ``--runs`` runs of ``bench.three_writes`` (three ``ctx.step`` inserts, under a
quota) with ``enqueue`` off, then executes them, and reports the thread CPU time per
start and per turn, the least of ``--batches`` batches. CPU time, not wall time: the
machine is shared, and what the seam adds is CPU. The table gives each variant's median
over the rounds, and the median (and range) of the per-round ratios.

The database ``durable_bench_instrumentation`` (``--database``) is made anew and migrated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.execution_settings")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="", metavar="PATH", help="the checkout before")
    parser.add_argument("--rounds", type=int, default=8, help="child processes per variant")
    parser.add_argument("--runs", type=int, default=200, help="runs per batch")
    parser.add_argument("--batches", type=int, default=4, help="batches per child")
    parser.add_argument("--database", default="durable_bench_instrumentation")
    parser.add_argument("--child", choices=["plain", "otel"], help=argparse.SUPPRESS)
    return parser.parse_args()


def child(args: argparse.Namespace) -> None:
    """One variant's measurement, in this process: prints µs of CPU per start and per turn."""
    os.environ["DURABLE_BENCH_DB"] = args.database
    if args.child == "otel":
        from collections.abc import Sequence

        from opentelemetry import trace
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Dropped(SpanExporter):
            def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        trace.set_tracer_provider(provider)
    import django

    django.setup()
    from django.db import connection

    try:
        from benchmarks.common.execution_work import TABLE
        from benchmarks.common.execution_work import three_writes as workflow
    except ModuleNotFoundError:  # a --base checkout from before benchmarks/common/
        from benchmarks.execution_work import TABLE  # type: ignore[no-redef]
        from benchmarks.execution_work import three_writes as workflow  # type: ignore[no-redef]
    from durable_django import Engine

    engine = Engine(enqueue=False)

    def batch(runs: int) -> tuple[float, float]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"TRUNCATE durable_run, durable_run_tag, durable_step, {TABLE} "
                f"RESTART IDENTITY CASCADE"
            )
        began = time.thread_time()
        ids = [engine.start(workflow, {"tenant": f"t{i % 10}", "n": i}).run_id for i in range(runs)]
        started = time.thread_time()
        for run_id in ids:
            engine.execute(run_id)
        ended = time.thread_time()
        return (started - began) / runs * 1e6, (ended - started) / runs * 1e6

    batch(50)  # warm up: imports, connection, plans
    starts, turns = zip(*(batch(args.runs) for _ in range(args.batches)), strict=True)
    print(f"{min(starts):.1f} {min(turns):.1f}")


def main() -> None:
    args = parse_args()
    if args.child:  # the package and the benchmarks come from PYTHONPATH
        child(args)
        return
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.common.database import set_up_django

    set_up_django(args.database)
    from django.db import connection

    from benchmarks.common.execution_work import create_tables

    create_tables()
    connection.close()
    variants = {"none": (ROOT, "plain"), "otel": (ROOT, "otel")}
    if args.base:
        variants = {"before": (Path(args.base).resolve(), "plain"), **variants}
    labels = {"before": "code before", "none": "no instrumentation", "otel": "OTel on"}
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    load_before = os.getloadavg()
    for number in range(args.rounds):
        names = list(variants)
        for name in names[number % len(names) :] + names[: number % len(names)]:
            root, mode = variants[name]
            env = {**os.environ, "PYTHONPATH": str(root), "DURABLE_BENCH_DB": args.database}
            if not (root / "benchmarks" / "common").is_dir():  # a checkout from before
                env["DJANGO_SETTINGS_MODULE"] = "benchmarks.execution_settings"
            command = [sys.executable, str(ROOT / "benchmarks" / "instrumentation.py")]
            command += ["--child", mode, "--runs", str(args.runs), "--batches", str(args.batches)]
            output = subprocess.run(
                [*command, "--database", args.database],
                cwd=root,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            measured[name].append((float(output[-2]), float(output[-1])))
    load_after = os.getloadavg()
    print(
        f"{args.rounds} rounds x {args.batches} batches x {args.runs} runs, {os.cpu_count()} "
        f"cores (shared), load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print()
    print(f"| {'variant':<20} | {'CPU µs/start':>12} | {'CPU µs/turn':>11} |")
    print(f"| {'-' * 20} | {'-' * 11}: | {'-' * 10}: |")
    for name, values in measured.items():
        starts = statistics.median(value[0] for value in values)
        turns = statistics.median(value[1] for value in values)
        print(f"| {labels[name]:<20} | {starts:>12.1f} | {turns:>11.1f} |")
    print()
    print(f"| {'ratio':<34} | {'start':>21} | {'turn':>21} |")
    print(f"| {'-' * 34} | {'-' * 20}: | {'-' * 20}: |")
    for numerator, denominator in (("none", "before"), ("otel", "none")):
        if denominator not in measured:
            continue
        cells = []
        for index in (0, 1):
            ratios = [
                n[index] / d[index]
                for n, d in zip(measured[numerator], measured[denominator], strict=True)
            ]
            cells.append(f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")
        label = f"{labels[numerator]} / {labels[denominator]}"
        print(f"| {label:<34} | {cells[0]:>21} | {cells[1]:>21} |")


if __name__ == "__main__":
    main()
