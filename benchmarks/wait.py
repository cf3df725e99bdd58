"""How soon a start waiting for a slot (``wait=``) is admitted once the slot frees, on
PostgreSQL, and what the release trigger costs a turn's end.

Run from the repository root::

    .venv/bin/python benchmarks/wait.py [--releases 150] [--ends 2000]

It (re)creates the PostgreSQL database ``durable_bench_wait`` (``--database``), migrates
it, and measures:

- **release to admission**: on a fresh key of limit 1 held by one run, a thread starts a
  run with ``wait=30``; once it waits, and a further 20-400 ms (uniform), this process
  ends the holder (``completed``, committed). The gap is from that commit's return to the
  waiting start's return (its run committed). Three ways, interleaved release by release:
  **notify** (the ORM store: ``LISTEN``, woken by the trigger's ``NOTIFY``), **backed-off
  poll** (the same store with its listener off: what SQLite and MariaDB do, 50 ms doubling
  to 1 s) and **1 s poll** (a poll every second). The goal: notify's p95 under 50 ms.
- **trigger cost**: a turn's end, ``running`` to ``completed`` through the store (one
  ``durable_transition_v1`` call in its transaction) for a run under one quota, timed
  with the release trigger as it was (notifying on every release), as it is (notifying
  only when a waiter of the key is registered) and disabled (``ALTER TABLE ... DISABLE
  TRIGGER``), in blocks of 100 in rotating order, no waiter and one waiter on the key;
  and per release the trigger's time and the WAL written, from ``EXPLAIN (ANALYZE, WAL)``
  of the tag's update (20 per block). ``--releases 0`` measures the trigger alone.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.settings")

GOAL_P95 = 0.050
WAYS = ("notify", "backed-off poll", "1 s poll")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", type=int, default=150, help="releases per way")
    parser.add_argument("--ends", type=int, default=2000, help="turn ends per trigger setting")
    parser.add_argument("--database", default="durable_bench_wait")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@contextmanager
def polling_every(seconds: float | None) -> Iterator[None]:
    """The waiting module's polling pauses set to ``seconds`` (``None``: as they are)."""
    from durable_django._runtime import waiting

    saved = waiting.FIRST_POLL_SECONDS, waiting.MAX_POLL_SECONDS
    if seconds is not None:
        waiting.FIRST_POLL_SECONDS = waiting.MAX_POLL_SECONDS = seconds
    try:
        yield
    finally:
        waiting.FIRST_POLL_SECONDS, waiting.MAX_POLL_SECONDS = saved


def engines() -> dict[str, Any]:
    from durable_django import Engine
    from durable_django.stores import OrmStore

    class PollingStore(OrmStore):
        """The ORM store with its release listener off: a waiting start polls."""

        def release_listener(self, keys: Collection[str]) -> None:
            return None

    listening = Engine(store=OrmStore(), enqueue=False)
    polling = Engine(store=PollingStore(), enqueue=False)
    for engine in (listening, polling):
        engine.register("bench.wait", "1", lambda ctx, input: input)
        engine.config  # noqa: B018
    return {"notify": listening, "backed-off poll": polling, "1 s poll": polling}


def one_release(engine: Any, way: str, rng: random.Random) -> float:
    """The gap, in seconds, from the holder's end committing to the waiter's admission."""
    from django.db import connections

    from durable_django._runtime.waiting import waiting_count

    quota = {"key": f"bench:{uuid.uuid4().hex}", "limit": 1}
    holder = engine.start("bench.wait", {}, concurrency=quota)
    admitted: list[float] = []

    def waiter() -> None:
        try:
            engine.start("bench.wait", {}, concurrency=quota, wait=30)
            admitted.append(time.perf_counter())
        finally:
            connections.close_all()

    with polling_every(1.0 if way == "1 s poll" else None):
        thread = threading.Thread(target=waiter)
        thread.start()
        while waiting_count() == 0:
            time.sleep(0.001)
        time.sleep(rng.uniform(0.02, 0.4))
        assert engine.store.transition(holder.run_id, ["pending"], "completed")
        released = time.perf_counter()
        thread.join(60)
    (at,) = admitted
    return at - released


