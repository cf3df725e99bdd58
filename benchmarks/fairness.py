"""Whether a fair quota serves polite clients in turn beside a client flooding their key.

Run from the repository root::

    .venv/bin/python benchmarks/fairness.py [--seconds 60] [--limit 4] [--polite 6]

It (re)creates the PostgreSQL database ``durable_bench_fairness`` (``--database``),
migrates it, and runs one process with one key of limit ``--limit`` at a time:

- **runs** hold their slot ``--duration`` seconds ± 20 % (uniform); no worker executes
  them: a *finisher* thread ends each admitted run (``pending`` to ``completed``, through
  the store, as a worker would) once its duration has passed. Each key is first given 50
  finished runs of that distribution, so ``retry_after`` is estimated from history.
- **polite clients** (``--polite`` threads) loop: start a run; on a refusal, turn the
  error into the 429 response (:func:`durable_django.http.too_many_requests`), sleep
  exactly its ``Retry-After`` seconds and retry, presenting the ``Durable-Ticket``
  header's ticket (fair variant; the other presents none); once admitted, pause 0-1 s
  (uniform) and start the next request.
- **a flood** (``--flood`` threads) starts without tickets, pausing ``--flood-pause``
  seconds between attempts, admitted or not.
- **a sampler** counts the key's active runs every 20 ms; and every pair of runs is
  checked afterwards for over-admission on times certainly inside their occupancy
  (admitted: when the start returned; freed: when the finisher began ending it).

- **an abandoner** (the third variant only) takes a ticket (a refusal), presents it once
  (it joins the line) and never comes back, then takes the next, pausing
  ``--abandon-pause`` seconds between tickets: every freed slot finds abandoned tickets
  in line, and is held for them.

Three variants, ``fair=False``, ``fair=True`` (window ``--window``), and ``fair=True``
beside the abandoner, each on fresh keys, interleaved in halves (A B C A B C,
``--seconds`` per variant in all). At the end of a half
no new request begins; the requests under way may finish for ``--drain`` seconds (the
flood goes on until they do); one still refused then is **cut off**: counted as not
admitted at its first or second retry, its wait so far a lower bound (``>=``). A
request's **wait** runs from its first attempt to its admission; its **retries** count
the refusals before it (0: admitted at once). ``mean active``: the key's active runs,
averaged over the samples (the slots a hold leaves idle lower it).

The goals (the fair variant): of the polite requests refused at least once, >= 80 %
admitted at their first or second retry; the worst wait <= 3 x the median run duration;
no over-admission in either variant. Diagnostics follow the table: how often a retry
with a ticket came back to find it expired (its hold passed, or its place lost), how
late, and what its ``Retry-After`` was.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.common.settings")

SPREAD = 0.2
HISTORY = 50
WORKFLOW = "bench.fair"
ACTIVE = ("pending", "running")
GOAL_SOON = 0.80
GOAL_WORST = 3.0
ABANDONED = "fair, abandoned tickets"
VARIANTS = ("not fair", "fair", ABANDONED)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60, help="per variant, in 2 halves")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--polite", type=int, default=6, help="polite client threads")
    parser.add_argument("--flood", type=int, default=1, help="flood client threads")
    parser.add_argument("--flood-pause", type=float, default=0.015, help="seconds")
    parser.add_argument("--duration", type=float, default=2.0, help="typical run, seconds")
    parser.add_argument("--window", type=float, default=3.0, help="fair_window, seconds")
    parser.add_argument(
        "--abandon-pause", type=float, default=0.25, help="seconds between abandoned tickets"
    )
    parser.add_argument(
        "--drain", type=float, default=30, help="seconds the requests under way may finish in"
    )
    parser.add_argument("--database", default="durable_bench_fairness")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@dataclass
class Retry:
    """A polite retry presenting a ticket (fair variant), as the client saw it."""

    retry_after: int  # the Retry-After it slept
    kept_expires: datetime.datetime | None  # the kept ticket's expiry when it came back
    kept_expiry_set: datetime.datetime | None  # what its last refusal set it to, about
    came_back: datetime.datetime
    outcome: str = ""  # "admitted", "refused, place kept", "refused, new ticket"
    held: int = 0
    active: int = 0


@dataclass
class Request:
    variant: str
    retries: int
    wait: float
    admitted: bool = True  # False: still refused when the half's drain ran out
    retry_afters: list[int] = field(default_factory=list)
    # per refusal: its Retry-After, the units of kept tickets ahead (fair), and the
    # seconds from it to the request's admission (None: cut off)
    refusals: list[tuple[int, int, float | None]] = field(default_factory=list)
    presented: list[Retry] = field(default_factory=list)


@dataclass
class Half:
    """One half of one variant: its key, what happened under it."""

    variant: str
    key: str
    fair: bool
    requests: list[Request] = field(default_factory=list)
    abandoned: int = 0  # tickets presented once, then never again (the abandoner's)
    flood_admitted: int = 0
    flood_attempts: int = 0
    max_active: int = 0
    samples: int = 0
    active_sum: int = 0
    # (admitted, freeing) monotonic times of each run, both within its occupancy
    spans: list[tuple[float, float]] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Finisher(threading.Thread):
    """Ends each admitted run once its duration has passed, as a worker would."""

    def __init__(self, engine: Any) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.heap: list[tuple[float, str, Half, float]] = []
        self.cond = threading.Condition()
        self.stopping = False

    def add(self, run_id: str, seconds: float, half: Half, admitted: float) -> None:
        with self.cond:
            heapq.heappush(self.heap, (admitted + seconds, run_id, half, admitted))
            self.cond.notify()

    def pending(self) -> int:
        with self.cond:
            return len(self.heap)

    def run(self) -> None:
        from django.db import connection
        from django.utils import timezone

        try:
            while True:
                with self.cond:
                    while not self.heap or self.heap[0][0] > time.monotonic():
                        if self.stopping and not self.heap:
                            return
                        timeout = self.heap[0][0] - time.monotonic() if self.heap else 0.2
                        self.cond.wait(max(0.0, min(timeout, 0.2)))
                    _, run_id, half, admitted = heapq.heappop(self.heap)
                freeing = time.monotonic()
                assert self.engine.store.transition(
                    run_id, ACTIVE, "completed", finished_at=timezone.now()
                )
                with half.lock:
                    half.spans.append((admitted, freeing))
        finally:
            connection.close()


def seed_history(key: str, rng: random.Random, args: argparse.Namespace) -> None:
    """50 finished runs of the key's duration distribution, ended over the last while."""
    from django.utils import timezone

    from durable_django.models import Run, RunTag

    now = timezone.now()
    runs, tags = [], []
    for n in range(HISTORY):
        ended = now - datetime.timedelta(seconds=1 + n * args.duration / args.limit)
        created = ended - datetime.timedelta(seconds=run_seconds(rng, args.duration))
        run_id = uuid.uuid4().hex
        runs.append(
            Run(
                id=run_id,
                workflow=WORKFLOW,
                version="1",
                namespace="default",
                status="completed",
                input={"key": key},
                created_at=created,
                updated_at=ended,
                finished_at=ended,
            )
        )
        tags.append(
            RunTag(run_id=run_id, tag=f"concurrency:{key}", status="completed", namespace="default")
        )
    Run.objects.bulk_create(runs)
    RunTag.objects.bulk_create(tags)


