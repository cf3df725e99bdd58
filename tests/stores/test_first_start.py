"""The first start on a PostgreSQL connection: the start function's work sent as
statements (``first_start.statements``), which a new server process plans faster than it
compiles the function. It must do exactly what ``durable_start_run_v2`` does, and the two
must serialise against each other on the same keys."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from durable_django import ConcurrencyLimitError
from durable_django._core.records import NewRun, StartOutcome
from durable_django._rules.concurrency import Quota
from durable_django.models import Run, RunTag
from durable_django.stores.orm import OrmStore
from durable_django.stores.postgres import first_start

from ..helpers import every_start_a_first

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the statements replace a PostgreSQL function"
)

ACTIVE = ("pending", "running", "suspended", "blocked")


@pytest.fixture(params=["function", "statements"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once with every start calling the function, once sending statements."""
    if request.param == "statements":
        every_start_a_first(monkeypatch)
    else:
        connection.ensure_connection()
        first_start._STARTED.add(connection.connection)
    sent = []
    real = first_start.statements

    def spied(*args: Any, **kwargs: Any) -> tuple[str, list[Any]]:
        sent.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(first_start, "statements", spied)
    yield request.param
    assert bool(sent) == (request.param == "statements")


def new_run(run_id: str = "", *, namespace: str = "default", tags: tuple[str, ...] = ()) -> NewRun:
    return NewRun(
        run_id=run_id or uuid.uuid4().hex,
        workflow="tests.first",
        version="1",
        namespace=namespace,
        input={"n": 1},
        tags=tags,
        queue="q",
    )


def quota(key: str, limit: int, weight: int = 1, statuses: tuple[str, ...] = ACTIVE) -> Quota:
    return Quota(key, limit, statuses, weight)


def start(
    run: NewRun,
    quotas: tuple[Quota, ...],
    *,
    check_existing: bool = False,
    read_namespace: str | None = None,
) -> StartOutcome | ConcurrencyLimitError:
    tags = run.tags + tuple(f"concurrency:{q.key}" for q in quotas)
    try:
        return OrmStore().start_run(
            NewRun(
                run_id=run.run_id,
                workflow=run.workflow,
                version=run.version,
                namespace=run.namespace,
                input=run.input,
                tags=tags,
                queue=run.queue,
            ),
            quotas,
            check_existing=check_existing,
            read_namespace=read_namespace,
        )
    except ConcurrencyLimitError as error:
        return error


@pytest.mark.django_db
def test_a_start_creates_the_run_and_its_tags_with_their_weights(path: str) -> None:
    run = new_run(tags=("plain",))
    quotas = (quota("b:user", 10, 3), quota("a:tenant", 10, 2))

    outcome = start(run, quotas)

    assert outcome == StartOutcome(created=True, workflow="tests.first", namespace="default")
    row = Run.objects.get(id=run.run_id)
    assert (row.status, row.queue, row.input, row.attempt) == ("pending", "q", {"n": 1}, 1)
    assert row.created_at == row.updated_at
    assert sorted(RunTag.objects.filter(run_id=run.run_id).values_list("tag", "weight")) == [
        ("concurrency:a:tenant", 2),
        ("concurrency:b:user", 3),
        ("plain", 1),
    ]


@pytest.mark.django_db
def test_the_first_quota_that_refuses_is_named_and_nothing_is_created(path: str) -> None:
    for _ in range(2):
        start(new_run(), (quota("k:one", 5, 2), quota("k:two", 5, 2)))
    run = new_run()

    outcome = start(run, (quota("k:one", 9, 1), quota("k:two", 5, 2), quota("k:three", 0)))

    assert isinstance(outcome, ConcurrencyLimitError)
    assert (outcome.key, outcome.limit, outcome.active) == ("k:two", 5, 4)
    assert not Run.objects.filter(id=run.run_id).exists()
    assert not RunTag.objects.filter(run_id=run.run_id).exists()


@pytest.mark.django_db
def test_a_run_that_exists_is_returned_and_never_refused(path: str) -> None:
    run = new_run()
    assert isinstance(start(run, (quota("k:full", 1),)), StartOutcome)

    again = start(run, (quota("k:full", 1),), check_existing=True)

    assert again == StartOutcome(created=False, workflow="tests.first", namespace="default")
    assert Run.objects.filter(id=run.run_id).count() == 1
    assert RunTag.objects.filter(run_id=run.run_id).count() == 1


@pytest.mark.django_db
def test_an_existing_id_not_checked_for_is_found_after_the_insert(path: str) -> None:
    run = new_run()
    start(run, ())

    again = start(run, (quota("k:room", 5),), check_existing=False)

    assert again == StartOutcome(created=False, workflow="tests.first", namespace="default")
    assert not RunTag.objects.filter(tag="concurrency:k:room").exists()


