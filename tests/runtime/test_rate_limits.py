"""Rate limits on starting runs: counted from the runs created in a sliding window, all or
nothing with the concurrency quotas, on every start path, with an exact ``retry_after``;
through the engine, on the ORM store (each test database) and the memory store, with a
driven clock."""

from __future__ import annotations

import datetime
import json
import math

import pytest
from django.utils import timezone

from durable_django import (
    ChildWorkflowError,
    Concurrency,
    ConcurrencyLimitError,
    Engine,
    RateLimit,
    RateLimitError,
    RunStatus,
)
from durable_django._rules.admission import rate_retry_after
from durable_django._rules.concurrency import Quota
from durable_django.http import too_many_requests
from durable_django.testing import run_until_idle

from ..helpers import echo, force_status


def refused(engine: Engine, *args: object, **kwargs: object) -> RateLimitError:
    """The rate limit refusal of ``engine.start(*args, **kwargs)``, which created nothing."""
    before = {run.run_id for run in engine.list_runs()}
    with pytest.raises(RateLimitError) as caught:
        engine.start(*args, **kwargs)  # type: ignore[arg-type]
    assert {run.run_id for run in engine.list_runs()} == before
    return caught.value


def per_start(limit: int = 3, per: float = 60, weight: int = 1, key: str = "k") -> RateLimit:
    return RateLimit(key=key, limit=limit, per=per, weight=weight)


def test_the_start_over_the_limit_is_refused_with_the_exact_retry_after(engine, clock):
    engine.register("echo", "1", echo)
    for second in (0, 10, 20):
        clock.to(second)
        engine.start("echo", {}, rate_limit=per_start())
    clock.to(25)
    error = refused(engine, "echo", {}, rate_limit=per_start())
    assert isinstance(error, ConcurrencyLimitError)
    assert (error.key, error.limit, error.active, error.per) == ("k", 3, 3, 60.0)
    assert error.retry_after == 35.0  # the run of second 0 leaves the window at second 60
    clock.to(60 - 0.000001)
    assert refused(engine, "echo", {}, rate_limit=per_start()).retry_after == 0.000001
    clock.to(60)
    assert engine.start("echo", {}, rate_limit=per_start()).created


def test_finished_runs_count_until_they_leave_the_window(engine, clock):
    engine.register("echo", "1", echo)
    handles = [engine.start("echo", {}, rate_limit=per_start(limit=2)) for _ in range(2)]
    force_status(engine, handles[0].run_id, RunStatus.COMPLETED)
    force_status(engine, handles[1].run_id, RunStatus.FAILED)
    clock.advance(59)
    assert refused(engine, "echo", {}, rate_limit=per_start(limit=2)).active == 2
    clock.advance(1)
    engine.start("echo", {}, rate_limit=per_start(limit=2))


def test_weights_leave_the_window_oldest_first(engine, clock):
    """Tokens per minute: the retry waits until enough of the oldest units have left."""
    engine.register("echo", "1", echo)
    for second, tokens in ((0, 400), (10, 300), (20, 200)):
        clock.to(second)
        engine.start("echo", {}, rate_limit=per_start(limit=1000, weight=tokens))
    clock.to(30)
    error = refused(engine, "echo", {}, rate_limit=per_start(limit=1000, weight=500))
    assert (error.active, error.retry_after) == (900, 30.0)  # the 400 leave at second 60
    clock.to(30)
    error = refused(engine, "echo", {}, rate_limit=per_start(limit=1000, weight=800))
    assert error.retry_after == 40.0  # 400 + 300 must leave: second 70
    clock.to(69)
    engine.start("echo", {}, rate_limit=per_start(limit=1000, weight=100))  # fits now
    error = refused(engine, "echo", {}, rate_limit=per_start(limit=1000, weight=500))
    assert error.retry_after == 1.0  # second 70: the 300 leave; 200 + 100 + 500 fit
    clock.to(70)
    engine.start("echo", {}, rate_limit=per_start(limit=1000, weight=500))