def run_seconds(rng: random.Random, typical: float) -> float:
    return rng.uniform(typical * (1 - SPREAD), typical * (1 + SPREAD))


def run_half(engine: Any, finisher: Finisher, half: Half, args: argparse.Namespace) -> None:
    """The polite clients, the flood and the sampler on ``half``'s key for the half's time."""
    from django.db import connection
    from django.utils import timezone

    from durable_django import Concurrency, ConcurrencyLimitError
    from durable_django._rules.tickets import HEADER
    from durable_django._rules.tickets import read as read_ticket
    from durable_django.http import too_many_requests
    from durable_django.models import QuotaTicket

    quota = Concurrency(key=half.key, limit=args.limit, fair=half.fair, fair_window=args.window)
    no_new = threading.Event()
    give_up = threading.Event()
    polite_done = threading.Event()
    sampler_stop = threading.Event()
    seeds = random.Random(f"{args.seed}:{half.key}")

    def start(rng: random.Random, ticket: str | None) -> None:
        seconds = run_seconds(rng, args.duration)
        handle = engine.start(WORKFLOW, {"key": half.key}, concurrency=quota, ticket=ticket)
        finisher.add(handle.run_id, seconds, half, time.monotonic())

    def polite(rng: random.Random) -> None:
        try:
            while not no_new.is_set():
                first = time.monotonic()
                request = Request(half.variant, 0, 0.0)
                ticket: str | None = None
                last_expiry: datetime.datetime | None = None
                refusal_times: list[tuple[int, int, float]] = []
                while True:
                    retry = None
                    if ticket is not None:
                        row = QuotaTicket.objects.filter(id=read_ticket(ticket).id).first()
                        retry = Retry(
                            request.retry_afters[-1],
                            row.expires_at if row else None,
                            last_expiry,
                            timezone.now(),
                        )
                        request.presented.append(retry)
                    try:
                        start(rng, ticket)
                    except ConcurrencyLimitError as error:
                        refused_at = timezone.now()
                        response = too_many_requests(error)
                        seconds = int(response["Retry-After"])
                        new = response.get(HEADER) if half.fair else None
                        if retry is not None:
                            shown = read_ticket(ticket).id if ticket is not None else None
                            same = new is not None and read_ticket(new).id == shown
                            retry.outcome = "refused, place kept" if same else "refused, new ticket"
                            retry.held, retry.active = error.held, error.active
                        ticket = new
                        last_expiry = refused_at + datetime.timedelta(
                            seconds=error.retry_after + args.window
                        )
                        request.retries += 1
                        request.retry_afters.append(seconds)
                        ahead = error.line.ahead if error.line is not None else 0
                        refusal_times.append((seconds, ahead, time.monotonic()))
                        if give_up.wait(seconds):
                            request.admitted = False
                            break
                        continue
                    if retry is not None:
                        retry.outcome = "admitted"
                    break
                done = time.monotonic()
                request.wait = done - first
                request.refusals = [
                    (seconds, ahead, done - at if request.admitted else None)
                    for seconds, ahead, at in refusal_times
                ]
                with half.lock:
                    half.requests.append(request)
                time.sleep(rng.uniform(0, 1))
        finally:
            connection.close()

    def flood(rng: random.Random) -> None:
        try:
            while not polite_done.is_set():
                try:
                    start(rng, None)
                    admitted = 1
                except ConcurrencyLimitError:
                    admitted = 0
                with half.lock:
                    half.flood_attempts += 1
                    half.flood_admitted += admitted
                time.sleep(args.flood_pause)
        finally:
            connection.close()

    def abandoner(rng: random.Random) -> None:
        try:
            while not polite_done.is_set():
                try:
                    start(rng, None)
                except ConcurrencyLimitError as error:
                    try:
                        start(rng, error.ticket)  # joins the line, and is never seen again
                    except ConcurrencyLimitError:
                        with half.lock:
                            half.abandoned += 1
                time.sleep(args.abandon_pause)
        finally:
            connection.close()

    def sampler() -> None:
        try:
            while not sampler_stop.is_set():
                active = engine.count_runs(tag=f"concurrency:{half.key}", statuses=ACTIVE)
                half.max_active = max(half.max_active, active)
                half.samples += 1
                half.active_sum += active
                time.sleep(0.02)
        finally:
            connection.close()

    polite_threads = [
        threading.Thread(target=polite, args=(random.Random(seeds.random()),), daemon=True)
        for _ in range(args.polite)
    ]
    others = [
        threading.Thread(target=flood, args=(random.Random(seeds.random()),), daemon=True)
        for _ in range(args.flood)
    ]
    if half.variant == ABANDONED:
        others.append(
            threading.Thread(target=abandoner, args=(random.Random(seeds.random()),), daemon=True)
        )
    others.append(threading.Thread(target=sampler, daemon=True))
    for thread in [*others, *polite_threads]:
        thread.start()
    time.sleep(args.seconds / 2)
    no_new.set()
    deadline = time.monotonic() + args.drain
    for thread in polite_threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    give_up.set()
    for thread in polite_threads:
        thread.join()
    polite_done.set()
    for thread in others[:-1]:
        thread.join()
    while finisher.pending():  # the key's runs end before the next half begins
        time.sleep(0.05)
    sampler_stop.set()
    others[-1].join()
    half.durations = [b - a for a, b in half.spans]


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most runs whose (admitted, freeing) spans overlap at one moment."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "n/a"


