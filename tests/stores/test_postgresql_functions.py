"""The PostgreSQL functions: ``stores/postgres/functions.sql`` is what the database has,
installed by an operation that only PostgreSQL databases the routers allow get."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings

from durable_django._core.limits import RATE_TAG_PREFIX, TAG_PREFIX
from durable_django.stores.postgres import function_definitions, parse_functions, start_text
from durable_django.stores.postgres.batch_columns import columns

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the functions are PostgreSQL's"
)

APP = "durable_django"
#: Every migration installing functions, in order; the last of them is the app's latest
#: migration and leaves them all installed.
FUNCTIONS_MIGRATIONS = [(APP, "0002_routines"), (APP, "0006_tag_rows_deleted_with_their_run")]
LATEST = FUNCTIONS_MIGRATIONS[-1]


def installed(schema: str) -> dict[str, str]:
    """``{name: definition}`` of the ``durable_`` functions of ``schema``, as PostgreSQL
    shows them (``pg_get_functiondef``), the schema's name taken out."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s AND p.proname LIKE 'durable\\_%%'",
            [schema],
        )
        return {
            name: definition.replace(f"FUNCTION {schema}.", "FUNCTION ", 1)
            for name, definition in cursor.fetchall()
        }


def current_schema() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        return cursor.fetchone()[0]


@postgresql_only
@pytest.mark.django_db
def test_the_database_has_exactly_the_functions_of_the_file():
    schema = current_schema()
    have = installed(schema)
    # The file's statements, run in a schema of their own (the test's transaction, and
    # the schema with it, is rolled back), as PostgreSQL shows them.
    with connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA durable_file_check")
        cursor.execute(f"SET LOCAL search_path TO durable_file_check, {schema}")
        for definition in function_definitions().values():
            cursor.execute(definition, None)
    expected = installed("durable_file_check")
    assert sorted(expected) == sorted(function_definitions())
    assert sorted(have) == sorted(expected)  # none missing, none the file does not define
    for name, definition in expected.items():
        assert have[name] == definition, name


class RefuseDurable:
    """A database router keeping durable_django off every database."""

    def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool | None:
        return False if app_label == APP else None


def migrate(target: tuple[str, str]) -> None:
    MigrationExecutor(connection).migrate([target])


