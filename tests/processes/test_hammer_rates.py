"""Rate limits under real concurrency: starters released together, each making a burst of
weighted starts under a rate limit and a concurrency quota (in an order of its own), in
threads and in spawned processes, on every database the suite supports, while pending
runs are cancelled so that slots free.

Whatever the interleaving: from the runs' creation times, no window of length ``per``
ending at a run's creation time holds more than the limit; at every sampled instant the
concurrency key holds at most its slots; no database error escapes a start; a refused
start leaves no row; a rate refusal's ``retry_after`` is within its window.
"""

from __future__ import annotations

import datetime
import multiprocessing
import random
import threading
import uuid
from collections import defaultdict

import pytest
from django.db import connection
from django.db.models import Sum

from durable_django._core.lifecycle import ACTIVE_STATUSES
from durable_django.models import Run, RunTag
from tests.hammer_rates import (
    PER,
    RATE_LIMIT,
    SLOTS,
    Plan,
    Result,
    plans,
    process_main,
    run_threads,
    trial_keys,
)
from tests.hammer_worker import make_engine
from tests.hammering import reports_of

from ..hammer import PATIENCE, STORES

pytestmark = pytest.mark.slow

TRIALS = 6
THREADS = 12
PROCESSES = 3
THREADS_PER_PROCESS = 4


class Watch:
    """A thread sampling the concurrency keys' units until stopped, and another
    cancelling random pending runs of the test meanwhile."""

    def __init__(self, engine: object, prefix: str, trials: int) -> None:
        self.engine = engine
        self.prefix = prefix
        self.tags = [f"concurrency:{trial_keys(prefix, trial)[1]}" for trial in range(trials)]
        self.stop = threading.Event()
        self.samples = 0
        self.cancelled = 0
        self.over: list[dict[str, int]] = []
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._sample, name="rates-sampler"),
            threading.Thread(target=self._cancel, name="rates-canceller"),
        ]

    def __enter__(self) -> Watch:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(PATIENCE)

    def _sample(self) -> None:
        try:
            while not self.stop.is_set():
                rows = (
                    RunTag.objects.filter(tag__in=self.tags, status__in=ACTIVE_STATUSES)
                    .values_list("tag")
                    .annotate(units=Sum("weight"))
                )
                self.samples += 1
                over = {tag: int(units) for tag, units in rows if units > SLOTS}
                if over:
                    self.over.append(over)
        except BaseException as error:
            self.errors.append(error)
        finally:
            connection.close()

    def _cancel(self) -> None:
        draw = random.Random(self.prefix)
        try:
            while not self.stop.wait(0.002):
                pending = list(
                    Run.objects.filter(pk__startswith=f"{self.prefix}-", status="pending")
                    .values_list("pk", flat=True)
                    .order_by("-created_at")[:20]
                )
                if pending:
                    self.cancelled += self.engine.cancel(draw.choice(pending))  # type: ignore[attr-defined]
        except BaseException as error:
            self.errors.append(error)
        finally:
            connection.close()


def windows_over(prefix: str, trials: int) -> list[tuple[str, str, int]]:
    """Every run of the rate keys whose window (``per`` seconds up to its creation time)
    holds more than the limit: ``(key, run id, units)``, from the tag rows' creation
    times and weights."""
    per = datetime.timedelta(seconds=PER)
    over = []
    for trial in range(trials):
        key = trial_keys(prefix, trial)[0]
        rows = sorted(
            RunTag.objects.filter(tag=f"rate:{key}").values_list("created_at", "weight", "run_id")
        )
        for created_at, _, run_id in rows:
            units = sum(w for at, w, _ in rows if created_at - per < at <= created_at)
            if units > RATE_LIMIT:
                over.append((key, run_id, units))
    return over


def check(results: list[Result], planned: dict[str, Plan], watch: Watch, prefix: str) -> None:
    errors = [r for r in results if r.kind == "error"]
    assert not errors, "\n\n".join(f"{r.run_id}:\n{r.detail}" for r in errors)
    assert not watch.errors, watch.errors
    assert watch.samples > 0 and watch.cancelled > 0
    assert not watch.over, f"concurrency keys over {SLOTS}: {watch.over[:5]}"
    assert sorted(r.run_id for r in results) == sorted(planned)
    created = [r for r in results if r.kind == "created"]
    refused = [r for r in results if r.kind == "refused"]
    by_rate = [r for r in refused if r.per]
    assert created and by_rate, (len(created), len(by_rate))
    refused_ids = [r.run_id for r in refused]
    assert not Run.objects.filter(pk__in=refused_ids).exists()
    assert not RunTag.objects.filter(run_id__in=refused_ids).exists()
    for result in by_rate:
        weight = planned[result.run_id].weight
        assert result.active + weight > RATE_LIMIT, result
        # 0 when the window read for it had moved on since the refusal: it fits now.
        assert 0 <= result.retry_after <= PER, result
    # A created run carries both tags; its rate tag its weight and its creation time.
    stored: dict[str, dict[str, tuple[int, object]]] = defaultdict(dict)
    for run_id, tag, weight, at in RunTag.objects.filter(
        run_id__in=[r.run_id for r in created]
    ).values_list("run_id", "tag", "weight", "created_at"):
        stored[run_id][tag] = (weight, at)
    for result in created:
        rate_key, slot_key = trial_keys(prefix, result.trial)
        tags = stored[result.run_id]
        assert set(tags) == {f"rate:{rate_key}", f"concurrency:{slot_key}"}, result.run_id
        weight, at = tags[f"rate:{rate_key}"]
        assert weight == planned[result.run_id].weight and at is not None
    assert not windows_over(prefix, TRIALS)


def planned_for(prefix: str, names: list[str], trials: int) -> dict[str, Plan]:
    every = (
        start for trial in range(trials) for name in names for start in plans(prefix, trial, name)
    )
    return {start.run_id: start for start in every}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", STORES)
def test_threads_under_a_rate_limit_and_a_quota(fast_path: bool) -> None:
    engine = make_engine(fast_path)
    prefix = uuid.uuid4().hex[:10]
    names = [f"t{n}" for n in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    with Watch(engine, prefix, TRIALS) as watch:
        results = run_threads(engine, prefix, names, TRIALS, barrier, PATIENCE)
    check(results, planned_for(prefix, names, TRIALS), watch, prefix)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", STORES)
def test_processes_under_a_rate_limit_and_a_quota(fast_path: bool) -> None:
    context = multiprocessing.get_context("spawn")
    prefix = uuid.uuid4().hex[:10]
    groups = [[f"p{p}t{t}" for t in range(THREADS_PER_PROCESS)] for p in range(PROCESSES)]
    barrier = context.Barrier(PROCESSES * THREADS_PER_PROCESS)
    out = context.Queue()
    db_name = connection.settings_dict["NAME"]
    engine = make_engine(fast_path)
    children = [
        context.Process(
            target=process_main,
            args=(db_name, fast_path, prefix, names, TRIALS, barrier, PATIENCE * 2, out),
            name=f"rates-process-{index}",
        )
        for index, names in enumerate(groups)
    ]
    with Watch(engine, prefix, TRIALS) as watch:
        results: list[Result] = reports_of(children, out, PATIENCE * 4)
    names = [name for group in groups for name in group]
    check(results, planned_for(prefix, names, TRIALS), watch, prefix)
    assert [child.exitcode for child in children] == [0] * PROCESSES