def report(halves: list[Half], args: argparse.Namespace) -> None:
    rows = []
    goals: list[tuple[str, bool | None, str]] = []
    over_lines = []
    for variant in VARIANTS:
        mine = [half for half in halves if half.variant == variant]
        requests = [r for half in mine for r in half.requests]
        durations = [d for half in mine for d in half.durations]
        refused = [r for r in requests if r.retries]
        at_once = sum(1 for r in requests if not r.retries)
        first = sum(1 for r in refused if r.admitted and r.retries == 1)
        soon = sum(1 for r in refused if r.admitted and r.retries <= 2)
        cut = sum(1 for r in requests if not r.admitted)
        waits = [r.wait for r in requests]  # a request cut off: the wait so far
        median_run = statistics.median(durations)
        worst = max(waits)
        at_least = ">= " if cut else ""
        flood = sum(half.flood_admitted for half in mine)
        flood_attempts = sum(half.flood_attempts for half in mine)
        sampled = max(half.max_active for half in mine)
        overlapped = max(max_overlap(half.spans) for half in mine)
        rows.append(
            f"| {variant} | {len(requests)} ({cut} cut off) | {share(at_once, len(requests))} "
            f"| {share(first, len(refused))} | {share(soon, len(refused))} "
            f"({share(at_once + soon, len(requests))}) "
            f"| {statistics.median(waits):.2f} s | {percentile(waits, 0.95):.2f} s "
            f"| {at_least}{worst:.2f} s | {at_least}{worst / median_run:.2f} "
            f"| {at_least}{max(r.retries for r in requests)} "
            f"| {flood} of {flood_attempts} "
            f"| {sum(h.active_sum for h in mine) / sum(h.samples for h in mine):.2f} |"
        )
        over = max(sampled, overlapped) > args.limit
        over_lines.append(
            f"{variant}: most active runs sampled {sampled} "
            f"({sum(h.samples for h in mine)} samples), most overlapping spans {overlapped}, "
            f"limit {args.limit}: over-admission "
            + ("none" if not over else f"{max(sampled, overlapped) - args.limit} over")
        )
        goals.append(
            (
                f"{variant}: no over-admission",
                not over,
                f"most active {max(sampled, overlapped)}, limit {args.limit}",
            )
        )
        if variant == ABANDONED:
            goals.append(
                (
                    f"{ABANDONED} (reference): tickets abandoned in line",
                    None,
                    f"{sum(half.abandoned for half in mine)}; refused polite requests "
                    f"admitted at 1st or 2nd retry {share(soon, len(refused))}",
                )
            )
        elif variant == "fair":
            goals.append(
                (
                    f"fair: refused polite requests admitted at 1st or 2nd retry "
                    f">= {GOAL_SOON:.0%}",
                    bool(refused) and soon / len(refused) >= GOAL_SOON,
                    f"{share(soon, len(refused))} ({soon} of {len(refused)})",
                )
            )
            goals.append(
                (
                    f"fair: worst wait <= {GOAL_WORST:g} x median run duration",
                    worst <= GOAL_WORST * median_run,
                    f"{at_least}{worst:.2f} s = {at_least}{worst / median_run:.2f} x "
                    f"{median_run:.2f} s",
                )
            )
        else:
            goals.append(
                (
                    "not fair (reference, 9-18 % expected): refused polite requests "
                    "admitted at 1st or 2nd retry",
                    None,
                    f"{share(soon, len(refused))} ({soon} of {len(refused)})",
                )
            )
    print(
        f"\nlimit {args.limit}, runs {args.duration:g} s ± {SPREAD:.0%}, {args.polite} polite "
        f"clients, {args.flood} flood client(s) pausing {args.flood_pause * 1000:g} ms, "
        f"fair_window {args.window:g} s, {args.seconds:g} s per variant (A B C A B C); "
        f"the abandoner pauses {args.abandon_pause * 1000:g} ms" + "\n"
    )
    print(
        "| variant | polite requests | admitted at once | at 1st retry (of refused) "
        "| at 1st or 2nd retry: of refused (of all, incl. at once) | median wait "
        "| p95 wait | worst wait | worst / median run | most retries | flood admitted "
        "| mean active |"
    )
    print("| --- " * 12 + "|")
    for row in rows:
        print(row)
    print()
    for line in over_lines:
        print(line)
    print()
    for name, met, figure in goals:
        mark = "" if met is None else ("met" if met else "MISSED")
        print(f"- {name}: {figure} {mark}".rstrip())
    diagnostics(halves, args)