def triggers() -> set[str]:
    """The triggers of the run and tag tables (the release and the deletion triggers)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
            "AND tgrelid IN ('durable_run'::regclass, 'durable_run_tag'::regclass)"
        )
        return {name for (name,) in cursor.fetchall()}


#: The triggers the migrations make after 0001.
TRIGGERS = {"durable_quota_release", "durable_quota_release_delete", "durable_run_deleted"}


@postgresql_only
@pytest.mark.django_db
def test_the_functions_and_triggers_migrations_reverse_and_honour_the_routers():
    names = sorted(function_definitions())
    schema = current_schema()
    assert sorted(installed(schema)) == names
    assert triggers() == TRIGGERS
    # Everything below is rolled back with the test's transaction. A migration refused
    # by the routers changes nothing: a refused migration back is followed by a refused
    # one forward, which brings the recorded state and the schema back in step.
    with override_settings(DATABASE_ROUTERS=[RefuseDurable()]):
        migrate((APP, "0001_initial"))
        assert sorted(installed(schema)) == names  # refused: not dropped
        assert triggers() == TRIGGERS
        migrate(LATEST)
    migrate((APP, "0001_initial"))
    assert installed(schema) == {}
    assert triggers() == set()
    with override_settings(DATABASE_ROUTERS=[RefuseDurable()]):
        migrate(LATEST)
        assert installed(schema) == {}  # refused: not installed
        assert triggers() == set()
        migrate((APP, "0001_initial"))
    migrate(LATEST)
    assert sorted(installed(schema)) == names
    assert triggers() == TRIGGERS


@postgresql_only
@pytest.mark.django_db
def test_sqlmigrate_shows_the_functions():
    forwards, backwards = io.StringIO(), io.StringIO()
    for migration in FUNCTIONS_MIGRATIONS:
        call_command("sqlmigrate", *migration, stdout=forwards)
        call_command("sqlmigrate", *migration, backwards=True, stdout=backwards)
    for definition in function_definitions().values():
        assert definition in forwards.getvalue()
    for name in function_definitions():
        assert f'DROP FUNCTION IF EXISTS "{name}";' in backwards.getvalue()


@pytest.mark.skipif(connection.vendor == "postgresql", reason="other databases")
@pytest.mark.django_db(transaction=True)  # SQLite's schema editor works outside one only
def test_other_databases_get_no_function():
    out = io.StringIO()
    for migration in FUNCTIONS_MIGRATIONS:
        call_command("sqlmigrate", *migration, stdout=out)
    assert "FUNCTION" not in out.getvalue()


def test_the_file_is_read_whole():
    text = "-- one\n\nCREATE OR REPLACE FUNCTION durable_x_v2(p integer) RETURNS void AS $$\n$$;\n"
    assert parse_functions(text) == {
        "durable_x_v2": "CREATE OR REPLACE FUNCTION durable_x_v2(p integer) RETURNS void AS $$\n$$;"
    }


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_single_start_holds_the_rendered_fragments():
    """``durable_start_run_v2`` counts, admits and inserts with the fragments the first
    start's statements are built of, as ``start_text`` renders them with the function's
    names: a fragment changed on one side only shows here."""
    single = _words(function_definitions()["durable_start_run_v2"])
    row = start_text.run_row(
        *[f"p_{c}" for c in ("id", "workflow", "version", "namespace", "queue", "input")],
        "p_parent_id",
        "p_attempt",
        "v_now",
    )
    tags = start_text.weighed_tags("p_tags", "p_keys", "p_weights", "p_pers", "v_now")
    since = "v_now - make_interval(secs => p_pers[i])"
    for fragment in (
        start_text.units("v_tag", "p_statuses[i:i]", "p_read_namespace"),
        start_text.window_units("v_tag", since, "p_read_namespace"),
        "v_limit := "
        + start_text.limit_in_force("p_limits[i]", "v_tag", "p_read_namespace", "v_now"),
        start_text.admits("v_active", "p_weights[i]", "v_limit"),
        start_text.insert_run(row),
        start_text.insert_tags("p_id", "p_namespace", tags),
        f"v_tag := '{TAG_PREFIX}' || p_keys[i];",
        f"v_tag := '{RATE_TAG_PREFIX}' || p_keys[i];",
    ):
        assert _words(fragment) in single


def test_a_fragment_changed_on_one_side_only_is_found():
    """The check above can fail: a fragment that differs from the file's text is not in it."""
    single = _words(function_definitions()["durable_start_run_v2"])
    changed = start_text.admits("v_active", "p_weights[i]", "v_limit").replace("<=", "<")
    assert _words(changed) not in single


def test_the_batch_start_holds_the_rendered_fragments():
    """``durable_start_runs_v2`` counts, admits and inserts with the fragments of the
    single start, as ``start_text`` renders them."""
    batch = _words(function_definitions()["durable_start_runs_v2"])
    count = start_text.search("'concurrency:' || p.key", "p.status", "p_read_namespace")
    row = start_text.run_row(
        *[f"u.{c}" for c in ("id", "workflow", "version", "namespace", "queue", "input")],
        "u.parent_id",
        "u.attempt",
        "u.now",
    )
    insert = start_text.insert_run(row, "FROM").split("FROM")[0]
    override = start_text.override_limit(
        "'concurrency:' || k.key", "p_read_namespace", "clock_timestamp()"
    )
    for fragment in (count, override, start_text.admits("v_count", "v_weight", "v_limit"), insert):
        assert _words(fragment) in batch


# the start functions side by side ----------------------------------------------------

ACTIVE = ["pending", "running", "suspended", "blocked"]
START_V2 = (
    "SELECT outcome, refused, active FROM durable_start_run_v2("
    "%s, false, 'wf', '1', 'default', '{}'::jsonb, %s::text[], '', NULL, 1, %s::text[], "
    "%s::integer[], %s::integer[], %s::text[], NULL)"
)