def test_declared_rate_limits_and_the_per_start_option(engine, clock):
    engine.register(
        "chat",
        "1",
        echo,
        concurrency=Concurrency(key=lambda i: f"tenant:{i['t']}", limit=8),
        rate_limit=[
            RateLimit(key=lambda i: f"tenant:{i['t']}", limit=2, per=datetime.timedelta(minutes=1)),
            RateLimit(key=lambda i: f"tokens:{i['t']}", limit=100, per=60, weight=lambda i: i["n"]),
        ],
    )
    engine.start("chat", {"t": "a", "n": 60})
    error = refused(engine, "chat", {"t": "a", "n": 60})
    assert (error.key, error.active, error.limit) == ("tokens:a", 60, 100)
    engine.start("chat", {"t": "a", "n": 40})
    assert refused(engine, "chat", {"t": "a", "n": 1}).key == "tenant:a"
    # A per-start rate limit replaces the declared ones; the declared quota still applies.
    engine.start("chat", {"t": "a", "n": 1}, rate_limit=per_start(key="other"))
    with pytest.raises(ConcurrencyLimitError) as caught:
        engine.start(
            "chat",
            {"t": "a", "n": 1},
            rate_limit=per_start(key="other"),
            concurrency={"key": "tenant:a", "limit": 3},
        )
    assert not isinstance(caught.value, RateLimitError)
    # A per-start quota replaces the declared quotas; the declared rate limits still apply.
    clock.advance(60)
    engine.start("chat", {"t": "a", "n": 1}, concurrency={"key": "x", "limit": 9})
    assert engine.count_runs(tag="concurrency:tenant:a") == 3
    assert engine.count_runs(tag="rate:tenant:a") == 3


def test_all_or_nothing_with_the_concurrency_quotas(engine, clock):
    engine.register("echo", "1", echo)
    both = {"concurrency": {"key": "k", "limit": 1}, "rate_limit": per_start(limit=5)}
    engine.start("echo", {}, **both)
    for _ in range(3):  # refused by the quota: the window counts nothing for them
        with pytest.raises(ConcurrencyLimitError):
            engine.start("echo", {}, **both)
    assert engine.store.rate_units([Quota("k", 5, (), 1, None, 60.0)], timezone.now(), None) == [1]
    engine.start("echo", {}, rate_limit=per_start(limit=2))
    error = refused(
        engine, "echo", {}, rate_limit=per_start(limit=2), concurrency={"key": "c", "limit": 5}
    )
    assert error.key == "k"
    assert engine.count_runs(tag="concurrency:c") == 0  # refused by the rate limit: no slot


def test_a_limit_no_start_fits_says_per(engine, clock):
    engine.register("echo", "1", echo)
    error = refused(engine, "echo", {}, rate_limit=per_start(limit=0, per=30))
    assert (error.active, error.retry_after) == (0, 30.0)


def test_a_run_committed_while_the_start_waited_gives_no_more_than_per():
    # The start read its clock at second 0, then waited for its key's lock; meanwhile a
    # run created at second 0.004 committed and fills the window.
    start = timezone.now()
    quota = Quota("k", 1, (), per=0.25)
    window = [(start + datetime.timedelta(seconds=0.004), 1)]
    assert rate_retry_after(quota, window, start) == 0.25
    assert rate_retry_after(quota, window, start + datetime.timedelta(seconds=0.1)) == 0.154
    # Two units counted at the start's second 0; by the present the first has left.
    quota = Quota("k", 2, (), per=0.25)
    window = [
        (start - datetime.timedelta(seconds=0.249), 1),
        (start + datetime.timedelta(seconds=0.002), 1),
    ]
    assert rate_retry_after(quota, window, start) == 0.0
    assert rate_retry_after(quota, [window[0], (start, 1)], start) == 0.001


def test_a_batch_is_admitted_in_order(engine, clock):
    engine.register("echo", "1", echo)
    batch = engine.start_many("echo", [{}] * 5, rate_limit=per_start(limit=3))
    assert len(batch.started) == 3
    assert [index for index, _ in batch.refused] == [3, 4]
    for _, error in batch.refused:
        assert isinstance(error, RateLimitError)
        assert error.retry_after == 60.0


