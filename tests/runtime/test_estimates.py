"""Refusals that explain themselves: ``retry_after`` estimated from a key's history,
``engine.quota_holders`` oldest first, and the fallback when nothing is known."""

from __future__ import annotations

import datetime
import pickle
import random
import statistics
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from durable_django import ConcurrencyLimitError, DurableError, Engine, RunStatus
from durable_django._runtime import estimates as estimates_module
from durable_django._runtime.estimates import HISTORY, NO_HISTORY, READ_FAILED, Holder
from durable_django.models import Run, RunTag
from durable_django.stores import OrmStore

from ..helpers import echo, force_status

ACTIVE = ("pending", "running", "suspended", "blocked")


def ago(seconds: float) -> datetime.datetime:
    return timezone.now() - datetime.timedelta(seconds=seconds)


def keyed(engine: Engine, limit: int) -> None:
    engine.register("chat.turn", "1", echo, concurrency={"key": lambda i: i["key"], "limit": limit})


def holding(engine: Engine, key: str, age: float) -> str:
    """A run holding ``key``, created ``age`` seconds ago."""
    run_id = engine.start("chat.turn", {"key": key}).run_id
    force_status(engine, run_id, RunStatus.PENDING, created_at=ago(age))
    return run_id


def finished(engine: Engine, key: str, duration: float, ended: float = 60.0) -> str:
    """A run of ``key`` that held its slot ``duration`` seconds, ending ``ended`` ago."""
    run_id = engine.start("chat.turn", {"key": key}).run_id
    end = ago(ended)
    force_status(
        engine,
        run_id,
        RunStatus.COMPLETED,
        created_at=end - datetime.timedelta(seconds=duration),
        finished_at=end,
    )
    return run_id


def refusal(engine: Engine, key: str) -> ConcurrencyLimitError:
    with pytest.raises(ConcurrencyLimitError) as caught:
        engine.start("chat.turn", {"key": key})
    return caught.value


# the fallback ------------------------------------------------------------------------


def test_a_key_without_history_says_one_second_and_creates_nothing(engine: Engine):
    keyed(engine, 2)
    holding(engine, "tenant:acme", 5)
    holding(engine, "tenant:acme", 3)
    error = refusal(engine, "tenant:acme")
    assert error.retry_after == 1.0
    assert error.estimate.basis == NO_HISTORY
    assert 4.5 < error.estimate.oldest_age < 60
    assert engine.count_runs(tag="concurrency:tenant:acme") == 2  # nothing created


def test_an_error_made_by_hand_says_one_second():
    error = ConcurrencyLimitError("chat.turn", "tenant:acme", 8, 8)
    assert (error.retry_after, error.estimate) == (1.0, None)
    assert ConcurrencyLimitError("chat.turn", "k", 1, 1, retry_after=0.2).retry_after == 1.0
    copy = pickle.loads(pickle.dumps(ConcurrencyLimitError("w", "k", 1, 1, retry_after=7.5)))
    assert (copy.key, copy.retry_after) == ("k", 7.5)


# the holders -------------------------------------------------------------------------


def test_the_holders_are_listed_oldest_first(engine: Engine):
    keyed(engine, 3)
    finished(engine, "tenant:acme", 3)  # holds nothing
    middle = holding(engine, "tenant:acme", 20)
    newest = holding(engine, "tenant:acme", 5)
    oldest = holding(engine, "tenant:acme", 40)
    holding(engine, "tenant:globex", 100)  # another key
    held = engine.quota_holders("tenant:acme")
    assert [holder.run_id for holder in held] == [oldest, middle, newest]
    assert all(isinstance(holder, Holder) for holder in held)
    assert [holder.workflow for holder in held] == ["chat.turn"] * 3
    assert [holder.status for holder in held] == ["pending"] * 3
    assert 39 < held[0].age < 100 and 4 < held[2].age < 20
    assert held[0].created_at < held[1].created_at < held[2].created_at

    error = refusal(engine, "tenant:acme")
    assert [holder.run_id for holder in error.holders()] == [oldest, middle, newest]
    assert engine.quota_holders("tenant:nobody") == []