def start_v2(run_id: str, quotas: list[tuple[str, int, int]]) -> tuple[str, int | None, int]:
    """One call of ``durable_start_run_v2`` under ``(key, limit, weight)`` quotas."""
    with connection.cursor() as cursor:
        cursor.execute(
            START_V2,
            [
                run_id,
                [f"concurrency:{key}" for key, _, _ in quotas],
                [key for key, _, _ in quotas],
                [limit for _, limit, _ in quotas],
                [weight for _, _, weight in quotas],
                [list(ACTIVE) for _ in quotas],  # a list each: psycopg dumps no shared one
            ],
        )
        return cursor.fetchone()


@postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("quotas", "message"),
    [
        ([("k", 3, 1), ("k", 3, 1)], "takes each key once"),
        ([("k", 3, 0)], "weight 0 of key k is below 1"),
    ],
)
def test_the_start_function_refuses_what_its_callers_must_not_send(quotas, message):
    from django.db import DatabaseError, transaction

    with pytest.raises(DatabaseError, match=message), transaction.atomic():
        start_v2("bad", quotas)
    rows = [list(ACTIVE), list(ACTIVE)]
    with (
        pytest.raises(DatabaseError, match="one limit, weight and row of statuses per key"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(START_V2, ["bad", [], ["a", "b"], [1], [1, 1], rows])


def explained(sql: str, params: list) -> tuple[list[tuple], list[str]]:
    """The rows of ``sql`` (undone afterwards) and the plans auto_explain logged for the
    statements it ran, nested ones included (a function's)."""
    from django.db import DatabaseError, transaction

    plans: list[str] = []
    raw = connection.cursor().connection  # psycopg's

    def keep(notice) -> None:
        plans.append(notice.message_primary or "")

    raw.add_notice_handler(keep)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            try:
                with transaction.atomic():
                    cursor.execute("LOAD 'auto_explain'")
            except DatabaseError:
                pytest.skip("auto_explain needs a superuser")
            for setting, value in [
                ("log_min_duration", "0"),
                ("log_analyze", "on"),
                ("log_timing", "off"),
                ("log_nested_statements", "on"),
                ("log_level", "notice"),
            ]:
                cursor.execute(
                    "SELECT set_config(%s, %s, true)", [f"auto_explain.{setting}", value]
                )
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            cursor.execute("SELECT set_config('auto_explain.log_min_duration', '-1', true)")
            transaction.set_rollback(True)
    finally:
        raw.remove_notice_handler(keep)
    return rows, plans


@postgresql_only
@pytest.mark.django_db
def test_the_start_function_counts_any_number_of_statuses_each_once_from_the_index():
    """A row of eleven statuses, each active status named more than once: each counted
    once, by one index search on (tag, status) per distinct status (auto_explain shows
    the plans of the function's statements)."""
    for n, status in enumerate(ACTIVE):
        held(f"k-{n}", status, {"concurrency:k": 1})
    for n in range(30):
        held(f"done-{n}", "completed", {"concurrency:k": 1})
    rows = [[*ACTIVE, *ACTIVE, "running", "pending", "blocked"]]
    result, plans = explained(START_V2, ["many", ["concurrency:k"], ["k"], [5], [1], rows])
    assert result == [("created", None, 4)]
    print("\n=====\n".join(plans))
    (count,) = [plan for plan in plans if "durable_tag_count_idx" in plan]
    assert re.search(
        r"Index Cond: \(\(\(tag\)::text = \$\d+\) AND \(\(status\)::text = s\.status\)\)", count
    )
    assert f"loops={len(ACTIVE)})" in count  # once per distinct status


# the batch start functions side by side ----------------------------------------------

START_RUNS = (
    "SELECT position, outcome, refused, active, found_workflow, found_namespace "
    "FROM {function}(%s::jsonb, %s)"
)
RUN_COLUMNS = (
    "id, workflow, version, namespace, status, queue, input, jsonb_typeof(input), output, "
    "error, parent_id, "
    "blocked_reason, attempt, started_at, finished_at, wake_at, wait, lease_owner, "
    "lease_expires_at"
)


def element(
    run_id: str,
    quotas: Sequence[tuple[str, int, int, list[str]]] = (),
    *,
    check: bool = False,
    namespace: str = "default",
    workflow: str = "wf",
    tags: list[str] | None = None,
) -> dict:
    """One element of a batch, as ``OrmStore`` sends it: ``(key, limit, weight, statuses)``
    quotas, each quota's tag among the run's tags unless ``tags`` are given."""
    width = max((len(statuses) for *_, statuses in quotas), default=0)
    return {
        "id": run_id,
        "check_existing": check,
        "workflow": workflow,
        "version": "1",
        "namespace": namespace,
        "input": {"id": run_id},
        "tags": [f"concurrency:{key}" for key, *_ in quotas] + ["t"] if tags is None else tags,
        "queue": "q",
        "attempt": 1,
        "keys": [key for key, *_ in quotas],
        "limits": [limit for _, limit, _, _ in quotas],
        "weights": [weight for _, _, weight, _ in quotas],
        "statuses": [[*s, *[None] * (width - len(s))] for *_, s in quotas],
        **({"parent_id": "parent"} if run_id.endswith("-child") else {}),
    }


#: The batch decided element by element, the reference of the set-based function: every key
#: locked first, then one ``durable_start_run_v2`` per element, in order.
EACH = "each"
START_ONE = (
    "SELECT outcome, refused, active, found_workflow, found_namespace FROM "
    "durable_start_run_v2(%s, %s, %s, %s, %s, %s::jsonb, %s::text[], %s, %s, %s, %s::text[], "
    "%s::integer[], %s::integer[], %s::text[], %s)"
)


def start_each(cursor, batch: list[dict], read_namespace: str | None) -> list[tuple]:
    """The rows of :data:`EACH` for ``batch``."""
    keys = [key for item in batch for key in item["keys"]]
    if keys:
        cursor.execute("SELECT durable_lock_quota_keys_v1(%s::text[])", [keys])
    rows = []
    for position, item in enumerate(batch, 1):
        cursor.execute(
            START_ONE,
            [
                item["id"],
                item["check_existing"],
                item["workflow"],
                item["version"],
                item["namespace"],
                json.dumps(item["input"]),
                item["tags"],
                item["queue"],
                item.get("parent_id"),
                item["attempt"],
                item["keys"],
                item["limits"],
                item["weights"],
                [list(row) for row in item["statuses"]],
                read_namespace,
            ],
        )
        rows.append((position, *cursor.fetchone()))
    return rows


def start_runs(function: str, batch: list[dict], read_namespace: str | None) -> dict:
    """What ``function`` (or :data:`EACH`) does with ``batch``, undone afterwards: its rows,
    the runs and tag rows of the batch's ids as they are after it, and their
    ``(created_at, updated_at)``."""
    from django.db import transaction

    ids = sorted({item["id"] for item in batch})

    class Undo(Exception):
        pass

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if function == EACH:
                rows = start_each(cursor, batch, read_namespace)
            else:
                cursor.execute(
                    START_RUNS.format(function=function),
                    [json.dumps(columns(batch, read_namespace)), read_namespace],
                )
                rows = cursor.fetchall()
            cursor.execute(
                f"SELECT {RUN_COLUMNS} FROM durable_run WHERE id = ANY(%s) ORDER BY id", [ids]
            )
            runs = cursor.fetchall()
            cursor.execute(
                "SELECT id, created_at, updated_at FROM durable_run WHERE id = ANY(%s)", [ids]
            )
            times = {run_id: (created, updated) for run_id, created, updated in cursor}
            cursor.execute(
                "SELECT run_id, tag, status, namespace, weight FROM durable_run_tag "
                "WHERE run_id = ANY(%s) ORDER BY run_id, tag",
                [ids],
            )
            tags = cursor.fetchall()
            raise Undo
    except Undo:
        pass
    return {"rows": rows, "runs": runs, "tags": tags, "times": times}


def held(run_id: str, status: str, tags: dict[str, int], namespace: str = "default") -> None:
    """A run of ``wf`` made before the batch, its tags ``{tag: weight}``."""
    from ..factories import RunFactory, RunTagFactory

    run = RunFactory(id=run_id, workflow="wf", status=status, namespace=namespace)
    for tag, weight in tags.items():
        RunTagFactory(run=run, tag=tag, weight=weight)


ALL = ["pending", "running", "suspended", "blocked"]
#: A batch with repeated keys, weights, ids given twice, refusals amid admissions, a
#: status named twice, a quota tag carried without its quota, and a run in another
#: namespace: ``(key, limit, weight, statuses)`` per quota.
MIXED_BATCH = [
    element("x1", [("a", 3, 1, ALL)]),
    element("x2", [("b", 4, 2, ALL), ("a", 4, 1, ALL)]),
    element("x3", [("a", 3, 1, ALL)]),
    element("x1", check=True),
    element("x1"),
    element("old", [("a", 1, 1, ALL)], check=True),
    element("x4", [("c", 2, 2, ["running"])]),
    element("x5", [("c", 2, 2, ["running", "pending"])]),
    element("x6", [("c", 2, 1, ["running"])]),
    element("x7", [("b", 4, 1, ALL), ("d", 1, 1, ALL)]),
    element("x8", tags=["plain"]),
    element("x9", [("d", 1, 1, ALL), ("a", 3, 1, ALL)]),
    element("x10", tags=["concurrency:d"]),
    element("x11", [("d", 2, 1, ALL)]),
    element("x3", [("e", 1, 1, ALL)], check=True),
    element("x12", [("f", 2, 2, ALL)], namespace="blue"),
    element("x13", [("f", 2, 1, ALL)]),
    element("x14-child", [("g", 5, 2, ["pending", "pending"])]),
    element("x15", [("g", 5, 1, ["pending", "pending"])]),
    element("x2", [("a", 9, 1, ALL)], check=True),
    element("x16", [("e", 1, 1, ALL)], check=True),
    {**element("x17"), "input": None},  # a JSON null, not an SQL NULL
]


def hold_the_mixed_batchs_keys() -> None:
    held("parent", "running", {})
    held("old", "completed", {})
    held("a-running", "running", {"concurrency:a": 1})
    held("a-blue", "pending", {"concurrency:a": 1}, namespace="blue")
    held("a-done", "completed", {"concurrency:a": 1})
    held("b-suspended", "suspended", {"concurrency:b": 2})
    held("c-pending", "pending", {"concurrency:c": 2})
    held("g-pending", "pending", {"concurrency:g": 1})


@postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize("read_namespace", [None, "default"])
def test_the_set_based_batch_start_decides_as_the_per_element_one(read_namespace):
    hold_the_mixed_batchs_keys()
    before = start_runs(EACH, MIXED_BATCH, read_namespace)
    after = start_runs("durable_start_runs_v2", MIXED_BATCH, read_namespace)
    assert after["rows"] == before["rows"]
    assert after["runs"] == before["runs"]
    assert after["tags"] == before["tags"]
    # Each run created when its element is decided: in the batch's order.
    created = [row for row in after["rows"] if row[1] == "created"]
    times = [after["times"][MIXED_BATCH[row[0] - 1]["id"]] for row in created]
    assert all(created_at == updated_at for created_at, updated_at in times)
    assert times == sorted(times)
    # The batch is what it says it is: every case is met.
    outcomes = [(row[1], row[2], row[3]) for row in before["rows"]]
    if read_namespace is None:
        assert outcomes == [
            ("created", None, 2),  # a: the running run and the blue pending one
            ("created", None, 3),  # b, then a under a limit of 4
            ("refused", 1, 4),
            ("exists", None, 0),  # x1, looked for
            ("exists", None, 0),  # x1, not looked for: its insert meets it
            ("exists", None, 0),  # held before the batch: no quota counted
            ("created", None, 0),  # c counting running runs only
            ("refused", 1, 4),  # c counting pending ones too: c-pending and x4
            ("created", None, 0),
            ("refused", 1, 4),  # b: b-suspended and x2
            ("created", None, 0),
            ("refused", 2, 4),  # d admits, a refuses
            ("created", None, 0),  # carries d's tag without its quota
            ("created", None, 1),  # ... which weighs 1 under d
            ("created", None, 0),  # x3, refused above, created now
            ("created", None, 0),  # x12, in namespace blue
            ("refused", 1, 2),  # f: x12 counted
            ("created", None, 1),  # g: pending named twice, g-pending counted once
            ("created", None, 3),  # g-pending and x14-child's 2
            ("exists", None, 0),
            ("refused", 1, 1),  # e: x3 holds its one unit
            ("created", None, 0),
        ]
    else:
        assert outcomes[0] == ("created", None, 1)  # a: the blue run is not counted
        assert outcomes[16] == ("created", None, 0)  # f: x12 is not counted
    # The runs of the batch's ids: "old", held before it, and one per "created" row.
    assert len(after["runs"]) == 1 + len(created)


@postgresql_only
@pytest.mark.django_db
def test_an_id_the_set_based_insert_meets_is_decided_element_by_element():
    """A run holds an id that no element naming it looks for: the insert meets it, and the
    batch is decided again with every id looked up, as the reference decides it."""
    hold_the_mixed_batchs_keys()
    batch = [
        element("y1", [("a", 4, 1, ALL)]),
        element("old", [("a", 4, 1, ALL)]),
        element("y2", [("a", 4, 1, ALL)]),
        element("y3", [("a", 4, 1, ALL)]),
    ]
    before = start_runs(EACH, batch, None)
    after = start_runs("durable_start_runs_v2", batch, None)
    assert [row[1:4] for row in before["rows"]] == [
        ("created", None, 2),
        ("exists", None, 0),  # counted (2 + 1 + 1 <= 4), then met: takes no unit
        ("created", None, 3),
        ("refused", 1, 4),
    ]
    assert after == {**before, "times": after["times"]}


@postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("batch", "message", "position"),
    [
        (
            [element("ok"), element("bad", [("k", 3, 1, ALL), ("k", 3, 1, ALL)])],
            "each key once",
            2,
        ),
        (
            [{**element("bad", [("k", 3, 1, ALL), ("j", 3, 1, ALL)]), "limits": [3]}],
            "one limit, weight and row of statuses per key",
            1,
        ),
    ],
)
def test_the_batch_is_not_laid_out_from_what_its_callers_must_not_send(batch, message, position):
    """What the reference's function refuses, the batch's columns refuse to be made of,
    naming the element: nothing reaches the database."""
    from django.db import DatabaseError

    with pytest.raises(DatabaseError, match=message):
        start_runs(EACH, batch, None)
    with pytest.raises(ValueError, match=rf"{message} \(element {position}\)"):
        columns(batch, None)


@postgresql_only
@pytest.mark.django_db
def test_the_set_based_batch_start_raises_at_a_weight_below_1_as_the_reference():
    from django.db import DatabaseError

    batch = [element("bad", [("k", 3, 0, ALL)])]
    for function in (EACH, "durable_start_runs_v2"):
        with pytest.raises(DatabaseError, match="weight 0 of key k is below 1"):
            start_runs(function, batch, None)


@postgresql_only
@pytest.mark.django_db
@pytest.mark.parametrize("field", ["workflows", "limits", "tag_weights", "link_pairs"])
def test_the_set_based_batch_start_refuses_arrays_of_another_length(field):
    """Columns that do not line up raise before anything is locked or written."""
    from django.db import DatabaseError, transaction

    from durable_django.models import Run

    arrays = columns([element("r1", [("k", 3, 1, ALL)]), element("r2", [("k", 3, 1, ALL)])], None)
    arrays[field] = arrays[field][:-1]
    with (
        pytest.raises(DatabaseError, match="takes arrays of one length per kind"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            START_RUNS.format(function="durable_start_runs_v2"), [json.dumps(arrays), None]
        )
    assert not Run.objects.filter(id__in=["r1", "r2"]).exists()


@postgresql_only
@pytest.mark.django_db
def test_the_set_based_batch_start_decides_random_batches_as_the_per_element_one():
    """Batches drawn at random (a fixed seed): keys shared between elements and quotas,
    weights, limits, rows of statuses, ids given twice or held before, elements checking
    existing or not, other namespaces, under either read namespace."""
    import random

    hold_the_mixed_batchs_keys()
    draw = random.Random(11)
    keys = ["a", "b", "c", "d", "g"]
    rows = [ALL, ["running"], ["pending", "running"], ["pending"]]
    for trial in range(30):
        batch = []
        for n in range(draw.randint(1, 25)):
            run_id = draw.choice([f"r{trial}-{n}"] * 5 + [f"r{trial}-0", f"r{trial}-1", "old"])
            quotas = [
                (key, draw.randint(1, 8), draw.randint(1, 3), draw.choice(rows))
                for key in draw.sample(keys, draw.choice([0, 1, 1, 2, 3]))
            ]
            batch.append(
                element(
                    run_id,
                    quotas,
                    # an id held before the batch and looked for by none of its elements
                    # sends the batch to the per-element function: now and then only
                    check=draw.random() < (0.95 if run_id == "old" else 0.5),
                    namespace=draw.choice(["default", "default", "blue"]),
                )
            )
        # check_batch_ids: one id, one workflow and namespace
        for item in batch:
            first = next(other for other in batch if other["id"] == item["id"])
            item["namespace"] = first["namespace"]
        read_namespace = draw.choice([None, "default"])
        before = start_runs(EACH, batch, read_namespace)
        after = start_runs("durable_start_runs_v2", batch, read_namespace)
        assert after["rows"] == before["rows"], trial
        assert after["runs"] == before["runs"], trial
        assert after["tags"] == before["tags"], trial


@postgresql_only
@pytest.mark.django_db
def test_the_set_based_batch_start_counts_each_key_once_from_the_index():
    """A batch of 40 elements under one key: its units are counted once per status, each
    an index search on (tag, status) (auto_explain shows the plans of the function's
    statements), where the element-by-element reference counts once per element."""
    for n in range(30):
        held(f"done-{n}", "completed", {"concurrency:k": 1})
    held("k-running", "running", {"concurrency:k": 1})
    batch = [element(f"e{n}", [("k", 100, 1, ALL)]) for n in range(40)]
    rows, plans = explained(
        START_RUNS.format(function="durable_start_runs_v2"),
        [json.dumps(columns(batch, None)), None],
    )
    assert [row[1:4] for row in rows] == [("created", None, 1 + n) for n in range(40)]
    counts = [plan for plan in plans if "durable_tag_count_idx" in plan]
    assert len(counts) == 1  # one statement reads the tags' index
    (count,) = counts
    condition = "(((tag)::text = ('concurrency:'::text || p.key)) AND ((status)::text = p.status))"
    assert f"Index Cond: {condition}" in count
    assert f"loops={len(ALL)})" in count  # once per (key, status), not per element


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_an_id_inserted_concurrently_is_decided_again_as_the_reference():
    """Another transaction inserts an id of the batch after the batch looked for runs and
    commits while the batch's insert waits for it: the batch's insert meets the id, and
    the batch is decided again with that run held, as ``durable_start_run_v2`` decides an
    id its insert meets ('exists', the holder's workflow, no unit taken)."""
    import threading

    from django.db import connections, transaction

    from durable_django.models import Run, RunTag

    inserted, commit = threading.Event(), threading.Event()

    def insert_and_hold() -> None:
        try:
            with transaction.atomic():
                Run.objects.create(id="z", workflow="other", version="1", status="completed")
                inserted.set()
                commit.wait(10)
        finally:
            connections.close_all()

    batch = [element(run_id, [("k", 5, 1, ALL)]) for run_id in ("z1", "z", "z2")]
    rows: list[tuple] = []

    def start_batch() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids.append(cursor.fetchone()[0])
                cursor.execute(
                    START_RUNS.format(function="durable_start_runs_v2"),
                    [json.dumps(columns(batch, None)), None],
                )
                rows.extend(cursor.fetchall())
        finally:
            connections.close_all()

    pids: list[int] = []
    holder = threading.Thread(target=insert_and_hold)
    holder.start()
    assert inserted.wait(10)
    starter = threading.Thread(target=start_batch)
    starter.start()
    with connection.cursor() as cursor:  # until the batch's insert waits for the holder
        for _ in range(200):
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) "
                "AND wait_event_type = 'Lock'",
                [pids],
            )
            if cursor.fetchone()[0]:
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("the batch's insert never waited for the concurrent one")
    commit.set()
    holder.join(10)
    starter.join(10)
    assert [row[1:5] for row in rows] == [
        ("created", None, 0, "wf"),
        ("exists", None, 0, "other"),
        ("created", None, 1, "wf"),  # z took no unit
    ]
    assert set(Run.objects.values_list("id", "workflow")) == {
        ("z1", "wf"),
        ("z", "other"),
        ("z2", "wf"),
    }
    assert sorted(RunTag.objects.values_list("run_id", "tag")) == [
        ("z1", "concurrency:k"),
        ("z1", "t"),
        ("z2", "concurrency:k"),
        ("z2", "t"),
    ]
