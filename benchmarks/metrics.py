"""What the metrics cost a start: the same start with no metrics library, with
prometheus_client, with OpenTelemetry's API alone (no SDK: what a project gets before it
configures one), with the OpenTelemetry SDK (an in-memory reader), and with both,
side by side in one run.

Run from the repository root::

    .venv/bin/python benchmarks/metrics.py [--starts 20000] [--rounds 100]
    .venv/bin/python benchmarks/metrics.py --rows none   # runs on code without metrics

The starts are made in this process on the memory store, under a quota, with nothing
sent: only the engine's own work is measured (validation, the quota's resolution and
count, the observers of ``durable_django.observability``), so that a few microseconds
show above the noise. The variants take turns, ``--rounds`` rounds of ``--starts`` /
``--rounds`` starts each, in an order rotating from round to round; the table shows
each variant's median time per start over the rounds, and each ratio is the median of
the per-round ratios to ``none`` (the machine is shared: compare rows, not absolutes).

``--rows none`` measures the plain start alone, on code with or without
``durable_django.metrics``: run it with ``PYTHONPATH`` on each checkout in turn to
compare the start before and after, with the libraries hidden (``--hide-libraries``:
``opentelemetry`` and ``prometheus_client`` then fail to import, as when not installed).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: another checkout there is measured
# The settings of the checkout measured: in benchmarks/common/, or benchmarks/settings.py in
# a checkout from before the benchmarks were packages.
os.environ.setdefault(
    "DJANGO_SETTINGS_MODULE",
    "benchmarks.common.settings"
    if importlib.util.find_spec("benchmarks.common")
    else "benchmarks.settings",
)

LIBRARIES = ("opentelemetry", "prometheus_client")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=20_000, help="starts per variant")
    parser.add_argument("--rounds", type=int, default=100, help="rounds")
    parser.add_argument(
        "--rows",
        default="none,prometheus,otel-api,otel-sdk,both",
        help="the variants, comma-separated",
    )
    parser.add_argument(
        "--hide-libraries", action="store_true", help="make the metrics libraries unimportable"
    )
    return parser.parse_args()


def sinks(row: str) -> tuple[Any, ...]:
    """The sinks of one variant, each on a registry or provider of its own."""
    if row == "none":
        return ()
    from prometheus_client import CollectorRegistry

    from durable_django.metrics.opentelemetry import OpenTelemetryMetrics
    from durable_django.metrics.prometheus import PrometheusMetrics

    def prometheus() -> Any:
        return PrometheusMetrics(CollectorRegistry(), quota_keys=0)

    def otel_sdk() -> Any:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        return OpenTelemetryMetrics(provider, quota_keys=0)

    made: dict[str, Callable[[], tuple[Any, ...]]] = {
        "prometheus": lambda: (prometheus(),),
        "otel-api": lambda: (OpenTelemetryMetrics(quota_keys=0),),
        "otel-sdk": lambda: (otel_sdk(),),
        "both": lambda: (prometheus(), otel_sdk()),
    }
    return made[row]()


def main() -> None:
    args = parse_args()
    if args.hide_libraries:
        for name in LIBRARIES:
            sys.modules[name] = None  # type: ignore[assignment]  # an import now fails
    import django

    django.setup()
    from durable_django import Engine
    from durable_django._rules.registry import Registry
    from durable_django.stores import MemoryStore

    try:
        from durable_django import metrics
    except ImportError:  # code from before the metrics
        metrics = None  # type: ignore[assignment]

    rows = args.rows.split(",")
    if metrics is None and rows != ["none"]:
        sys.exit("this checkout has no durable_django.metrics: use --rows none")
    registry = Registry()
    # A limit no round reaches: every start is admitted, under a quota.
    Engine(registry=registry).register(
        "bench.metered", "1", lambda ctx, i: i, concurrency={"key": lambda i: "k", "limit": 10**9}
    )
    made = {row: sinks(row) for row in rows}
    per_round = max(args.starts // args.rounds, 1)
    times: dict[str, list[float]] = {row: [] for row in rows}
    for round_number in range(args.rounds):
        order = rows[round_number % len(rows) :] + rows[: round_number % len(rows)]
        for row in order:
            if metrics is not None:
                metrics.install(*made[row])
            # A store of its own: the memory store's count grows with the runs it holds.
            engine = Engine(store=MemoryStore(), registry=registry, enqueue=False)
            gc.collect()
            began = time.perf_counter()
            for _ in range(per_round):
                engine.start("bench.metered", {"n": 1})
            times[row].append((time.perf_counter() - began) / per_round * 1e6)
    if metrics is not None:
        metrics.reset()

    hidden = " (libraries hidden)" if args.hide_libraries else ""
    print(
        f"{args.rounds} rounds x {per_round} starts per variant, memory store, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores (shared){hidden}\n"
    )
    print(f"| {'variant':<12} | median µs/start | min µs | max µs | vs none (median of rounds) |")
    print(f"| {'-' * 12} | --------------- | ------ | ------ | -------------------------- |")
    for row in rows:
        series = times[row]
        ratio = ""
        if "none" in times:
            ratios = [t / base for t, base in zip(series, times["none"], strict=True)]
            ratio = f"{statistics.median(ratios):.3f}"
        print(
            f"| {row:<12} | {statistics.median(series):15.1f} | {min(series):6.1f} "
            f"| {max(series):6.1f} | {ratio:>26} |"
        )


if __name__ == "__main__":
    main()
