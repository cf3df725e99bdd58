"""Values a store can hold: one check before anything is written, the same on every
database, and a turn whose end the database refuses still ends the run."""

from __future__ import annotations

import math

import pytest
from django.db import DatabaseError, connection, transaction

from durable_django import Engine, RunStatus, UnstorableValueError
from durable_django._core.limits import MAX_ERROR_MESSAGE, MAX_JSON_BYTES, MAX_JSON_DEPTH
from durable_django._core.serialization import json_copy, storable_text
from durable_django.models import Run, Step
from durable_django.stores import OrmStore
from durable_django.testing import run_until_idle

from ..database_refusal import MESSAGE, refusing
from ..helpers import NUL, SURROGATE, nested

ONE_SLOT = {"key": "k", "limit": 1}


# the check ----------------------------------------------------------------------------


def cyclic() -> list:
    value: list = []
    value.append(value)
    return value


@pytest.mark.parametrize(
    ("value", "path", "rule"),
    [
        ({"a": [1, {"b": NUL}]}, "$.a[1].b", "it contains a NUL character (\\x00) at index 1"),
        ([SURROGATE], "$[0]", "surrogate code point (U+D800, which UTF-8 cannot encode)"),
        ({"\udfff": 1}, "$", "the key '\\udfff': it contains a surrogate code point (U+DFFF"),
        ({"ok": {"a b": {"x\x00": 1}}}, '$.ok["a b"]', "the key 'x\\x00': it contains a NUL"),
        (nested(MAX_JSON_DEPTH + 1), "$" + "[0]" * MAX_JSON_DEPTH, "nested more than 20 levels"),
        (nested(200_000), "$" + "[0]" * MAX_JSON_DEPTH, "nested more than 20 levels"),
        (cyclic(), "$" + "[0]" * MAX_JSON_DEPTH, "(or contains itself)"),
        ({"x": {1, 2}}, "$.x", "set is not JSON-serialisable"),
        ({"x": [math.nan]}, "$.x[0]", "nan is not JSON-serialisable (JSON has no NaN"),
        ({(1, 2): 1}, "$", "a key of type tuple is not JSON-serialisable"),
        ("y" * MAX_JSON_BYTES, "$", f"it is {MAX_JSON_BYTES + 2:,} bytes as JSON; at most"),
    ],
)
def test_what_no_store_can_hold_is_named_with_its_path_and_rule(value, path, rule):
    with pytest.raises(UnstorableValueError) as refused:
        json_copy(value, "the input of workflow 'wf'")
    error = refused.value
    assert (error.what, error.path) == ("the input of workflow 'wf'", path)
    assert rule in error.rule


@pytest.mark.parametrize(
    "value",
    [
        nested(MAX_JSON_DEPTH),
        "y" * (MAX_JSON_BYTES - 2),  # with its quotes, exactly the limit
        "\\u0000 and \\ud800 written out, \U0001f600 and \ud7ff are fine",
        {"\x01\x1f": "\x7f", "é": ["日本", "\U0010ffff"]},
        [[{"a": []}] * 3] * 3,
    ],
)
def test_values_at_the_limits_are_stored_and_read_back_on_every_database(orm_engine: Engine, value):
    assert json_copy(value, "x") == value
    orm_engine.register("wf", "1", lambda ctx, i: ctx.step("same", lambda: i))
    handle = orm_engine.start("wf", value)
    run_until_idle(orm_engine)
    assert handle.result() == value
    assert Run.objects.get(pk=handle.run_id).input == value
    assert Step.objects.get(run_id=handle.run_id).result == value


def test_the_largest_value_fits_a_mariadb_statement_even_escaped(orm_engine: Engine):
    # Each backslash is two characters of JSON, and the driver escapes both again.
    value = "\\" * (MAX_JSON_BYTES // 2 - 1)
    orm_engine.register("wf", "1", lambda ctx, i: i)
    handle = orm_engine.start("wf", value)
    run_until_idle(orm_engine)
    assert handle.result() == value


def test_storable_text_replaces_what_databases_refuse_and_bounds_the_length():
    assert storable_text(f"{NUL}{SURROGATE}", 100) == "a\ufffdba\ufffdb"
    assert storable_text("abcdef", 3) == "abc[3 characters cut]"
    assert storable_text("abcdef", 3, keep_end=True) == "[3 characters cut]def"


# a run's values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "path", "rule"),
    [
        ({"x": NUL}, "$.x", "NUL character"),
        ({"x": [SURROGATE]}, "$.x[0]", "surrogate code point"),
        (nested(32), "$" + "[0]" * MAX_JSON_DEPTH, "nested more than 20 levels"),
        ({"big": "y" * (3 * 1024 * 1024)}, "$", "bytes as JSON"),
    ],
)
def test_an_output_no_store_can_hold_fails_the_run_and_frees_its_slot(
    orm_engine: Engine, output, path, rule
):
    orm_engine.register("wf", "1", lambda ctx, i: output if i == "bad" else "fine")
    handle = orm_engine.start("wf", "bad", concurrency=ONE_SLOT)
    run_until_idle(orm_engine)
    run = orm_engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED and run.output is None
    assert run.error["type"] == "durable_django.errors.UnstorableValueError"
    assert run.error["value"] == "the output of workflow 'wf'"
    assert run.error["path"] == path and rule in run.error["rule"]
    assert run.error["message"].startswith("the output of workflow 'wf' cannot be stored")
    # The slot is free: the next start under the same one-slot key is admitted.
    assert orm_engine.start("wf", "ok", concurrency=ONE_SLOT).created


