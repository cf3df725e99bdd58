"""Bad input is refused before any SQL with an error naming the argument and the rule, the
same on every database; lengths come from the columns, limits from one range."""

from __future__ import annotations

import pickle

import pytest
from django.db.backends.base.operations import BaseDatabaseOperations

from durable_django import (
    Concurrency,
    ConcurrencyLimitError,
    DurableError,
    Engine,
    UnstorableValueError,
)
from durable_django._core.limits import MAX_JSON_BYTES, MAX_LIMIT, MIN_LIMIT, text_lengths
from durable_django._rules.registry import make_definition
from durable_django.models import QuotaLock, Run, RunTag, Schedule, Signal, Step
from durable_django.testing import run_until_idle

from ..helpers import NUL, SURROGATE, nested


def assert_nothing_created() -> None:
    assert (Run.objects.count(), RunTag.objects.count(), Signal.objects.count()) == (0, 0, 0)


# lengths ------------------------------------------------------------------------------


def test_every_length_is_read_from_the_column_it_protects(db):
    lengths = text_lengths()
    step_name = Step._meta.get_field("name").max_length
    assert lengths.run_id == Run._meta.get_field("id").max_length == 255
    assert lengths.version == Run._meta.get_field("version").max_length
    assert lengths.namespace == Run._meta.get_field("namespace").max_length
    assert lengths.queue == Run._meta.get_field("queue").max_length
    assert lengths.tag == RunTag._meta.get_field("tag").max_length
    assert lengths.quota_key == RunTag._meta.get_field("tag").max_length - len("concurrency:")
    assert lengths.quota_key <= QuotaLock._meta.get_field("key").max_length
    assert lengths.step_name == step_name
    assert lengths.schedule_key == Schedule._meta.get_field("key").max_length
    # Names that durable calls turn into step names leave room for the prefix.
    assert lengths.signal_token == step_name - len("durable.signal:") == 185
    assert lengths.workflow == step_name - len("durable.child:") == 186


def test_the_longest_names_are_stored_on_every_database(orm_engine: Engine):
    lengths = text_lengths()
    token = "t" * lengths.signal_token
    child = "c" * lengths.workflow

    def body(ctx, input):
        ctx.step("s" * lengths.step_name, lambda: 1)
        ctx.child(child, 1, child_id="k" * lengths.run_id)
        return ctx.wait_for_signal(token)

    orm_engine.register(child, "v" * lengths.version, lambda ctx, i: i)
    orm_engine.register("parent", "1", body, tags=["g" * lengths.tag])
    handle = orm_engine.start(
        "parent",
        {},
        "r" * lengths.run_id,
        namespace="n" * lengths.namespace,
        concurrency={"key": "q" * lengths.quota_key, "limit": 1},
    )
    run_until_idle(orm_engine)
    orm_engine.signal(token, "go")
    run_until_idle(orm_engine)
    assert handle.result() == "go"
    names = [s.name for s in orm_engine.store.get_steps(handle.run_id)]
    assert max(len(name) for name in names) == lengths.step_name
    assert f"durable.child:{child}" in names and f"durable.signal:{token}" in names


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda ctx: ctx.step("s" * 201, lambda: 1),
            "step name is 201 characters long; at most 200",
        ),
        (lambda ctx: ctx.step(NUL, lambda: 1), "step name cannot be stored: it contains a NUL"),
        (lambda ctx: ctx.wait_for_signal("t" * 186), "signal token is 186 characters long"),
        (lambda ctx: ctx.wait_for_signal(SURROGATE), "signal token cannot be stored"),
        (lambda ctx: ctx.start_child("leaf", 1, child_id="c" * 256), "run_id is 256 characters"),
        (lambda ctx: ctx.start_child("leaf", 1, tags=["g" * 256]), "a tag is 256 characters"),
    ],
)
def test_a_durable_call_with_a_bad_name_fails_at_the_call(orm_engine: Engine, call, message):
    def body(ctx, input):
        try:
            call(ctx)
        except ValueError as error:
            return str(error)
        return "not refused"

    orm_engine.register("leaf", "1", lambda ctx, i: i)
    orm_engine.register("wf", "1", body)
    handle = orm_engine.start("wf", {})
    run_until_idle(orm_engine)
    assert message in handle.result()
    assert Step.objects.count() == 0
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    ("declare", "error", "message"),
    [
        (lambda: make_definition("w" * 187, "1", None), ValueError, "at most 186"),
        (lambda: make_definition("wf", "v" * 65, None), ValueError, "at most 64"),
        (lambda: make_definition("wf", "1", None, tags=["g" * 256]), ValueError, "at most 255"),
        (lambda: make_definition("wf", "1", None, tags=[NUL]), ValueError, "NUL"),
        (lambda: make_definition(NUL, "1", None), UnstorableValueError, "workflow name"),
        (lambda: make_definition("wf", SURROGATE, None), UnstorableValueError, r"U\+D800"),
        (lambda: make_definition("wf", "1", None, on_event=[NUL]), ValueError, "event name"),
        (
            lambda: make_definition("wf", "1", None, remote=True, queue="q" * 201),
            ValueError,
            "queue is 201 characters long; at most 200",
        ),
    ],
)
def test_bad_declarations_are_refused(db, declare, error, message):
    with pytest.raises(error, match=message):
        declare()