def test_a_child_refused_by_a_rate_limit(engine, clock):
    engine.register("child", "1", echo, rate_limit=RateLimit(key=lambda i: "c", limit=1, per=10))

    def parent(ctx, input):
        try:
            return ctx.child("child", {})
        except ChildWorkflowError as error:
            return {"type": type(error.cause).__name__, "retry_after": error.cause.retry_after}

    engine.register("parent", "1", parent)
    engine.start("child", {})
    clock.advance(4)
    handle = engine.start("parent", {})
    run_until_idle(engine)
    assert engine.get_run(handle.run_id).output == {"type": "RateLimitError", "retry_after": 6.0}


def test_an_event_skips_the_subscriber_its_rate_limit_refuses(engine, clock):
    engine.register("a", "1", echo, on_event=["paid"], rate_limit=RateLimit(lambda i: "k", 1, 60))
    engine.register("b", "1", echo, on_event=["paid"])
    engine.publish_event("paid", {})
    second = engine.publish_event("paid", {})
    assert [handle.workflow for handle in second.started] == ["b"]
    ((name, error),) = second.skipped
    assert name == "a" and isinstance(error, RateLimitError)


def test_namespaces_are_counted_apart_when_reads_are_scoped(registry, db, clock):
    from durable_django.stores import OrmStore

    store = OrmStore()
    blue = Engine(store=store, registry=registry, enqueue=False, namespace="blue", scope_reads=True)
    green = Engine(
        store=store, registry=registry, enqueue=False, namespace="green", scope_reads=True
    )
    blue.register("echo", "1", echo)
    blue.start("echo", {}, rate_limit=per_start(limit=1))
    green.start("echo", {}, rate_limit=per_start(limit=1))
    with pytest.raises(RateLimitError):
        blue.start("echo", {}, rate_limit=per_start(limit=1))


def test_the_429_response_says_the_exact_retry_after_rounded_up(engine, clock):
    engine.register("echo", "1", echo)
    engine.start("echo", {}, rate_limit=per_start(limit=1, per=10))
    clock.advance(2.5)
    error = refused(engine, "echo", {}, rate_limit=per_start(limit=1, per=10))
    response = too_many_requests(error)
    assert response.status_code == 429
    assert response["Retry-After"] == str(math.ceil(7.5)) == "8"
    assert json.loads(response.content)["key"] == "k"


def test_an_idempotent_restart_is_never_refused(engine, clock):
    engine.register("echo", "1", echo)
    engine.start("echo", {}, "same", rate_limit=per_start(limit=1))
    assert not engine.start("echo", {}, "same", rate_limit=per_start(limit=1)).created


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"key": 3, "limit": 1, "per": 1}, TypeError, "key must be"),
        ({"key": "k", "limit": True, "per": 1}, TypeError, "limit must be"),
        ({"key": "k", "limit": 1, "per": 0}, ValueError, "per must be more than 0"),
        ({"key": "k", "limit": 1, "per": "1"}, TypeError, "per must be seconds"),
        ({"key": "k", "limit": 1, "per": 1, "weight": 0}, ValueError, "weight must be between"),
        ({"key": "k", "limit": 2, "per": 1, "weight": 3}, ValueError, "no start could ever"),
    ],
)
def test_bad_rate_limits_are_refused_where_they_are_made(kwargs, error, message):
    with pytest.raises(error, match=message):
        RateLimit(**kwargs)


def test_a_declared_rate_limit_needs_a_key_function_and_a_per_start_one_a_str(engine):
    with pytest.raises(TypeError, match="must be a callable"):
        engine.register("bad", "1", echo, rate_limit=RateLimit("k", 1, 1))
    engine.register("echo", "1", echo)
    with pytest.raises(TypeError, match="per-start rate limit key must be a str"):
        engine.start("echo", {}, rate_limit=RateLimit(lambda i: "k", 1, 1))
    with pytest.raises(ValueError, match="unknown rate limit option"):
        engine.start("echo", {}, rate_limit={"key": "k", "limit": 1, "per": 1, "x": 1})
    with pytest.raises(ValueError, match="reserved for rate limits"):
        engine.start("echo", {}, tags=["rate:k"])
    assert engine.list_runs() == []