def test_a_step_result_no_store_can_hold_fails_the_step_not_the_turn(orm_engine: Engine):
    calls = []

    def fetch():
        calls.append(1)
        return {"page": NUL} if len(calls) == 1 else {"page": "clean"}

    def body(ctx, input):
        return ctx.step("fetch", fetch, retries=1, backoff=0)

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    run_until_idle(orm_engine)
    [step] = orm_engine.store.get_steps(handle.run_id)
    assert step.error["value"] == "the result of step 'fetch'"
    assert step.error["path"] == "$.page" and step.error["attempts"] == 1
    # The retry returns a value the store holds: the run goes on and completes.
    Run.objects.filter(pk=handle.run_id).update(wake_at=None)
    orm_engine.wake(handle.run_id)
    run_until_idle(orm_engine)
    assert handle.result() == {"page": "clean"} and len(calls) == 2


def test_a_last_step_no_store_can_hold_fails_the_run_with_the_step_named(orm_engine: Engine):
    def body(ctx, input):
        ctx.step("first", lambda: 1)
        return ctx.step("last", lambda: nested(50))

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {}, concurrency=ONE_SLOT)
    run_until_idle(orm_engine)
    run = orm_engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error["step"] == "last" and run.error["value"] == "the result of step 'last'"
    assert [(s.name, s.error is None) for s in orm_engine.store.get_steps(run.run_id)] == [
        ("first", True),
        ("last", False),
    ]
    assert orm_engine.start("wf", {}, concurrency=ONE_SLOT).created


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (RuntimeError(f"bad {NUL} and {SURROGATE}"), "bad a\ufffdb and a\ufffdb"),
        (RuntimeError("x" * (5 * MAX_JSON_BYTES)), "x" * MAX_ERROR_MESSAGE),
        (Unprintable(), "<str() of Unprintable failed>"),
    ],
)
def test_an_error_is_made_storable(orm_engine: Engine, error, message):
    def body(ctx, input):
        raise error

    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {}, concurrency=ONE_SLOT)
    run_until_idle(orm_engine)
    run = orm_engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error["message"].startswith(message)
    assert "\x00" not in run.error["traceback"]
    assert orm_engine.start("wf", {}, concurrency=ONE_SLOT).created


# a turn's end the database refuses anyway ------------------------------------------------

MARKER = "refused-by-a-trigger"


def contains_marker(column: str) -> str:
    """SQL true when the new row's ``column`` (text or JSON) contains MARKER."""
    cast = "::text" if connection.vendor == "postgresql" else ""
    return f"NEW.{column}{cast} LIKE '%{MARKER}%'"


@pytest.fixture
def first_time_only():
    """SQL true only the first time it is evaluated, whatever is rolled back: a sequence
    (PostgreSQL, MariaDB), or a function of this connection (SQLite)."""
    vendor = connection.vendor
    if vendor == "sqlite":
        calls = []
        connection.ensure_connection()
        connection.connection.create_function(
            "durable_test_first", 0, lambda: calls.append(1) or len(calls) == 1
        )
        yield "durable_test_first()"
        return
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE durable_test_calls")
    yield (
        "nextval('durable_test_calls') = 1"
        if vendor == "postgresql"
        else "NEXTVAL(durable_test_calls) = 1"
    )
    with connection.cursor() as cursor:
        cursor.execute("DROP SEQUENCE durable_test_calls")


FAST_PATHS = [
    pytest.param(True, id="fast path"),
    pytest.param(
        False,
        id="portable path",
        marks=pytest.mark.skipif(
            connection.vendor != "postgresql", reason="only PostgreSQL has two paths"
        ),
    ),
]


def engine_on(registry, fast_path: bool) -> Engine:
    return Engine(store=OrmStore(fast_path=fast_path), registry=registry, enqueue=False)


