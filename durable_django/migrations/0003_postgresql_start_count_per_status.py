"""``durable_start_run`` counts with one equality per status, on a plan made once.

The count of 0002, ``tag = K AND status = ANY(statuses)``, leaves it to PostgreSQL's
planner whether the status list is searched in the ``(tag, status, namespace)`` index or
checked row by row after reading every index entry of the key. The planner (measured on
PostgreSQL 15) takes the second plan whenever its statistics say the key has few rows, as
they do for a key that gained its history since the last ``ANALYZE``: that count then
reads the key's whole finished history (measured: 0.9 to 1.6 ms with 6,000 to 7,000
finished runs, growing with them).

Here the count is a ``UNION ALL`` of one branch per status, ``tag = K AND status = S``:
both columns are the index's search key, so the count reads only the key's runs in the
counted statuses. It stays one statement, so it reads one snapshot, taken after the key's
lock was granted: a run moving between two counted statuses meanwhile is counted exactly
once. ``p_statuses`` holds at most the seven statuses, each once (as the engine's validated
``count_statuses`` do); the branches past its end compare with NULL and find nothing
without reading the index.

The function's statements are planned once per connection, not at every call: planning
the count afresh for its arguments was most of what the quota added to a start. The
settings the function runs with make that safe:

- ``plan_cache_mode = force_generic_plan``: one plan per connection, kept until the
  tables' statistics change;
- ``enable_seqscan = off`` and ``max_parallel_workers_per_gather = 0``: a generic plan is
  made without the key, from estimates that may say "every row"; under these settings the
  count's plan searches the index on ``(tag, status)``, reading the key's runs in the
  counted statuses and nothing else (the other statements look rows up by primary key or
  insert them);
- ``jit = off``: the count reads a handful of index entries; an estimate of millions must
  not make PostgreSQL spend milliseconds compiling it.

Other databases get nothing here (the portable path's ``status IN (...)`` is searched in
the index by SQLite, MySQL and MariaDB).
"""

import importlib

from django.db import migrations

CREATE = r"""
CREATE OR REPLACE FUNCTION durable_start_run(
    p_id text,
    p_check_existing boolean,
    p_workflow text,
    p_version text,
    p_namespace text,
    p_input jsonb,
    p_tags text[],
    p_queue text,
    p_parent_id text,
    p_attempt integer,
    p_key text,
    p_statuses text[],
    p_limit integer,
    p_read_namespace text
) RETURNS TABLE(outcome text, active integer, found_workflow text, found_namespace text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    v_active integer := 0;
    v_now timestamptz := clock_timestamp();
    v_tag text;
BEGIN
    IF p_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('durable_django:' || p_key, 0));
    END IF;
    IF p_check_existing THEN
        RETURN QUERY SELECT 'exists'::text, 0, r.workflow::text, r.namespace::text
            FROM durable_run r WHERE r.id = p_id;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF p_key IS NOT NULL THEN
        IF cardinality(p_statuses) > 7 THEN
            RAISE EXCEPTION 'durable_start_run counts at most 7 distinct statuses';
        END IF;
        v_tag := 'concurrency:' || p_key;
        -- One statement (one snapshot), one equality per status (the index is searched on
        -- (tag, status) whatever the statistics say): see the migration's docstring.
        SELECT count(*) INTO v_active FROM (
            SELECT 1 FROM durable_run_tag t WHERE t.tag = v_tag AND t.status = p_statuses[1]
                AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
            UNION ALL
            SELECT 1 FROM durable_run_tag t WHERE t.tag = v_tag AND t.status = p_statuses[2]
                AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
            UNION ALL
            SELECT 1 FROM durable_run_tag t WHERE t.tag = v_tag AND t.status = p_statuses[3]
                AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
            UNION ALL
            SELECT 1 FROM durable_run_tag t WHERE t.tag = v_tag AND t.status = p_statuses[4]
                AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
            UNION ALL
            SELECT 1 FROM durable_run_tag t WHERE t.tag = v_tag AND t.status = p_statuses[5]
                AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
            UNION ALL
            SELECT 1 FROM durable_run_tag t WHERE t.tag = v_tag AND t.status = p_statuses[6]
                AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
            UNION ALL
            SELECT 1 FROM durable_run_tag t WHERE t.tag = v_tag AND t.status = p_statuses[7]
                AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
        ) AS counted;
        IF v_active >= p_limit THEN
            RETURN QUERY SELECT 'refused'::text, v_active, NULL::text, NULL::text;
            RETURN;
        END IF;
    END IF;
    INSERT INTO durable_run (
        id, workflow, version, namespace, status, queue, input, output, error,
        parent_id, blocked_reason, attempt, created_at, updated_at, started_at, finished_at
    ) VALUES (
        p_id, p_workflow, p_version, p_namespace, 'pending', p_queue, p_input, NULL, NULL,
        p_parent_id, '', p_attempt, v_now, v_now, NULL, NULL
    ) ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        -- A concurrent start inserted this id first; it has committed by now.
        RETURN QUERY SELECT 'exists'::text, 0, r.workflow::text, r.namespace::text
            FROM durable_run r WHERE r.id = p_id;
        RETURN;
    END IF;
    INSERT INTO durable_run_tag (run_id, tag, status, namespace)
        SELECT p_id, tag, 'pending', p_namespace FROM unnest(p_tags) AS tag;
    RETURN QUERY SELECT 'created'::text, v_active, p_workflow, p_namespace;
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def restore(apps, schema_editor):
    # Back to 0002's definition: same signature, so CREATE OR REPLACE swaps it whole.
    if schema_editor.connection.vendor == "postgresql":
        previous = importlib.import_module(
            "durable_django.migrations.0002_postgresql_start_function"
        )
        schema_editor.execute(previous.CREATE)


class Migration(migrations.Migration):
    dependencies = [("durable_django", "0002_postgresql_start_function")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