def test_an_error_that_knows_no_engine_says_where_to_ask_for_its_holders():
    copy = pickle.loads(pickle.dumps(ConcurrencyLimitError("w", "tenant:acme", 1, 1)))
    with pytest.raises(DurableError, match=r"engine\.quota_holders\('tenant:acme'\)"):
        copy.holders()


def test_the_holders_are_those_of_the_read_namespace(registry, db):
    blue = Engine(store=OrmStore(), registry=registry, enqueue=False, namespace="blue")
    green = Engine(
        store=blue.store, registry=registry, enqueue=False, namespace="green", scope_reads=True
    )
    keyed(blue, 5)
    ours = holding(green, "k", 2)
    holding(blue, "k", 3)
    assert [holder.run_id for holder in green.quota_holders("k")] == [ours]
    assert len(blue.quota_holders("k")) == 2


@pytest.mark.django_db
def test_holders_are_read_with_two_indexed_queries(registry):
    engine = Engine(store=OrmStore(), registry=registry, enqueue=False)
    keyed(engine, 5)
    for age in (3, 2, 1):
        holding(engine, "k", age)
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        estimates_module.estimate(engine, "k", 3)
    selects = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    assert len(selects) == 2, selects
    assert all("durable_run_tag" in sql and "tag" in sql for sql in selects)


def test_a_weighted_refusal_waits_for_enough_units_to_free(engine: Engine):
    engine.register(
        "chat.turn",
        "1",
        echo,
        concurrency={
            "key": lambda i: i["key"],
            "limit": 4,
            "weight": lambda i: i.get("units", 1),
        },
    )
    for _ in range(5):
        finished(engine, "gpu", 10)
    light = engine.start("chat.turn", {"key": "gpu", "units": 1}).run_id
    force_status(engine, light, RunStatus.PENDING, created_at=ago(7))  # 3 s left
    heavy = engine.start("chat.turn", {"key": "gpu", "units": 2}).run_id
    force_status(engine, heavy, RunStatus.PENDING, created_at=ago(4))  # 6 s left
    assert [h.units for h in engine.quota_holders("gpu")] == [1, 2]

    with pytest.raises(ConcurrencyLimitError) as caught:  # 3 + 2 > 4: one unit must free
        engine.start("chat.turn", {"key": "gpu", "units": 2})
    assert (caught.value.active, caught.value.limit) == (3, 4)
    assert 2.0 < caught.value.retry_after <= 3.0  # the light holder's end is enough

    with pytest.raises(ConcurrencyLimitError) as caught:  # 3 + 4 > 4: three units must free
        engine.start("chat.turn", {"key": "gpu", "units": 4})
    assert 5.0 < caught.value.retry_after <= 6.0  # both holders must end
    assert engine.count_runs(tag="concurrency:gpu") == 7  # nothing created


# the estimate ------------------------------------------------------------------------


def test_the_estimate_is_what_the_oldest_holder_has_left(engine: Engine):
    keyed(engine, 2)
    for _ in range(5):
        finished(engine, "tenant:acme", 10)
    holding(engine, "tenant:acme", 4)
    holding(engine, "tenant:acme", 7)
    error = refusal(engine, "tenant:acme")
    assert error.estimate.basis == HISTORY
    assert (error.estimate.samples, error.estimate.typical) == (5, 10.0)
    assert 2.0 < error.retry_after <= 3.0  # 10 s - 7 s, less the time the test took


def test_an_overdue_holder_is_given_half_the_typical_duration(engine: Engine):
    keyed(engine, 1)
    for duration in (8, 10, 12):
        finished(engine, "tenant:acme", duration)
    holding(engine, "tenant:acme", 30)
    assert refusal(engine, "tenant:acme").retry_after == 5.0