def assert_ended_unwritten(engine: Engine, run_id: str, unwritten: str) -> None:
    run = engine.get_run(run_id)
    assert run.status == RunStatus.FAILED and run.finished_at is not None
    assert run.lease_owner == "" and run.wait is None and run.output is None
    assert run.error["unwritten"] == unwritten
    assert run.error["message"].startswith(f"the end of the turn ({unwritten}) could not be")
    assert MESSAGE in run.error["message"] and run.error["message"].isascii()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", FAST_PATHS)
def test_an_output_the_database_refuses_ends_the_run_failed(registry, fast_path):
    engine = engine_on(registry, fast_path)
    engine.register("wf", "1", lambda ctx, i: {"note": i})
    with refusing("durable_run", "UPDATE", contains_marker("output")):
        handle = engine.start("wf", MARKER, concurrency=ONE_SLOT)
        assert engine.execute(handle.run_id)
    assert_ended_unwritten(engine, handle.run_id, "completed")
    assert engine.start("wf", "next", concurrency=ONE_SLOT).created
    assert run_until_idle(engine) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", FAST_PATHS)
def test_a_last_record_the_database_refuses_ends_the_run_failed(registry, fast_path):
    engine = engine_on(registry, fast_path)

    def body(ctx, input):
        ctx.step("first", lambda: "kept")
        return ctx.step("last", lambda: MARKER)  # recorded with the end of the turn

    engine.register("wf", "1", body)
    with refusing("durable_step", "INSERT", contains_marker("result")):
        handle = engine.start("wf", {}, concurrency=ONE_SLOT)
        assert engine.execute(handle.run_id)
    assert_ended_unwritten(engine, handle.run_id, "completed")
    assert [s.name for s in engine.store.get_steps(handle.run_id)] == ["first"]
    assert engine.start("wf", {}, concurrency=ONE_SLOT).created


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", FAST_PATHS)
def test_a_wait_the_database_refuses_ends_the_run_failed(registry, fast_path):
    engine = engine_on(registry, fast_path)
    engine.register("wf", "1", lambda ctx, i: ctx.wait_for_signal(MARKER))
    with refusing("durable_run", "UPDATE", contains_marker("wait")):
        handle = engine.start("wf", {}, concurrency=ONE_SLOT)
        assert engine.execute(handle.run_id)
    assert_ended_unwritten(engine, handle.run_id, "suspended")
    assert engine.start("wf", {}, concurrency=ONE_SLOT).created


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", FAST_PATHS)
def test_a_record_refused_mid_turn_fails_the_run(registry, fast_path):
    engine = engine_on(registry, fast_path)

    def body(ctx, input):
        ctx.step("first", lambda: MARKER)  # recorded when the next durable call comes
        return ctx.step("second", lambda: 2)

    engine.register("wf", "1", body)
    with refusing("durable_step", "INSERT", contains_marker("result")):
        handle = engine.start("wf", {}, concurrency=ONE_SLOT)
        assert engine.execute(handle.run_id)
    run = engine.get_run(handle.run_id)
    assert run.status == RunStatus.FAILED and MESSAGE in run.error["message"]
    assert engine.start("wf", {}, concurrency=ONE_SLOT).created


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast_path", FAST_PATHS)
def test_a_write_refused_once_is_written_on_the_second_try(registry, fast_path, first_time_only):
    engine = engine_on(registry, fast_path)
    engine.register("wf", "1", lambda ctx, i: {"note": i})
    condition = f"{contains_marker('output')} AND {first_time_only}"
    with refusing("durable_run", "UPDATE", condition):
        handle = engine.start("wf", MARKER)
        assert engine.execute(handle.run_id)
    assert handle.result(timeout=30) == {"note": MARKER}


@pytest.mark.django_db(transaction=True)
def test_when_even_the_failed_end_is_refused_the_run_is_left_to_its_lease(orm_engine: Engine):
    orm_engine.register("wf", "1", lambda ctx, i: i)
    handle = orm_engine.start("wf", {})
    # The claim sets a lease owner; every end of a turn clears it: refuse those.
    with (
        refusing("durable_run", "UPDATE", "NEW.lease_owner = ''"),
        pytest.raises(DatabaseError),
    ):
        orm_engine.execute(handle.run_id)
    run = orm_engine.get_run(handle.run_id)
    assert run.status == RunStatus.RUNNING and run.lease_expires_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_refused_end_inside_a_transaction_leaves_it_usable(orm_engine: Engine):
    """Inside a transaction of the caller's (a test's), each write is in a savepoint."""
    orm_engine.register("wf", "1", lambda ctx, i: {"note": i})
    with refusing("durable_run", "UPDATE", contains_marker("output")), transaction.atomic():
        handle = orm_engine.start("wf", MARKER)
        assert orm_engine.execute(handle.run_id)
        assert_ended_unwritten(orm_engine, handle.run_id, "completed")
