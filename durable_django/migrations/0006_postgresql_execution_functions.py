"""A run turn's bookkeeping as server-side functions, planned once per connection.

A turn makes three kinds of bookkeeping statements: the claim, one record per step (with
the check that the worker still holds the run), and the transition that ends the turn.
Sent as SQL text, PostgreSQL parses and plans each of them at every call; as PL/pgSQL
functions their plans are kept by the connection, whatever its options (server-side
binding or not, behind a pooler or not):

- ``durable_claim_run``: a pending run to running, its tags' status with it, and the run
  with its tags and its recorded steps returned;
- ``durable_record_held_step``: a step's record, only while the worker holds the running
  run;
- ``durable_transition_held``: a transition from running by the run's holder (the end of
  a turn, a lease renewal), its tags' status with it when the status changes. The columns
  in ``p_set`` take the matching arguments; the others keep their values.

Each is one statement for its caller, so atomic inside a transaction or not, and tests the
same conditions as ``OrmStore``'s SQL did. The run is found by primary key: the status is
tested as ``status || ''``, which no index answers (see ``OrmStore._transition_sql``).

Their statements look a run up by id, or its tags or steps by run id, so PostgreSQL's
default ``plan_cache_mode`` settles on the generic plan after the first calls; forcing it
(as ``durable_start_run`` does for its count) measured no different here.

It also drops the ``varchar_pattern_ops`` indexes (``..._like``) Django makes on
PostgreSQL for the run id and the run-id foreign keys of tags and steps: they serve
``LIKE 'prefix%'`` queries, which nothing makes on those columns, and every run's status
change and step record had to update them. Their names are generated, so they are looked
up in ``pg_indexes``; the reverse creates them again as Django would.

Other databases get nothing here.
"""

from django.db import migrations

CREATE = r"""
CREATE OR REPLACE FUNCTION durable_claim_run(
    p_id text,
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_started_at timestamptz,
    p_now timestamptz
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
    UPDATE durable_run SET status = 'running', updated_at = p_now
    WHERE id = p_id AND status || '' = 'running' AND lease_owner = p_owner;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO durable_step (run_id, "position", name, result, error, created_at)
    VALUES (p_id, p_position, p_name, p_result, p_error, p_now);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION durable_transition_held(
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
    p_wake_at timestamptz
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
    RETURN true;
END
$$;
"""

DROP = """
DROP FUNCTION IF EXISTS durable_claim_run(text, text, timestamptz, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS durable_record_held_step(
    text, text, integer, text, jsonb, jsonb, timestamptz);
DROP FUNCTION IF EXISTS durable_transition_held(
    text, text, text, timestamptz, text[], text, timestamptz, text, jsonb, jsonb,
    timestamptz, jsonb, timestamptz);
"""

#: (model, field) whose ``varchar_pattern_ops`` index no query uses.
LIKE_INDEXES = [("Run", "id"), ("Run", "parent_id"), ("RunTag", "run"), ("Step", "run")]


def _columns(apps):
    for model_name, field_name in LIKE_INDEXES:
        model = apps.get_model("durable_django", model_name)
        yield model, model._meta.get_field(field_name)


def create(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    schema_editor.execute(CREATE)
    quote = schema_editor.quote_name
    for model, field in _columns(apps):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                "AND tablename = %s AND indexdef LIKE %s",
                [model._meta.db_table, f"%({field.column} varchar_pattern_ops)"],
            )
            names = [name for (name,) in cursor.fetchall()]
        for name in names:
            schema_editor.execute(f"DROP INDEX IF EXISTS {quote(name)}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(DROP)
    for model, field in _columns(apps):
        statement = schema_editor._create_like_index_sql(model, field)
        if statement is not None:
            schema_editor.execute(
                str(statement).replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1)
            )


class Migration(migrations.Migration):
    dependencies = [("durable_django", "0005_schedules")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