def test_the_window_is_read_from_its_index_alone(orm_engine, clock):
    """The window's sum searches the (tag, created_at, weight) index from the window's
    start: the key's older history is never read (PostgreSQL's and MariaDB's plans)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable_django._core.records import NewRun

    if connection.vendor not in ("postgresql", "mysql"):
        pytest.skip("EXPLAIN output is PostgreSQL's and MariaDB's")
    store = orm_engine.store
    for number in range(60):
        store.create_run(NewRun(f"old-{number}", "wf", "1", "default", {}, tags=("rate:k",)))
    clock.to(3600)
    store.create_run(NewRun("new", "wf", "1", "default", {}, tags=("rate:k",)))
    quota = Quota("k", 10, (), 1, None, 60.0)
    with CaptureQueriesContext(connection) as queries:
        assert store.rate_units([quota], timezone.now(), None) == [1]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")  # a small table would be scanned
            cursor.execute("EXPLAIN " + queries[0]["sql"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "durable_tag_window_idx" in plan
            conditions = [line for line in plan.splitlines() if "Index Cond" in line]
            assert conditions and all("created_at" in line for line in conditions)
        else:
            cursor.execute("EXPLAIN " + queries[0]["sql"])
            columns = [column[0] for column in cursor.description]
            (row,) = cursor.fetchall()
            found = dict(zip(columns, row, strict=True))
            assert found["key"] == "durable_tag_window_idx"
            assert found["type"] == "range"
            assert int(found["rows"]) < 60


def test_purge_keeps_the_runs_still_inside_a_declared_window(engine, clock):
    engine.register("limited", "1", echo, rate_limit=RateLimit(lambda i: "k", 1, per=3600))
    engine.register("echo", "1", echo)
    handle = engine.start("limited", {})
    other = engine.start("echo", {})
    for run_id in (handle.run_id, other.run_id):
        force_status(engine, run_id, RunStatus.COMPLETED, finished_at=timezone.now())
    clock.advance(1800)
    assert engine.purge(datetime.timedelta(seconds=60)).runs == 0  # within the hour's window
    with pytest.raises(RateLimitError):
        engine.start("limited", {})
    clock.advance(1801)
    assert engine.purge(datetime.timedelta(seconds=60)).runs == 2
    assert engine.start("limited", {}).created


def test_the_tasks_backend_takes_a_rate_limit_per_task():
    """``OPTIONS["rate_limit"]`` of the django.tasks backend, checked on any Django: each
    enqueue of the task passes its entry as the start's ``rate_limit``."""
    from django.core.exceptions import ImproperlyConfigured

    from durable_django._rules.task_quotas import backend_settings

    checked = backend_settings(
        "default",
        {
            "OPTIONS": {
                "rate_limit": {
                    "myapp.tasks.report": {
                        "key_function": lambda *a, **k: f"r:{a[0]}",
                        "limit": 5,
                        "per": 60,
                    }
                }
            }
        },
    )
    rate = checked.rate_limits["myapp.tasks.report"]
    assert rate.for_call(["acme"], {}) == {"key": "r:acme", "limit": 5, "per": 60.0}
    assert checked.quotas == {}
    for bad, message in (
        ({"key": "k", "limit": 5}, "'per' is missing"),
        ({"key": "k", "limit": 5, "per": 0}, "per must be more than 0"),
        ({"key": "k", "limit": 5, "per": 1, "count_statuses": []}, "unknown rate_limit option"),
    ):
        with pytest.raises(ImproperlyConfigured, match=message):
            backend_settings("default", {"OPTIONS": {"rate_limit": {"myapp.tasks.report": bad}}})