def test_over_the_limit_waits_for_enough_holders_to_end(engine: Engine):
    keyed(engine, 3)
    for _ in range(3):
        finished(engine, "tenant:acme", 10)
    for age in (9, 6, 2):
        holding(engine, "tenant:acme", age)
    # The limit came down to 2: two runs must end before a third fits.
    with pytest.raises(ConcurrencyLimitError) as caught:
        engine.start(
            "chat.turn", {"key": "tenant:acme"}, concurrency={"key": "tenant:acme", "limit": 2}
        )
    assert 3.0 < caught.value.retry_after <= 4.0


def test_retry_after_is_never_below_one_second(engine: Engine):
    keyed(engine, 1)
    for _ in range(3):
        finished(engine, "tenant:acme", 0.2)
    holding(engine, "tenant:acme", 0.1)
    error = refusal(engine, "tenant:acme")
    assert error.estimate.basis == HISTORY
    assert error.retry_after == 1.0


def test_history_outside_the_window_is_not_read(engine: Engine):
    keyed(engine, 1)
    finished(engine, "tenant:acme", 10, ended=estimates_module.HISTORY_WINDOW.total_seconds() + 60)
    holding(engine, "tenant:acme", 1)
    assert refusal(engine, "tenant:acme").estimate.basis == NO_HISTORY


def test_at_most_the_latest_runs_are_read(engine: Engine):
    keyed(engine, 1)
    for n in range(estimates_module.HISTORY_RUNS + 5):
        finished(engine, "tenant:acme", 4 if n < 5 else 10, ended=1000 - n)
    holding(engine, "tenant:acme", 0)
    estimate = refusal(engine, "tenant:acme").estimate
    assert (estimate.samples, estimate.typical) == (estimates_module.HISTORY_RUNS, 10.0)


def test_the_pure_parts():
    recorded = [1.0, 2.0, 3.0, 4.0]
    assert estimates_module.remaining(0.0, recorded) == 2.5
    assert estimates_module.remaining(2.5, recorded) == 1.0  # 3 and 4 lasted past 2.5
    assert estimates_module.remaining(9.0, recorded) == 1.25  # half the median
    held = [Holder("a", "w", "running", None, None, age) for age in (3.5, 0.0)]
    assert estimates_module.soonest_free(held, recorded, limit=2) == 0.5
    assert estimates_module.soonest_free(held, recorded, limit=1) == 2.5
    assert estimates_module.soonest_free(held, recorded, limit=3) == 0.0


