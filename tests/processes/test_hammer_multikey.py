"""Several weighted quotas on one start, under real concurrency: starters released
together, each under its own list of overlapping keys in its own order, with mixed
weights, in threads and in spawned processes, on every database the suite supports.

Whatever the interleaving: at every sampled instant each key's counted runs weigh at
most its limit; no database error (a deadlock above all) escapes a start; a refused start
leaves no row, and names a key of its list whose units and its weight exceed the limit;
a created run carries one tag per quota, with the quota's weight. Without runs ending
meanwhile, every refusal is also justified by what the key holds at the end.
"""

from __future__ import annotations

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
from tests.hammer_multikey import (
    LIMIT,
    Plan,
    Result,
    plan,
    process_main,
    run_threads,
    trial_keys,
)
from tests.hammer_worker import make_engine
from tests.hammering import reports_of

from ..hammer import PATIENCE, STORES

pytestmark = pytest.mark.slow

TRIALS = 20
THREADS = 24
PROCESSES = 3
THREADS_PER_PROCESS = 8


def units_by_key(tags: list[str]) -> dict[str, int]:
    """Each tag's counted units, read in one statement (one snapshot)."""
    rows = (
        RunTag.objects.filter(tag__in=tags, status__in=ACTIVE_STATUSES)
        .values_list("tag")
        .annotate(units=Sum("weight"))
    )
    return {tag.removeprefix("concurrency:"): int(units) for tag, units in rows}


class Watch:
    """A thread sampling every key's units until stopped, and, with ``cancel``, another
    cancelling random pending runs of the test meanwhile, so slots free while starts go
    on."""

    def __init__(self, engine: object, prefix: str, keys: list[str], cancel: bool) -> None:
        self.engine = engine
        self.prefix = prefix
        self.tags = [f"concurrency:{key}" for key in keys]
        self.stop = threading.Event()
        self.samples = 0
        self.cancelled = 0
        self.over: list[dict[str, int]] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._sample, name="multikey-sampler")]
        if cancel:
            self.threads.append(threading.Thread(target=self._cancel, name="multikey-canceller"))

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
                units = units_by_key(self.tags)
                self.samples += 1
                over = {key: held for key, held in units.items() if held > LIMIT}
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


def check(results: list[Result], plans: dict[str, Plan], watch: Watch, runs_ended: bool) -> None:
    errors = [r for r in results if r.kind == "error"]
    assert not errors, "\n\n".join(f"{r.run_id}:\n{r.detail}" for r in errors)
    assert not watch.errors, watch.errors
    assert watch.samples > 0
    assert not watch.over, f"keys over their limit of {LIMIT}: {watch.over[:5]}"
    assert sorted(r.run_id for r in results) == sorted(plans)
    created = [r for r in results if r.kind == "created"]
    refused = [r for r in results if r.kind == "refused"]
    assert created and refused, (len(created), len(refused))
    # A refused start left nothing.
    refused_ids = [r.run_id for r in refused]
    assert not Run.objects.filter(pk__in=refused_ids).exists()
    assert not RunTag.objects.filter(run_id__in=refused_ids).exists()
    # A created run carries each of its quotas' tags, with its weight.
    stored: dict[str, dict[str, int]] = defaultdict(dict)
    for run_id, tag, weight in RunTag.objects.filter(
        run_id__in=[r.run_id for r in created]
    ).values_list("run_id", "tag", "weight"):
        stored[run_id][tag] = weight
    for result in created:
        expected = {f"concurrency:{key}": weight for key, weight in plans[result.run_id].quotas}
        assert stored[result.run_id] == expected, result.run_id
    # The refusals name a key of their list, in units.
    final = units_by_key(watch.tags)
    for result in refused:
        weights = dict(plans[result.run_id].quotas)
        assert result.key in weights and result.limit == LIMIT, result
        assert result.active + weights[result.key] > LIMIT, result
        if not runs_ended:  # units only grew: the key still cannot take this start
            assert final.get(result.key, 0) + weights[result.key] > LIMIT, result
    assert all(held <= LIMIT for held in final.values()), final


def plans_for(prefix: str, names: list[str], trials: int) -> dict[str, Plan]:
    every = (plan(prefix, trial, name) for trial in range(trials) for name in names)
    return {start.run_id: start for start in every}


def all_keys(prefix: str, trials: int) -> list[str]:
    return [key for trial in range(trials) for key in trial_keys(prefix, trial)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("runs_end", [False, True], ids=["no-run-ends", "runs-end"])
@pytest.mark.parametrize("fast_path", STORES)
def test_threads_under_overlapping_weighted_quotas(fast_path: bool, runs_end: bool) -> None:
    engine = make_engine(fast_path)
    prefix = uuid.uuid4().hex[:10]
    names = [f"t{n}" for n in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    with Watch(engine, prefix, all_keys(prefix, TRIALS), cancel=runs_end) as watch:
        results = run_threads(engine, prefix, names, TRIALS, barrier, PATIENCE)
    check(results, plans_for(prefix, names, TRIALS), watch, runs_ended=runs_end)
    if runs_end:
        assert watch.cancelled > 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", STORES)
def test_processes_under_overlapping_weighted_quotas(fast_path: bool) -> None:
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
            name=f"multikey-process-{index}",
        )
        for index, names in enumerate(groups)
    ]
    with Watch(engine, prefix, all_keys(prefix, TRIALS), cancel=True) as watch:
        results: list[Result] = reports_of(children, out, PATIENCE * 4)
    names = [name for group in groups for name in group]
    check(results, plans_for(prefix, names, TRIALS), watch, runs_ended=True)
    assert [child.exitcode for child in children] == [0] * PROCESSES