def diagnostics(halves: list[Half], args: argparse.Namespace) -> None:
    requests = [r for half in halves if half.variant == "fair" for r in half.requests]
    retries = [p for r in requests for p in r.presented]
    if not retries:
        return
    print("\nfair variant, retries presenting a ticket:")
    outcomes = Counter(p.outcome for p in retries)
    for outcome, count in outcomes.most_common():
        print(f"- {outcome}: {count} ({share(count, len(retries))})")
    expired = [p for p in retries if p.kept_expires is not None and p.kept_expires <= p.came_back]
    unkept = [p for p in retries if p.kept_expires is None]
    held = [
        p
        for p in retries
        if p.kept_expires is not None
        and p.kept_expiry_set is not None
        and p.kept_expires < p.kept_expiry_set - datetime.timedelta(seconds=0.2)
    ]
    print(
        f"- came back with the ticket not kept (first return, or row gone): {len(unkept)}; "
        f"kept: {len(retries) - len(unkept)}"
    )
    print(f"- kept, and its expiry brought down by a hold (its turn came): {len(held)}")
    if held:
        # the hold began a window before the expiry it set: from then to the holder's
        # return, the slot it holds stays idle
        idle = [
            (p.came_back - p.kept_expires).total_seconds() + args.window  # type: ignore[operator]
            for p in held
        ]
        print(
            f"  the held slot idle until its holder came back: median "
            f"{statistics.median(idle):.2f} s, p90 {percentile(idle, 0.9):.2f} s, "
            f"max {max(idle):.2f} s"
        )
    if expired:
        late = [(p.came_back - p.kept_expires).total_seconds() for p in expired]  # type: ignore[operator]
        print(
            f"- kept, but expired when it came back: {len(expired)} "
            f"({share(len(expired), len(retries) - len(unkept))} of kept); late by median "
            f"{statistics.median(late):.2f} s, max {max(late):.2f} s; of these, held: "
            f"{sum(1 for p in expired if p in held)}; their Retry-After: "
            f"{dict(sorted(Counter(p.retry_after for p in expired).items()))}; "
            f"outcomes: {dict(Counter(p.outcome for p in expired))}"
        )
    else:
        print("- kept, but expired when it came back: 0")
    refused_kept = [p for p in retries if p.outcome == "refused, place kept"]
    if refused_kept:
        print(
            f"- refused keeping its place: held for older tickets (median) "
            f"{statistics.median(p.held for p in refused_kept):g}, active (median) "
            f"{statistics.median(p.active for p in refused_kept):g}; with a free slot "
            f"(active < limit): {sum(1 for p in refused_kept if p.active < args.limit)}"
        )
    print("fair variant, each refusal's Retry-After against the time to admission after it:")
    refusals = [x for r in requests for x in r.refusals if x[2] is not None]
    groups: dict[str, Callable[[int], bool]] = {
        "no ticket ahead": lambda ahead: ahead == 0,
        f"1-{args.limit - 1} units ahead": lambda ahead: 0 < ahead < args.limit,
        f">= {args.limit} units ahead": lambda ahead: ahead >= args.limit,
    }
    for name, test in groups.items():
        group = [(ra, left) for ra, ahead, left in refusals if test(ahead)]
        if not group:
            continue
        early = [left - ra for ra, left in group if left > ra + 0.05]  # type: ignore[operator]
        print(
            f"- {name}: {len(group)} refusals, Retry-After median "
            f"{statistics.median(ra for ra, _ in group):g} s, admission after median "
            f"{statistics.median(left for _, left in group):.2f} s "  # type: ignore[type-var]
            f"(p90 {percentile([left for _, left in group], 0.9):.2f} s); "  # type: ignore[misc]
            f"Retry-After short of it: {share(len(early), len(group))}"
        )
    for variant in VARIANTS:
        sample = [r for half in halves if half.variant == variant for r in half.requests]
        afters = Counter(ra for r in sample for ra in r.retry_afters)
        spread = Counter(min(r.retries, 5) for r in sample)
        print(
            f"{variant}: Retry-After given {dict(sorted(afters.items()))}; requests by "
            f"retries (5 = 5 or more) {dict(sorted(spread.items()))}"
        )


def main() -> None:
    args = parse_args()
    from benchmarks.common.database import set_up_django

    set_up_django(args.database)

    from durable_django import Engine, workflow

    @workflow(name=WORKFLOW, version="1")
    def fair_run(ctx: Any, input: dict[str, Any]) -> None:  # never executed: no worker
        return None

    engine = Engine(enqueue=False)
    rng = random.Random(args.seed)
    finisher = Finisher(engine)
    finisher.start()
    halves: list[Half] = []
    for variant in (*VARIANTS, *VARIANTS):
        half = Half(variant, f"fair:{uuid.uuid4().hex}", variant != "not fair")
        seed_history(half.key, rng, args)
        print(f"{variant}: half {len(halves) // len(VARIANTS) + 1} ...", flush=True)
        run_half(engine, finisher, half, args)
        halves.append(half)
    with finisher.cond:
        finisher.stopping = True
        finisher.cond.notify()
    finisher.join()
    report(halves, args)


if __name__ == "__main__":
    main()
