"""The example site under HTTP load: ``POST /tenants/<slug>/turns`` (a quota-checked
``dispatch``) against a plain view doing the same authentication, one insert and a
Celery task's ``.delay()``, with kept connections and with one per request.

Run from the repository root (gunicorn in the virtualenv, wrk on the machine: Debian's
``apt-get install wrk``)::

    .venv/bin/python -m benchmarks.http_load [--seconds 10] [--rounds 3]

It (re)creates the PostgreSQL database ``durable_bench_http`` (``--database``), migrates
the example project into it, makes a tenant whose plan allows 10**9 active turns, and
for each ``CONN_MAX_AGE`` (60, then 0) starts gunicorn (``--workers`` sync workers) on
the example site (``benchmarks/http_load/settings.py``), then runs wrk (``--connections``
connections) against the two views in turn, ``--rounds`` times, completing the started
turns between runs so the quota's count stays small. Messages go to Redis
(``redis://127.0.0.1:6379/14``, queue ``durable_bench_http``, deleted at the end).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "example_project"
QUEUE = "durable_bench_http"
LUA = """wrk.method = "POST"
wrk.body = '{"message": "hello"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wrk(url: str, script: str, seconds: int, connections: int) -> tuple[float, float, int]:
    """Requests per second, median latency in ms, and non-2xx answers of one wrk run."""
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", script, url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"50%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    median = float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return rate, median, int(bad.group(1)) if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="durable_bench_http")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(SITE)]
    from benchmarks.common.database import recreate_database

    recreate_database(args.database)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(SITE)]),
        "DJANGO_SETTINGS_MODULE": "benchmarks.http_load.settings",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{args.database}",
        "CELERY_BROKER_URL": os.environ.get("DURABLE_BENCH_BROKER", "redis://127.0.0.1:6379/14"),
        "SECRET_KEY": "benchmarks-only",
        "ALLOWED_HOSTS": "127.0.0.1",
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from tenants.models import Plan, Tenant

    call_command("migrate", verbosity=0)
    plan = Plan.objects.create(name="bench", max_active_turns=10**9)
    key = Tenant.objects.create(slug="bench", name="Bench", plan=plan).issue_api_key()

    def complete_turns() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE durable_run SET status = 'completed', finished_at = now() "
                "WHERE status = 'pending'"
            )
            cursor.execute(
                "UPDATE durable_run_tag SET status = 'completed' WHERE status = 'pending'"
            )

    results: dict[tuple[int, str], list[tuple[float, float, int]]] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(LUA % key)
        script.flush()
        for max_age in (60, 0):
            port = free_port()
            server = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "gunicorn"),
                    "--workers",
                    str(args.workers),
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--log-level",
                    "warning",
                    "chatsite.wsgi",
                ],
                cwd=SITE,
                env={**env, "CONN_MAX_AGE": str(max_age)},
            )
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                base = f"http://127.0.0.1:{port}/tenants/bench"
                for view in ("turns", "plain"):  # warm up
                    wrk(f"{base}/{view}", script.name, 2, args.connections)
                for number in range(args.rounds):
                    views = ["turns", "plain"] if number % 2 == 0 else ["plain", "turns"]
                    for view in views:
                        complete_turns()
                        results.setdefault((max_age, view), []).append(
                            wrk(f"{base}/{view}", script.name, args.seconds, args.connections)
                        )
            finally:
                server.terminate()
                server.wait()
    import redis

    redis.Redis.from_url(env["CELERY_BROKER_URL"]).delete(QUEUE)

    print(
        f"\n{time.strftime('%Y-%m-%d')}: gunicorn {args.workers} sync workers, wrk "
        f"{args.connections} connections, {args.rounds} rounds x {args.seconds} s per view\n"
    )
    print("| CONN_MAX_AGE | view | requests/s (each round) | median latency ms | non-2xx |")
    print("| ---: | --- | --- | ---: | ---: |")
    for (max_age, view), runs in results.items():
        rates = ", ".join(f"{rate:.0f}" for rate, _, _ in runs)
        median = statistics.median(latency for _, latency, _ in runs)
        print(f"| {max_age} | {view} | {rates} | {median:.2f} | {sum(b for *_, b in runs)} |")
    print()
    for max_age in (60, 0):
        turns = statistics.median(r for r, _, _ in results[(max_age, "turns")])
        plain = statistics.median(r for r, _, _ in results[(max_age, "plain")])
        print(f"CONN_MAX_AGE={max_age}: time per request, turns / plain = {plain / turns:.3f}")


if __name__ == "__main__":
    main()