# limits -------------------------------------------------------------------------------


def test_the_range_of_limits_is_the_range_of_an_integer_field():
    ranges = BaseDatabaseOperations.integer_field_ranges
    assert (MIN_LIMIT, MAX_LIMIT) == ranges["IntegerField"] == (-(2**31), 2**31 - 1)
    assert Schedule._meta.get_field("concurrency_limit").get_internal_type() == "IntegerField"


@pytest.mark.parametrize("limit", [MAX_LIMIT + 1, MIN_LIMIT - 1, 10**30])
def test_a_limit_out_of_range_is_refused_at_declaration(limit):
    with pytest.raises(ValueError, match="must be between -2147483648 and 2147483647"):
        Concurrency(key=lambda i: "k", limit=limit)
    with pytest.raises(ValueError, match="between"):
        make_definition("wf", "1", None, concurrency={"key": lambda i: "k", "limit": limit})


@pytest.mark.parametrize("limit", [MAX_LIMIT + 1, MIN_LIMIT - 1])
def test_a_limit_out_of_range_is_refused_at_start(orm_engine: Engine, limit):
    orm_engine.register("wf", "1", lambda ctx, i: i, concurrency={"key": lambda i: "k", "limit": 1})
    orm_engine.register(
        "by-plan",
        "1",
        lambda ctx, i: i,
        concurrency={"key": lambda i: "k", "limit": lambda k: limit},
    )
    with pytest.raises(ValueError, match="between"):
        orm_engine.start("wf", {}, concurrency={"key": "k", "limit": limit})
    with pytest.raises(ValueError, match="workflow 'by-plan': the concurrency limit for key 'k'"):
        orm_engine.start("by-plan", {})
    assert_nothing_created()


def test_the_ends_of_the_range_work_on_every_database(orm_engine: Engine):
    orm_engine.register("wf", "1", lambda ctx, i: i)
    assert orm_engine.start("wf", {}, concurrency={"key": "k", "limit": MAX_LIMIT}).created
    with pytest.raises(ConcurrencyLimitError) as refused:
        orm_engine.start("wf", {}, concurrency={"key": "k", "limit": MIN_LIMIT})
    assert refused.value.limit == MIN_LIMIT
    assert Run.objects.count() == 1


# statuses -----------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_a_finished_status_cannot_hold_a_slot(orm_engine: Engine, status):
    counted = ["running", status]
    with pytest.raises(ValueError, match=f"not \\['{status}'\\].*lifetime cap"):
        make_definition(
            "wf",
            "1",
            None,
            concurrency={"key": lambda i: "k", "limit": 1, "count_statuses": counted},
        )
    orm_engine.register("wf", "1", lambda ctx, i: i)
    with pytest.raises(ValueError, match="lifetime cap"):
        orm_engine.start("wf", {}, concurrency={"key": "k", "limit": 1, "count_statuses": counted})
    assert_nothing_created()


# text and values that no database may get -----------------------------------------------


def nul_key(input):
    return f"tenant:{input['tenant']}\x00"