@pytest.mark.django_db
def test_only_the_counted_statuses_and_the_read_namespace_count(path: str) -> None:
    for namespace in ("one", "one", "two"):
        start(new_run(namespace=namespace), (quota("k:ns", 10),))
    RunTag.objects.filter(namespace="two").update(status="running")

    in_one = start(new_run(namespace="one"), (quota("k:ns", 2),), read_namespace="one")
    running = start(new_run(), (quota("k:ns", 1, statuses=("running",)),))
    ended = start(new_run(), (quota("k:ns", 1, statuses=("completed",)),))

    assert isinstance(in_one, ConcurrencyLimitError) and in_one.active == 2
    assert isinstance(running, ConcurrencyLimitError) and running.active == 1
    assert isinstance(ended, StartOutcome) and ended.created


@pytest.mark.django_db
def test_an_unlimited_start_and_a_limit_of_zero(path: str) -> None:
    assert isinstance(start(new_run(), ()), StartOutcome)
    refused = start(new_run(), (quota("k:zero", 0),))
    assert isinstance(refused, ConcurrencyLimitError) and refused.active == 0


#: Texts PostgreSQL's array input would read as syntax if they were not quoted.
ARRAY_SYNTAX = ('quote"d', "back\\slash", '\\"', "{brace},comma", "NULL", " padded ", "é")


@pytest.mark.django_db
def test_keys_and_tags_holding_array_syntax_are_kept_as_given(path: str) -> None:
    run = new_run(tags=ARRAY_SYNTAX)
    # Rows of statuses of two lengths: the shorter one is padded.
    quotas = (*(quota(text, 1) for text in ARRAY_SYNTAX), quota("narrow", 5, 2, ("pending",)))

    assert isinstance(start(run, quotas), StartOutcome)
    tags = RunTag.objects.filter(run_id=run.run_id).values_list("tag", "weight")
    assert sorted(tags) == sorted(
        [
            *((text, 1) for text in ARRAY_SYNTAX),
            *((f"concurrency:{text}", 1) for text in ARRAY_SYNTAX),
            ("concurrency:narrow", 2),
        ]
    )
    for text in ARRAY_SYNTAX:
        refused = start(new_run(), (quota("other", 9), quota(text, 1)))
        assert isinstance(refused, ConcurrencyLimitError)
        assert (refused.key, refused.active) == (text, 1)


@pytest.mark.django_db(transaction=True)
def test_only_a_connections_first_start_sends_statements(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = []
    real = first_start.statements
    monkeypatch.setattr(first_start, "statements", lambda *a: sent.append(a) or real(*a))
    connection.close()

    for _ in range(3):
        start(new_run(), (quota("k:first", 10),))

    assert len(sent) == 1


#: Starters and trials of the mixed hammer, and the limit of its keys.
THREADS = 12
TRIALS = 12
LIMIT = 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("keys", [1, 2], ids=["one-key", "two-keys"])
def test_statements_and_the_function_admit_exactly_the_limit_together(
    keys: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half the starters start each on a new connection (the statements), half on a
    kept one (the function), released together; under two overlapping keys with
    weights, each in its own order."""
    barrier = threading.Barrier(THREADS)
    outcomes: list[tuple[int, str, Any]] = []
    names = [[f"mixed-{uuid.uuid4().hex}-{k}" for k in range(keys)] for _ in range(TRIALS)]

    def starter(number: int) -> None:
        try:
            for trial in range(TRIALS):
                quotas = tuple(
                    quota(key, LIMIT * 2 if keys == 2 else LIMIT, weight=2 if keys == 2 else 1)
                    for key in names[trial]
                )
                if number % 2:
                    connection.close()  # a new connection: statements
                    quotas = quotas[::-1]
                barrier.wait(60)
                kind = "statements" if number % 2 else "function"
                outcomes.append((trial, kind, start(new_run(), quotas)))
        finally:
            connection.close()

    sent: list[int] = []
    real = first_start.statements
    monkeypatch.setattr(first_start, "statements", lambda *a: sent.append(1) or real(*a))
    threads = [threading.Thread(target=starter, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(sent) >= THREADS // 2 * TRIALS  # each new connection's start
    assert len(outcomes) == THREADS * TRIALS
    errors = [o for o in outcomes if not isinstance(o[2], StartOutcome | ConcurrencyLimitError)]
    assert not errors
    created = Counter(trial for trial, _, o in outcomes if isinstance(o, StartOutcome))
    assert created == dict.fromkeys(range(TRIALS), LIMIT)
    # Both paths started in every trial; which of them the admitted starts took is the
    # race's to decide.
    assert {kind for _, kind, _ in outcomes} == {"function", "statements"}
    assert Run.objects.filter(workflow="tests.first").count() == LIMIT * TRIALS