class FailingSpans(OrmStore):
    """A store whose history read is refused by the database (a real error)."""

    def finished_spans(self, *args, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM durable_run")
        return []  # never reached: the estimate would then say "no history"


@pytest.mark.django_db
def test_a_failed_read_falls_back_and_leaves_the_transaction_usable(registry):
    from django.db import transaction

    engine = Engine(store=FailingSpans(), registry=registry, enqueue=False)
    keyed(engine, 1)
    with transaction.atomic():
        holding(engine, "k", 1)
        error = refusal(engine, "k")
        assert (error.retry_after, error.estimate.basis) == (1.0, READ_FAILED)
        assert engine.count_runs(tag="concurrency:k") == 1  # the transaction goes on


# is it useful? -----------------------------------------------------------------------

#: Runs last 2 s ± 20 %.
TYPICAL, SPREAD = 2.0, 0.2


def simulated_error(engine: Engine, rng: random.Random, limit: int) -> tuple[float, float]:
    """One refusal on a key in a steady state: ``HISTORY_RUNS`` finished runs of known
    durations, then ``limit`` holders part-way through runs of the same distribution.
    Returns the refusal's ``retry_after`` and when the next slot truly frees (the
    holders' written durations against their ages: a driven clock)."""
    key = f"sim:{uuid.uuid4().hex}"
    now = timezone.now()
    runs, tags = [], []

    def add(status: str, created: datetime.datetime, finished_at: datetime.datetime | None):
        run_id = uuid.uuid4().hex
        runs.append(
            Run(
                id=run_id,
                workflow="chat.turn",
                version="1",
                namespace="default",
                status=status,
                input={"key": key},
                created_at=created,
                updated_at=created,
                finished_at=finished_at,
            )
        )
        tags.append(
            RunTag(run_id=run_id, tag=f"concurrency:{key}", status=status, namespace="default")
        )

    def duration() -> float:
        return rng.uniform(TYPICAL * (1 - SPREAD), TYPICAL * (1 + SPREAD))

    for n in range(estimates_module.HISTORY_RUNS):
        ended = now - datetime.timedelta(seconds=1 + n * TYPICAL / limit)
        add("completed", ended - datetime.timedelta(seconds=duration()), ended)
    left = []
    for _ in range(limit):
        total = duration()
        age = rng.uniform(0, total)
        left.append(total - age)
        add("running", now - datetime.timedelta(seconds=age), None)
    Run.objects.bulk_create(runs)
    RunTag.objects.bulk_create(tags)
    error = refusal(engine, key)
    late = (timezone.now() - now).total_seconds()  # the clock moved while refusing
    return error.retry_after, min(left) - late


@pytest.mark.django_db
@pytest.mark.parametrize("limit", [1, 3])
def test_the_estimate_is_close_to_when_the_next_slot_frees(registry, limit):
    engine = Engine(store=OrmStore(), registry=registry, enqueue=False)
    keyed(engine, limit)
    rng = random.Random(limit)
    errors = []
    for _ in range(30):
        retry_after, actual = simulated_error(engine, rng, limit)
        assert retry_after >= 1.0
        errors.append(abs(retry_after - max(actual, 1.0)))
    assert statistics.median(errors) <= 0.25 * TYPICAL, errors


# manage.py durable quota --estimate ----------------------------------------------------


def test_the_quota_command_shows_the_estimate(db):
    from durable_django import engine as default_engine

    from ..helpers import durable, durable_json

    now = timezone.now()
    for _ in range(3):
        run_id = default_engine.start("tests.echo", {"key": "tenant:acme"}).run_id
        force_status(
            default_engine,
            run_id,
            RunStatus.COMPLETED,
            created_at=now - datetime.timedelta(seconds=100),
            finished_at=now - datetime.timedelta(seconds=70),
        )
    for age in (20, 10, 5):
        run_id = default_engine.start("tests.echo", {"key": "tenant:acme"}).run_id
        force_status(
            default_engine,
            run_id,
            RunStatus.RUNNING,
            created_at=now - datetime.timedelta(seconds=age),
        )
    default_engine.start("tests.echo", {"key": "tenant:globex"})
    default_engine.start("tests.plain", {}, concurrency={"key": "adhoc", "limit": 9})

    lines = durable("quota", "--estimate").splitlines()
    assert lines[0].split() == [
        "KEY", "ACTIVE", "LIMIT", "USE", "OLDEST", "NEXT", "SLOT", "WORKFLOWS"
    ]  # fmt: skip
    acme = lines[1].split()
    assert acme[:4] == ["tenant:acme", "3", "3", "[##########]"]
    assert acme[4] == "full" and acme[5].startswith("20.")
    assert acme[6].startswith("~9.") or acme[6] == "~10.0s"
    by_key = {line.split()[0]: line.split() for line in lines[1:]}
    assert by_key["tenant:globex"][-2] == "free"
    assert by_key["adhoc"][-2] == "?"  # no limit known, no history: when its run ends is unknown

    (found,) = durable_json("quota", "tenant:acme", "--estimate")
    assert found["basis"] == "history"
    assert 9 < found["retry_after"] <= 10 and 20 <= found["oldest_age"] < 30
    assert "retry_after" not in durable_json("quota", "tenant:acme")[0]  # only when asked
