"""The PostgreSQL fast path for starting runs: one server-side call per start.

``durable_start_run`` takes a transaction-scoped advisory lock on the quota key, checks
for an existing run with the id, counts the key's active runs and inserts the run and its
tags. PL/pgSQL takes a fresh snapshot for each statement of a volatile function at READ
COMMITTED, so the count sees every run committed before the lock was granted.
Other databases take the portable ORM path and get nothing here.
"""

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
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_active integer := 0;
    v_now timestamptz := clock_timestamp();
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
        SELECT count(*) INTO v_active FROM durable_run_tag t
            WHERE t.tag = 'concurrency:' || p_key
              AND t.status = ANY(p_statuses)
              AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace);
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

DROP = (
    "DROP FUNCTION IF EXISTS durable_start_run("
    "text, boolean, text, text, text, jsonb, text[], text, text, integer, text, text[], "
    "integer, text)"
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("durable_django", "0001_initial")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