BAD_STARTS = [
    pytest.param(lambda e: e.start("wf", {}, NUL), UnstorableValueError, "run_id", id="run_id NUL"),
    pytest.param(
        lambda e: e.start("wf", {}, SURROGATE), UnstorableValueError, "run_id", id="run_id U+D800"
    ),
    pytest.param(lambda e: e.start("wf", {}, tags=[NUL]), UnstorableValueError, "a tag", id="tag"),
    pytest.param(
        lambda e: e.start("wf", {}, namespace=SURROGATE), UnstorableValueError, "namespace", id="ns"
    ),
    pytest.param(lambda e: e.start(NUL, {}), UnstorableValueError, "workflow name", id="workflow"),
    pytest.param(
        lambda e: e.start("wf", {}, concurrency={"key": NUL, "limit": 1}),
        UnstorableValueError,
        "concurrency key",
        id="per-start key",
    ),
    pytest.param(
        lambda e: e.start("keyed", {"tenant": "acme"}),
        UnstorableValueError,
        "workflow 'keyed': concurrency key cannot be stored",
        id="key function",
    ),
    pytest.param(
        lambda e: e.start("wf", {"x": [NUL]}),
        UnstorableValueError,
        r"the input of workflow 'wf' cannot be stored at \$\.x\[0\]: it contains a NUL",
        id="input NUL",
    ),
    pytest.param(
        lambda e: e.start("wf", {SURROGATE: 1}),
        UnstorableValueError,
        r"the input of workflow 'wf' cannot be stored: the key 'a\\ud800b': it contains a surr",
        id="input key U+D800",
    ),
    pytest.param(
        lambda e: e.start("wf", nested(40)),
        UnstorableValueError,
        r"at \$(\[0\]){20}: it is nested more than 20 levels deep",
        id="input 40 deep",
    ),
    pytest.param(
        lambda e: e.start("wf", nested(100_000)),
        UnstorableValueError,
        "nested more than 20 levels deep",
        id="input 100000 deep",
    ),
    pytest.param(
        lambda e: e.start("wf", {"x": "y" * (20 * 1024 * 1024)}),
        UnstorableValueError,
        f"bytes as JSON; at most {MAX_JSON_BYTES:,} allowed",
        id="input 20 MB",
    ),
    pytest.param(
        lambda e: e.signal(NUL, 1), UnstorableValueError, "signal token", id="signal token"
    ),
    pytest.param(
        lambda e: e.signal("t" * 186, 1), ValueError, "signal token is 186", id="signal token long"
    ),
    pytest.param(
        lambda e: e.signal("t", {"x": SURROGATE}),
        UnstorableValueError,
        r"the payload of signal 't' cannot be stored at \$\.x",
        id="signal payload",
    ),
    pytest.param(
        lambda e: e.publish_event(NUL, {}), UnstorableValueError, "event name", id="event name"
    ),
    pytest.param(
        lambda e: e.publish_event("paid", {}, id=SURROGATE),
        UnstorableValueError,
        "event id",
        id="event id",
    ),
    pytest.param(
        lambda e: e.publish_event("paid", nested(25)),
        UnstorableValueError,
        "the payload of event 'paid' cannot be stored",
        id="event payload",
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_STARTS)
def test_bad_input_raises_before_any_sql_and_creates_nothing(
    orm_engine: Engine, call, error, message
):
    orm_engine.register("wf", "1", lambda ctx, i: i, on_event=["paid"])
    orm_engine.register("keyed", "1", lambda ctx, i: i, concurrency={"key": nul_key, "limit": 1})
    with pytest.raises(error, match=message):
        call(orm_engine)
    assert_nothing_created()


@pytest.mark.parametrize(
    "read",
    [
        lambda e: e.get_run(NUL),
        lambda e: e.list_runs(tag=SURROGATE),
        lambda e: e.list_runs(workflow=NUL),
        lambda e: e.count_runs(tag=NUL),
        lambda e: e.count_runs(namespace=SURROGATE),
        lambda e: e.quota_usage(NUL),
        lambda e: e.cancel(NUL),
    ],
)
def test_reads_with_text_no_run_can_hold_are_refused(orm_engine: Engine, read):
    with pytest.raises(UnstorableValueError, match="cannot be stored: it contains"):
        read(orm_engine)


def test_the_error_is_a_durable_error_a_type_error_and_a_value_error():
    error = UnstorableValueError("the input of workflow 'wf'", "$.a", "it contains a NUL")
    assert isinstance(error, DurableError | TypeError) and isinstance(error, ValueError)
    assert str(error) == "the input of workflow 'wf' cannot be stored at $.a: it contains a NUL"
    copied = pickle.loads(pickle.dumps(error))
    assert (copied.what, copied.path, copied.rule) == (error.what, error.path, error.rule)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"key": "k" * 201, "interval": 5}, "a schedule key is 201 characters long; at most 200"),
        ({"key": NUL, "interval": 5}, "workflow 'wf': a schedule key cannot be stored"),
        (
            {"key": "k", "interval": 5, "input": {"x": NUL}},
            r"workflow 'wf': the input of schedule 'k' cannot be stored at \$\.x",
        ),
        (
            {"key": "k", "interval": 5, "concurrency": {"key": "q", "limit": 2**31}},
            "between",
        ),
    ],
)
def test_a_declared_schedule_is_held_to_the_same_rules(db, schedule, message):
    with pytest.raises(ValueError, match=message):
        make_definition("wf", "1", None, schedule=schedule)