def release_table(args: argparse.Namespace, rng: random.Random) -> None:
    by_way = engines()
    gaps: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(args.releases):
        for way in rng.sample(WAYS, len(WAYS)):
            gaps[way].append(one_release(by_way[way], way, rng))
    print("| release to admission | releases | p50 | p95 | max | goal p95 < 50 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for way in WAYS:
        values = gaps[way]
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        goal = ("met" if p95 < GOAL_P95 else "missed") if way == "notify" else "-"
        print(
            f"| {way} | {len(values)} | {p50 * 1000:.1f} ms | {p95 * 1000:.1f} ms "
            f"| {max(values) * 1000:.1f} ms | {goal} |"
        )


#: The trigger function as it was before it asked whether anyone waits: it notified on
#: every release.
NOTIFY_ALWAYS = """
CREATE OR REPLACE FUNCTION durable_quota_release_notify_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('durable_quota_' || left(md5(OLD.tag), 16), OLD.tag);
    RETURN NULL;
END
$$;
"""
TRIGGER_SETTINGS = ("notify always (before)", "notify when a waiter listens", "off")


def trigger_cost(args: argparse.Namespace) -> None:
    from django.db import connection

    from durable_django import Engine
    from durable_django.stores import OrmStore
    from durable_django.stores.postgres import function_definitions

    engine = Engine(store=OrmStore(), enqueue=False)
    engine.register("bench.end", "1", lambda ctx, input: input)
    store = engine.store
    key = f"bench:{uuid.uuid4().hex}"
    quota = {"key": key, "limit": 1_000_000}
    bodies = {
        TRIGGER_SETTINGS[0]: NOTIFY_ALWAYS,
        TRIGGER_SETTINGS[1]: function_definitions()["durable_quota_release_notify_v1"],
    }

    def set_trigger(setting: str) -> None:
        verb = "DISABLE" if setting == "off" else "ENABLE"
        with connection.cursor() as cursor:
            if setting in bodies:
                cursor.execute(bodies[setting])
            for name in ("durable_quota_release", "durable_quota_release_delete"):
                cursor.execute(f"ALTER TABLE durable_run_tag {verb} TRIGGER {name}")

    def running(count: int) -> list[str]:
        run_ids = [engine.start("bench.end", {}, concurrency=quota).run_id for _ in range(count)]
        for run_id in run_ids:
            assert store.transition(run_id, ["pending"], "running")
        return run_ids

    def ends(count: int) -> list[float]:
        times = []
        for run_id in running(count):
            begun = time.perf_counter()
            assert store.transition(run_id, ["running"], "completed", output={"ok": True})
            times.append(time.perf_counter() - begun)
        return times

    def explained(count: int) -> tuple[float, float, float]:
        """Per release: the trigger's time (ms), WAL records and WAL bytes, as EXPLAIN
        (ANALYZE, WAL) reports the tag's update (the trigger's work counted in it)."""
        import json

        spent = records = size = 0.0
        for run_id in running(count):
            with connection.cursor() as cursor:
                cursor.execute(
                    "EXPLAIN (ANALYZE, WAL, FORMAT JSON) UPDATE durable_run_tag "
                    "SET status = 'completed' WHERE run_id = %s",
                    [run_id],
                )
                (explain,) = cursor.fetchone()
            plan = (json.loads(explain) if isinstance(explain, str) else explain)[0]
            spent += sum(trigger["Time"] for trigger in plan.get("Triggers", []))
            records += plan["Plan"].get("WAL Records", 0)
            size += plan["Plan"].get("WAL Bytes", 0)
        return spent / count, records / count, size / count

    rows = []
    for listeners in (0, 1):
        listener = store.release_listener([key]) if listeners else None
        results: dict[str, list[float]] = {setting: [] for setting in TRIGGER_SETTINGS}
        explains: dict[str, list[tuple[float, float, float]]] = {s: [] for s in TRIGGER_SETTINGS}
        ends(50)  # warm up
        for block in range(args.ends // 100):
            shift = block % len(TRIGGER_SETTINGS)
            for setting in TRIGGER_SETTINGS[shift:] + TRIGGER_SETTINGS[:shift]:
                set_trigger(setting)
                results[setting].extend(ends(100))
                explains[setting].append(explained(20))
        set_trigger(TRIGGER_SETTINGS[1])
        if listener is not None:
            listener.close()
        for setting in TRIGGER_SETTINGS:
            trigger_ms, wal_records, wal_bytes = (
                statistics.median(value[i] for value in explains[setting]) for i in range(3)
            )
            rows.append(
                (
                    listeners,
                    setting,
                    len(results[setting]),
                    statistics.median(results[setting]),
                    trigger_ms,
                    wal_records,
                    wal_bytes,
                )
            )
    print()
    print(
        "| turn end (running -> completed) | release trigger | ends | p50 | trigger time "
        "per release | WAL records per release | WAL bytes per release |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for listeners, setting, count, p50, trigger_ms, wal_records, wal_bytes in rows:
        print(
            f"| {listeners} waiter(s) on the key | {setting} | {count} | {p50 * 1000:.3f} ms "
            f"| {trigger_ms * 1000:.1f} us | {wal_records:.2f} | {wal_bytes:.0f} |"
        )


def main() -> None:
    args = parse_args()
    from benchmarks.common.database import set_up_django

    set_up_django(args.database)

    rng = random.Random(args.seed)
    if args.releases:
        release_table(args, rng)
    trigger_cost(args)


if __name__ == "__main__":
    main()
