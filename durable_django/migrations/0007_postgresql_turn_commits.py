"""Fewer commits per run turn on PostgreSQL: what each of a turn's statements waits for.

A commit that waits for its WAL to reach the disk costs about as much as the statement
itself (see docs/benchmarks.md). This replaces the three functions of migration 0006:

- ``durable_claim_run`` takes ``p_async_commit``: when true (the caller is not inside a
  transaction of its own), the claim's commit does not wait for the flush. Nothing that
  depends on a claim can be made durable before it: every later write of the turn, and
  any other transaction that acts on the claimed run, commits behind it in the WAL, and
  that commit flushes the claim too. A server crash can lose only a claim nothing durable
  followed, which leaves the run pending, as if its worker had died before its first
  record; the tick sends it again. (Starts, records and transitions that free a slot keep
  the synchronous commit: the quota and replay rely on them.)
- ``durable_record_held_step`` checks that the worker holds the run with a share lock on
  the run's row instead of updating it: the same exclusion against a cancel or a
  hand-on, which update the row and so wait for the record (or make it find the run no
  longer held), without writing a new version of the row at every step.
- ``durable_transition_held`` takes a step to record in the same statement (``p_step_*``,
  all NULL for none): the turn's last step is recorded with the transition that ends the
  turn, one commit instead of two.

Other databases get nothing here.
"""

import importlib

from django.db import migrations

CREATE = r"""
DROP FUNCTION IF EXISTS durable_claim_run(text, text, timestamptz, timestamptz, timestamptz);
CREATE FUNCTION durable_claim_run(
    p_id text,
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_started_at timestamptz,
    p_now timestamptz,
    p_async_commit boolean
) RETURNS TABLE(
    r_id text, r_workflow text, r_version text, r_namespace text, r_status text,
    r_input jsonb, r_output jsonb, r_error jsonb, r_queue text, r_parent_id text,
    r_blocked_reason text, r_attempt integer, r_created_at timestamptz,
    r_updated_at timestamptz, r_started_at timestamptz, r_finished_at timestamptz,
    r_wake_at timestamptz, r_wait jsonb, r_lease_owner text, r_lease_expires_at timestamptz,
    r_tags text[], r_steps json
)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF p_async_commit THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
    WITH changed AS (
        UPDATE durable_run SET status = 'running', updated_at = p_now,
            lease_owner = p_lease_owner, lease_expires_at = p_lease_expires_at,
            started_at = p_started_at, wake_at = NULL
        WHERE id = p_id AND status || '' = 'pending'
        RETURNING *
    ), tagged AS (
        UPDATE durable_run_tag SET status = 'running'
        WHERE run_id IN (SELECT c.id FROM changed c) RETURNING tag
    )
    SELECT c.id::text, c.workflow::text, c.version::text, c.namespace::text,
        c.status::text, c.input, c.output, c.error, c.queue::text, c.parent_id::text,
        c.blocked_reason, c.attempt, c.created_at, c.updated_at, c.started_at,
        c.finished_at, c.wake_at, c.wait, c.lease_owner::text, c.lease_expires_at,
        ARRAY(SELECT t.tag::text FROM tagged t),
        (SELECT json_agg(json_build_array(s."position", s.name, s.result, s.error)
                ORDER BY s."position")
         FROM durable_step s WHERE s.run_id = c.id)
    FROM changed c;
END
$$;

CREATE OR REPLACE FUNCTION durable_record_held_step(
    p_id text,
    p_owner text,
    p_position integer,
    p_name text,
    p_result jsonb,
    p_error jsonb,
    p_now timestamptz
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM 1 FROM durable_run
    WHERE id = p_id AND status || '' = 'running' AND lease_owner = p_owner
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO durable_step (run_id, "position", name, result, error, created_at)
    VALUES (p_id, p_position, p_name, p_result, p_error, p_now);
    RETURN true;
END
$$;

DROP FUNCTION IF EXISTS durable_transition_held(
    text, text, text, timestamptz, text[], text, timestamptz, text, jsonb, jsonb,
    timestamptz, jsonb, timestamptz);
CREATE FUNCTION durable_transition_held(
    p_id text,
    p_owner text,
    p_status text,
    p_now timestamptz,
    p_set text[],
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_blocked_reason text,
    p_output jsonb,
    p_error jsonb,
    p_finished_at timestamptz,
    p_wait jsonb,
    p_wake_at timestamptz,
    p_step_position integer,
    p_step_name text,
    p_step_result jsonb,
    p_step_error jsonb
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    UPDATE durable_run SET status = p_status, updated_at = p_now,
        lease_owner = CASE WHEN 'lease_owner' = ANY(p_set)
            THEN p_lease_owner ELSE lease_owner END,
        lease_expires_at = CASE WHEN 'lease_expires_at' = ANY(p_set)
            THEN p_lease_expires_at ELSE lease_expires_at END,
        blocked_reason = CASE WHEN 'blocked_reason' = ANY(p_set)
            THEN p_blocked_reason ELSE blocked_reason END,
        output = CASE WHEN 'output' = ANY(p_set) THEN p_output ELSE output END,
        error = CASE WHEN 'error' = ANY(p_set) THEN p_error ELSE error END,
        finished_at = CASE WHEN 'finished_at' = ANY(p_set)
            THEN p_finished_at ELSE finished_at END,
        wait = CASE WHEN 'wait' = ANY(p_set) THEN p_wait ELSE wait END,
        wake_at = CASE WHEN 'wake_at' = ANY(p_set) THEN p_wake_at ELSE wake_at END
    WHERE id = p_id AND status || '' = 'running' AND lease_owner = p_owner;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_status <> 'running' THEN
        UPDATE durable_run_tag SET status = p_status WHERE run_id = p_id;
    END IF;
    IF p_step_position IS NOT NULL THEN
        INSERT INTO durable_step (run_id, "position", name, result, error, created_at)
        VALUES (p_id, p_step_position, p_step_name, p_step_result, p_step_error, p_now);
    END IF;
    RETURN true;
END
$$;
"""

DROP = """
DROP FUNCTION IF EXISTS durable_claim_run(
    text, text, timestamptz, timestamptz, timestamptz, boolean);
DROP FUNCTION IF EXISTS durable_transition_held(
    text, text, text, timestamptz, text[], text, timestamptz, text, jsonb, jsonb,
    timestamptz, jsonb, timestamptz, integer, text, jsonb, jsonb);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)
        # Migration 0006's versions, as they were.
        previous = importlib.import_module(
            "durable_django.migrations.0006_postgresql_execution_functions"
        )
        schema_editor.execute(previous.CREATE)


class Migration(migrations.Migration):
    dependencies = [("durable_django", "0006_postgresql_execution_functions")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
