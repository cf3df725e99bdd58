-- The PostgreSQL functions of durable_django's ORM store: the only copy of their code.
--
-- Migration 0002_routines installs them, on PostgreSQL databases the database routers
-- let durable_django migrate, with the operation
-- durable_django.stores.postgres.operations.InstallFunctions. OrmStore calls them by name
-- on its PostgreSQL fast path; other databases take the store's portable ORM path.
--
-- Versioned names. Every function's name ends with its version: _v1, _v2, ... Once
-- released (from 0.1.0 on), a version never changes, not its arguments, its result, its
-- settings nor its body. A change is a new version added to this file beside the old
-- one, installed by a new migration (InstallFunctions naming it) and called by the store
-- from then on. During a rolling deploy the workers of the previous release, which call
-- the old version, keep working until they are replaced. An old version stays in this
-- file, installed, until the migrations are squashed (a major release), when it leaves
-- the file together with the migration that installed it.
--
-- The form, which durable_django.stores.postgres reads: nothing but comments and
-- "CREATE OR REPLACE FUNCTION durable_<name>_v<N>(" statements, each with a dollar-quoted
-- body whose last line is "$$;". No function sets anything beyond the transaction it runs
-- in (set_config(..., true), or SET clauses, which end with the call): a connection pooler
-- in transaction mode may hand the server connection to another client next.


-- The transaction-scoped advisory lock that serialises the starts of quota key p_key:
-- durable_start_run_v2 takes it, and so does the portable start path on PostgreSQL
-- (OrmStore.quota_lock), so the two serialise against each other. Every version of the
-- start must take this same lock, or starts of two releases would count at once.
CREATE OR REPLACE FUNCTION durable_lock_quota_key_v1(p_key text) RETURNS void
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_advisory_xact_lock(hashtextextended('durable_django:' || p_key, 0));
$$;


-- A worker's claim: a pending run to running with its lease, its tags' status with it;
-- returns what the claimer does not know of the run, its tags and its recorded steps (no
-- row: the run was not pending). What the claim itself sets is not returned, the caller
-- gave it: the id, the status ('running'), updated_at (p_now), lease_owner,
-- lease_expires_at, started_at and wake_at (NULL).
--
-- With p_async_commit (the caller is not inside a transaction of its own) the claim's
-- commit does not wait for the WAL flush. Nothing that depends on a claim can be made
-- durable before it: every later write of the turn, and any other transaction acting on
-- the claimed run, commits behind it in the WAL, and that commit flushes the claim too. A
-- server crash can lose only a claim nothing durable followed, which leaves the run
-- pending, as if its worker had died before its first record; the tick sends it again.
--
-- The run is found by primary key: the status is tested as status || '', which no index
-- answers (with statistics taken while few runs were pending, the planner would otherwise
-- read the entry of every pending run in an index on (status, ...) to find this one).
CREATE OR REPLACE FUNCTION durable_claim_run_v1(
    p_id text,
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_started_at timestamptz,
    p_now timestamptz,
    p_async_commit boolean
) RETURNS TABLE(
    r_workflow text, r_version text, r_namespace text, r_input jsonb, r_output jsonb,
    r_error jsonb, r_queue text, r_parent_id text, r_blocked_reason text, r_attempt integer,
    r_created_at timestamptz, r_finished_at timestamptz, r_wait jsonb, r_tags text[],
    r_steps json
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
        RETURNING workflow, version, namespace, input, output, error, queue, parent_id,
            blocked_reason, attempt, created_at, finished_at, wait
    ), tagged AS (
        UPDATE durable_run_tag SET status = 'running'
        WHERE run_id = p_id AND EXISTS (SELECT FROM changed) RETURNING tag
    )
    SELECT c.workflow::text, c.version::text, c.namespace::text, c.input, c.output,
        c.error, c.queue::text, c.parent_id::text, c.blocked_reason, c.attempt,
        c.created_at, c.finished_at, c.wait,
        ARRAY(SELECT t.tag::text FROM tagged t),
        (SELECT json_agg(json_build_array(s."position", s.name, s.result, s.error)
                ORDER BY s."position")
         FROM durable_step s WHERE s.run_id = p_id)
    FROM changed c;
END
$$;


-- A step's record, made only while p_owner holds the running run; false (and nothing
-- recorded) when it does not. The check takes a share lock on the run's row rather than
-- updating it: a cancel or a hand-on, which update the row, wait for the record (or make
-- it find the run no longer held), and no step writes a new version of the run's row.
CREATE OR REPLACE FUNCTION durable_record_held_step_v1(
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


-- A run's transition: from one of p_from to p_status, only while the run is held by
-- p_owner (when given), its lease expired before p_lease_expired_before (when given) and it
-- was last updated before p_updated_before (when given); its tags' status with it when the
-- status changes. False, and nothing changed, when the run is not in that state. The columns
-- named in p_set take the matching arguments; the others keep their values. A step given
-- (p_step_position not NULL) is recorded in the same statement: the turn's last record
-- commits with the transition that ends the turn.
--
-- The run is found by primary key (status || '', as in durable_claim_run_v1): with one
-- status in p_from the planner would otherwise read the entry of every run in that status
-- in an index on (status, ...), a cost growing with the backlog.
CREATE OR REPLACE FUNCTION durable_transition_v1(
    p_id text,
    p_from text[],
    p_status text,
    p_now timestamptz,
    p_owner text,
    p_lease_expired_before timestamptz,
    p_updated_before timestamptz,
    p_set text[],
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_blocked_reason text,
    p_output jsonb,
    p_error jsonb,
    p_finished_at timestamptz,
    p_wait jsonb,
    p_wake_at timestamptz,
    p_attempt integer,
    p_started_at timestamptz,
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
        wake_at = CASE WHEN 'wake_at' = ANY(p_set) THEN p_wake_at ELSE wake_at END,
        attempt = CASE WHEN 'attempt' = ANY(p_set) THEN p_attempt ELSE attempt END,
        started_at = CASE WHEN 'started_at' = ANY(p_set)
            THEN p_started_at ELSE started_at END
    WHERE id = p_id AND status || '' = ANY(p_from)
        AND (p_owner IS NULL OR lease_owner = p_owner)
        AND (p_lease_expired_before IS NULL OR lease_expires_at < p_lease_expired_before)
        AND (p_updated_before IS NULL OR updated_at < p_updated_before);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT p_from <@ ARRAY[p_status] THEN
        UPDATE durable_run_tag SET status = p_status WHERE run_id = p_id;
    END IF;
    IF p_step_position IS NOT NULL THEN
        INSERT INTO durable_step (run_id, "position", name, result, error, created_at)
        VALUES (p_id, p_step_position, p_step_name, p_step_result, p_step_error, p_now);
    END IF;
    RETURN true;
END
$$;


-- The locks of several quota keys, durable_lock_quota_key_v1 each, taken in one order: the
-- keys' byte order (COLLATE "C"), each once. Two starters whose keys overlap take their
-- common keys in the same order, so they never wait on each other in a cycle. The order is
-- also Python's order of str (code points, which UTF-8 keeps), so the portable path, which
-- calls this function, and durable_start_run_v2 agree.
CREATE OR REPLACE FUNCTION durable_lock_quota_keys_v1(p_keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_key text;
BEGIN
    FOR v_key IN SELECT DISTINCT k COLLATE "C" FROM unnest(p_keys) AS k ORDER BY 1 LOOP
        PERFORM durable_lock_quota_key_v1(v_key);
    END LOOP;
END
$$;


-- One start in one call, under any number of quotas, each weighing p_weights[i] units: the
-- lock of every key (in byte order: durable_lock_quota_keys_v1), the existing-run check,
-- then for each quota in the order given (the declaration order) the units of its key, the
-- sum of the weights of the key's tag rows in its statuses (in p_read_namespace when
-- given), refused when those units and p_weights[i] would exceed p_limits[i]; then the
-- inserts of the run and its tags, each quota's tag with its weight (other tags weigh 1).
--
-- p_keys, p_limits and p_weights are parallel arrays, one element per quota, the keys
-- distinct (a caller merges two quotas of one key), every weight at least 1; empty arrays
-- make an unlimited start. p_statuses is a two-dimensional array, row i the statuses of
-- quota i (any number of them, a status named twice counted once; a shorter row is padded
-- with NULL, which counts nothing). p_tags holds every
-- tag of the run, its quotas' tags 'concurrency:' || key among them. Returns one row:
-- outcome 'created', 'exists' (with the existing run's workflow and namespace) or
-- 'refused' (with refused, the 1-based position of the first quota that refused, active,
-- its key's units, and refused_limit, the limit it met).
--
-- A quota's limit is p_limits[i] unless an operator's override of its tag is in force at
-- the start's time for the starts reading p_read_namespace (durable_quota_override, scope
-- '' for those reading every namespace): read under the locks, one index search.
--
-- PL/pgSQL takes a fresh snapshot for each statement of a volatile function at READ
-- COMMITTED, so each count sees every run committed before the locks were granted.
--
-- A quota's count is one index search per distinct status of its row, tag = K AND
-- status = S (a LATERAL sum for each status): both columns are the search key of the
-- index on (tag, status, namespace), so it reads only the key's runs in the counted
-- statuses, never its finished history, whatever the planner's statistics say (with
-- status = ANY(...) the planner reads every index entry of a key whose runs came after
-- the last ANALYZE). One statement, so one snapshot.
--
-- Its count, admission and inserts are the fragments the first start's statements are
-- made of (durable_django.stores.postgres.start_text); tests/stores/test_postgresql_functions.py
-- checks that each stands here as that module renders it: change both together.
--
-- The statements are planned once per connection, and these settings make that safe:
-- plan_cache_mode = force_generic_plan (one plan, kept until the tables' statistics
-- change); enable_seqscan = off and max_parallel_workers_per_gather = 0 (a generic plan is
-- made from estimates that may say "every row": under these the count searches the index);
-- jit = off (an estimate of millions must not make PostgreSQL compile a count that reads a
-- handful of index entries).
CREATE OR REPLACE FUNCTION durable_start_run_v2(
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
    p_keys text[],
    p_limits integer[],
    p_weights integer[],
    p_statuses text[],
    p_read_namespace text,
    p_pers double precision[] DEFAULT NULL,
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE(
    outcome text, refused integer, active bigint, found_workflow text, found_namespace text,
    refused_limit integer
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    v_quotas integer := coalesce(cardinality(p_keys), 0);
    v_active bigint := 0;
    v_limit integer;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_tag text;
BEGIN
    IF v_quotas > 0 THEN
        IF coalesce(cardinality(p_limits), 0) <> v_quotas
            OR coalesce(cardinality(p_weights), 0) <> v_quotas
            OR coalesce(array_length(p_statuses, 1), 0) <> v_quotas THEN
            RAISE EXCEPTION 'durable_start_run_v2 takes one limit, weight and row of statuses per key';
        END IF;
        IF v_quotas = 1 THEN
            PERFORM durable_lock_quota_key_v1(p_keys[1]);
        ELSE
            IF (SELECT count(DISTINCT (q.k, q.per IS NULL)) FROM unnest(p_keys, p_pers) AS q(k, per))
                <> v_quotas THEN
                RAISE EXCEPTION 'durable_start_run_v2 takes each key once of each kind';
            END IF;
            PERFORM durable_lock_quota_keys_v1(p_keys);
        END IF;
    END IF;
    IF p_check_existing THEN
        RETURN QUERY SELECT 'exists'::text, NULL::integer, 0::bigint, r.workflow::text,
                r.namespace::text, NULL::integer
            FROM durable_run r WHERE r.id = p_id;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    FOR i IN 1 .. v_quotas LOOP
        IF p_weights[i] IS NULL OR p_weights[i] < 1 THEN
            RAISE EXCEPTION 'durable_start_run_v2: weight % of key % is below 1',
                p_weights[i], p_keys[i];
        END IF;
        IF p_pers[i] IS NULL THEN
            v_tag := 'concurrency:' || p_keys[i];
            v_active := (
                SELECT coalesce(sum(c.weight), 0) AS active
                FROM (
                    SELECT DISTINCT s.status FROM unnest(p_statuses[i:i]) AS s(status)
                    WHERE s.status IS NOT NULL
                ) AS st
                CROSS JOIN LATERAL (
                    SELECT t.weight FROM durable_run_tag AS t
                    WHERE t.tag = v_tag AND t.status = st.status
                        AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
                    OFFSET 0
                ) AS c
            );
        ELSE
            v_tag := 'rate:' || p_keys[i];
            v_active := (
                SELECT coalesce(sum(t.weight), 0) AS active FROM durable_run_tag AS t
                WHERE t.tag = v_tag AND t.created_at > v_now - make_interval(secs => p_pers[i])
                    AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
            );
        END IF;
        v_limit := coalesce((SELECT o.quota_limit FROM durable_quota_override AS o
            WHERE o.tag = v_tag AND o.scope = coalesce(p_read_namespace, '')
                AND (o.until IS NULL OR o.until > v_now)), p_limits[i]);
        IF NOT (v_active + p_weights[i] <= v_limit) THEN
            RETURN QUERY SELECT 'refused'::text, i, v_active, NULL::text, NULL::text, v_limit;
            RETURN;
        END IF;
    END LOOP;
    INSERT INTO durable_run (
        id, workflow, version, namespace, status, queue, input, output, error,
        parent_id, blocked_reason, attempt, created_at, updated_at, started_at, finished_at
    )
    SELECT
        p_id, p_workflow, p_version, p_namespace, 'pending', p_queue, p_input, NULL, NULL,
        p_parent_id, '', p_attempt, v_now, v_now, NULL, NULL
    ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        -- A concurrent start inserted this id first; it has committed by now.
        RETURN QUERY SELECT 'exists'::text, NULL::integer, 0::bigint, r.workflow::text,
                r.namespace::text, NULL::integer
            FROM durable_run r WHERE r.id = p_id;
        RETURN;
    END IF;
    INSERT INTO durable_run_tag (run_id, tag, status, namespace, weight, created_at)
    SELECT p_id, t.tag, 'pending', p_namespace, t.weight, t.created_at
    FROM (
        SELECT t.tag, coalesce(q.weight, 1), CASE WHEN q.per IS NOT NULL THEN v_now END
        FROM unnest(p_tags) AS t(tag)
        LEFT JOIN unnest(p_keys, p_weights, p_pers) AS q(key, weight, per)
            ON t.tag = CASE WHEN q.per IS NULL THEN 'concurrency:' ELSE 'rate:' END || q.key
    ) AS t(tag, weight, created_at);
    RETURN QUERY SELECT 'created'::text, NULL::integer, v_active, p_workflow, p_namespace,
        NULL::integer;
END
$$;


-- A quota slot's release, for the starts waiting for one (wait=): the trigger function of
-- durable_run_tag's triggers durable_quota_release (a quota tag leaving an active status)
-- and durable_quota_release_delete (one deleted while active), installed with it by
-- migration 0002_routines. It notifies, on the channel of the tag
-- ('durable_quota_' and the first 16 hex digits of its md5), with the tag as payload, only
-- when a waiter of the tag is registered: a waiter LISTENs to its keys' channels only.
-- PostgreSQL sends the notification when the transition's transaction commits, and never
-- when it rolls back.
--
-- A waiter's registration (durable_django.stores.postgres.listening, which holds the
-- lock numbers below) is a session-level shared advisory lock (1702001001,
-- hashtext(tag)) on its listening connection, so a waiter that dies is unregistered with
-- its connection. The trigger tests it by trying that lock exclusively and giving it back
-- at once (this call leaves no lock behind it); the try fails while a waiter holds it, or
-- for the instant another release tests it too (a notification nobody needs, no harm).
--
-- The race of a waiter registering between this test and the commit is closed by the
-- release lock: this transaction holds (1702001002, hashtext(tag) & 1023) shared until it
-- ends, and a waiter, once registered and before it LISTENs and counts, takes that lock
-- exclusively and gives it back, so waiting out every release that tested before it
-- registered: its count sees them committed. The 1024 buckets bound the locks a
-- transaction releasing many keys holds; a waiter may wait out a release of another key of
-- its bucket.
CREATE OR REPLACE FUNCTION durable_quota_release_notify_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_hash integer := hashtext(OLD.tag);
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1702001002, v_hash & 1023);
    IF pg_try_advisory_lock(1702001001, v_hash) THEN
        PERFORM pg_advisory_unlock(1702001001, v_hash);
    ELSE
        PERFORM pg_notify('durable_quota_' || left(md5(OLD.tag), 16), OLD.tag);
    END IF;
    RETURN NULL;
END
$$;


-- A batch of starts in one call, set-based: for each element of the batch, in order, what
-- durable_start_run_v2 does, in a fixed number of statements whatever the batch's size.
-- p_runs is a JSON object of arrays, which durable_django.stores.postgres.batch_text
-- builds from the elements (each holding durable_start_run_v2's arguments), numbering
-- what the decisions index; p_read_namespace is the batch's. Returns one row per element:
-- its position (from 1) and durable_start_run_v2's row for it. A refused element creates
-- nothing and the others go on.
--
-- p_runs holds, each an array:
-- - per element, in order: ids, checks (check_existing), workflows, versions, namespaces,
--   inputs, queues, parents (parent_id, null for none), attempts; quotas, its number of
--   quotas; firsts, the position of the batch's first element with its id;
-- - look_ids and look_positions: each id that an element checking existing names, at the
--   position of its first element;
-- - per quota, elements in order and each element's quotas in its order: quota_keys, its
--   key's number (from 1) among key_names, the batch's distinct keys; quota_countings, its
--   counting's number among the batch's distinct countings (a key and a set of statuses);
--   limits; weights;
-- - per counting: counting_pendings, 1 when its statuses name 'pending', else 0;
-- - per distinct (key, status) pair: pair_keys, pair_statuses; and per (counting, pair)
--   that a counting's statuses make: link_countings, link_pairs;
-- - per tag of each element, elements in order: tag_positions, tag_names, tag_weights (a
--   quota's tag weighs its quota's weight, other tags 1);
-- - the units each element's run would add to the batch's keys, elements in order:
--   add_positions, add_keys, add_weights: each of its tags 'concurrency:' || K, K a key
--   of the batch, when its namespace is counted (p_read_namespace NULL, or its namespace).
--
-- 1. One statement reads p_runs into arrays, and reads no table; arrays of another length
--    than their kind's raise before anything is locked.
-- 2. Every key of the batch is locked by one call of durable_lock_quota_keys_v1 (byte
--    order, COLLATE "C", which is also the code point order the portable path sorts keys
--    in): batches and single starts serialise on the same locks and never wait on each
--    other in a cycle, in whatever order their elements name the keys (a lock this
--    transaction holds is taken again without waiting). Everything below is read by
--    statements begun after the locks were granted, first each key's operator's
--    override in force (its limit in place of the elements' for that key), as
--    durable_start_run_v2 reads it.
-- 3. One statement reads, for each id that an element checking existing names, the run
--    holding it (in any namespace); none when no element checks existing.
-- 4. One statement counts the units of each distinct (key, status) pair once: the sum of
--    the weights of the key's tag rows in that status (in p_read_namespace when given),
--    read from the index on (tag, status, namespace) by tag and status, as each search
--    of durable_start_run_v2's count is; a counting's units are the sum over its
--    statuses (each named once).
-- 5. A loop over the elements decides each in order, on arrays, with no SQL: one that
--    checks existing and whose id is held (before the batch, or by an earlier element)
--    is 'exists'; else each of its quotas in order, its units being its counting's plus,
--    when its statuses name 'pending', those the batch's created runs added to its key:
--    the first over its limit refuses ('refused', its position, its units and the limit
--    it met; a weight below 1 raises when its quota is reached, as there); else, when its
--    id is held, 'exists' (durable_start_run_v2's insert meets the id); else 'created',
--    with the units of its last quota, and its run's units are added.
-- 6. One INSERT ... SELECT of the created runs, in order, each created_at the clock when
--    its row is made (as durable_start_run_v2's is), and one of their tags.
--
-- Its statements are planned once per connection under durable_start_run_v2's settings,
-- for the same reasons (see there).
--
-- An id the insert meets although step 5 created it (a concurrent start inserted it after
-- step 3, or a run held it already and no element naming it checks existing) changes what
-- the decisions must be: the runs inserted are deleted again (this transaction made them
-- and nothing refers to them yet), and steps 3 to 6 are made again under the locks
-- already held, step 3 now reading the run holding each id of the batch: an element whose
-- id is held then goes through its quotas and is 'exists', as durable_start_run_v2's
-- insert meeting it makes it. Each pass finds held every id the one before met, so the
-- passes end; should concurrent inserts meet the batch more times than it has elements,
-- it raises serialization_failure (SQLSTATE 40001) rather than go on, and creates nothing.
CREATE OR REPLACE FUNCTION durable_start_runs_v2(
    p_runs jsonb,
    p_read_namespace text
) RETURNS TABLE(
    "position" integer, outcome text, refused integer, active bigint, found_workflow text,
    found_namespace text, refused_limit integer
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    v_n integer;
    -- per element, by position
    v_ids text[];
    v_checks boolean[];
    v_workflows text[];
    v_versions text[];
    v_namespaces text[];
    v_inputs jsonb[];
    v_queues text[];
    v_parents text[];
    v_attempts integer[];
    v_quotas integer[];
    v_firsts integer[];  -- the position of the batch's first element with its id
    v_created boolean[];
    -- by the position of an id's first element: the run holding the id, once known
    v_held_workflows text[];
    v_held_namespaces text[];
    -- the ids looked for (at their first element's position), and the runs found
    v_look_ids text[];
    v_look_positions integer[];
    v_found_positions integer[];
    v_found_holders text[];
    v_found_spaces text[];
    -- per quota, elements in order, each element's quotas in order
    v_quota_keys integer[];  -- its key's number
    v_quota_countings integer[];  -- its counting's number
    v_limits integer[];
    v_weights integer[];
    -- per key of the batch, by number
    v_key_names text[];
    v_key_limits integer[];  -- its operator's override's limit (NULL: none in force)
    v_added bigint[];  -- the units the batch's created runs added
    -- per counting, by number
    v_counting_units bigint[];  -- the units it counts before the batch
    v_counting_pendings integer[];  -- 1 when its statuses name 'pending', else 0
    -- per (key, status) pair, and per (counting, pair) a counting's statuses make
    v_pair_keys text[];
    v_pair_statuses text[];
    v_link_countings integer[];
    v_link_pairs integer[];
    -- the tags of every element
    v_tag_positions integer[];
    v_tag_names text[];
    v_tag_weights integer[];
    -- the units each element's run would add, elements in order
    v_add_positions integer[];
    v_add_keys integer[];
    v_add_weights integer[];
    v_adds integer;
    -- the rows returned, by position
    v_outcomes text[];
    v_refused integer[];
    v_active bigint[];
    v_refused_limits integer[];
    v_found_workflows text[];
    v_found_namespaces text[];
    -- the loop
    v_quota integer;
    v_add integer;
    v_first integer;
    v_held integer;
    v_weight integer;
    v_limit integer;
    v_count bigint;
    v_refusing integer;
    v_made integer;
    v_inserted text[];
    v_quota_count integer;
    v_passes integer := 0;
BEGIN
    SELECT x.ids, x.checks, x.workflows, x.versions, x.namespaces, x.queues, x.parents,
        x.attempts, x.quotas, x.firsts, x.look_ids, x.look_positions, x.quota_keys,
        x.quota_countings, x.limits, x.weights, x.key_names, x.counting_pendings,
        x.pair_keys, x.pair_statuses, x.link_countings, x.link_pairs, x.tag_positions,
        x.tag_names, x.tag_weights, x.add_positions, x.add_keys, x.add_weights
    INTO v_ids, v_checks, v_workflows, v_versions, v_namespaces, v_queues, v_parents,
        v_attempts, v_quotas, v_firsts, v_look_ids, v_look_positions, v_quota_keys,
        v_quota_countings, v_limits, v_weights, v_key_names, v_counting_pendings,
        v_pair_keys, v_pair_statuses, v_link_countings, v_link_pairs, v_tag_positions,
        v_tag_names, v_tag_weights, v_add_positions, v_add_keys, v_add_weights
    FROM jsonb_to_record(p_runs) AS x(
        ids text[], checks boolean[], workflows text[], versions text[], namespaces text[],
        queues text[], parents text[], attempts integer[], quotas integer[],
        firsts integer[], look_ids text[], look_positions integer[], quota_keys integer[],
        quota_countings integer[], limits integer[], weights integer[], key_names text[],
        counting_pendings integer[], pair_keys text[], pair_statuses text[],
        link_countings integer[], link_pairs integer[], tag_positions integer[],
        tag_names text[], tag_weights integer[], add_positions integer[],
        add_keys integer[], add_weights integer[]
    );
    -- Each input as the JSON value it is (a JSON null too, where jsonb[] would hold NULL).
    v_inputs := ARRAY(
        SELECT e.value FROM jsonb_array_elements(p_runs -> 'inputs') WITH ORDINALITY AS e(value, n)
        ORDER BY e.n
    );
    v_n := coalesce(cardinality(v_ids), 0);
    v_quota_count := (SELECT coalesce(sum(q), 0) FROM unnest(v_quotas) AS q);
    IF coalesce(cardinality(v_checks), 0) <> v_n
        OR coalesce(cardinality(v_workflows), 0) <> v_n
        OR coalesce(cardinality(v_versions), 0) <> v_n
        OR coalesce(cardinality(v_namespaces), 0) <> v_n
        OR coalesce(cardinality(v_inputs), 0) <> v_n
        OR coalesce(cardinality(v_queues), 0) <> v_n
        OR coalesce(cardinality(v_parents), 0) <> v_n
        OR coalesce(cardinality(v_attempts), 0) <> v_n
        OR coalesce(cardinality(v_quotas), 0) <> v_n
        OR coalesce(cardinality(v_firsts), 0) <> v_n
        OR coalesce(cardinality(v_look_ids), 0) <> coalesce(cardinality(v_look_positions), 0)
        OR coalesce(cardinality(v_quota_keys), 0) <> v_quota_count
        OR coalesce(cardinality(v_quota_countings), 0) <> v_quota_count
        OR coalesce(cardinality(v_limits), 0) <> v_quota_count
        OR coalesce(cardinality(v_weights), 0) <> v_quota_count
        OR coalesce(cardinality(v_pair_keys), 0) <> coalesce(cardinality(v_pair_statuses), 0)
        OR coalesce(cardinality(v_link_countings), 0) <> coalesce(cardinality(v_link_pairs), 0)
        OR coalesce(cardinality(v_tag_positions), 0) <> coalesce(cardinality(v_tag_names), 0)
        OR coalesce(cardinality(v_tag_positions), 0) <> coalesce(cardinality(v_tag_weights), 0)
        OR coalesce(cardinality(v_add_positions), 0) <> coalesce(cardinality(v_add_keys), 0)
        OR coalesce(cardinality(v_add_positions), 0) <> coalesce(cardinality(v_add_weights), 0)
    THEN
        RAISE EXCEPTION 'durable_start_runs_v2 takes arrays of one length per kind';
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;

    IF cardinality(v_key_names) > 0 THEN
        PERFORM durable_lock_quota_keys_v1(v_key_names);
        v_key_limits := ARRAY(
            SELECT (SELECT o.quota_limit FROM durable_quota_override AS o
                WHERE o.tag = 'concurrency:' || k.key AND o.scope = coalesce(p_read_namespace, '')
                    AND (o.until IS NULL OR o.until > clock_timestamp()))
            FROM unnest(v_key_names) WITH ORDINALITY AS k(key, n)
            ORDER BY k.n
        );
    END IF;

    LOOP
        v_held_workflows := array_fill(NULL::text, ARRAY[v_n]);
        v_held_namespaces := array_fill(NULL::text, ARRAY[v_n]);
        IF cardinality(v_look_ids) > 0 THEN
            SELECT array_agg(l.pos), array_agg(r.workflow::text), array_agg(r.namespace::text)
            INTO v_found_positions, v_found_holders, v_found_spaces
            FROM unnest(v_look_ids, v_look_positions) AS l(id, pos)
            JOIN durable_run AS r ON r.id = l.id;
            FOR v_i IN 1 .. coalesce(cardinality(v_found_positions), 0) LOOP
                v_held_workflows[v_found_positions[v_i]] := v_found_holders[v_i];
                v_held_namespaces[v_found_positions[v_i]] := v_found_spaces[v_i];
            END LOOP;
        END IF;

        IF cardinality(v_counting_pendings) > 0 THEN
            WITH pair AS MATERIALIZED (
                SELECT p.n::integer AS pair, (
                    SELECT coalesce(sum(c.weight), 0) FROM (
                        SELECT t.weight FROM durable_run_tag AS t
                        WHERE t.tag = 'concurrency:' || p.key AND t.status = p.status
                            AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace)
                    ) AS c
                ) AS units
                FROM unnest(v_pair_keys, v_pair_statuses) WITH ORDINALITY AS p(key, status, n)
            )
            SELECT array_agg(coalesce(s.units, 0) ORDER BY c.n) INTO v_counting_units
            FROM generate_series(1, cardinality(v_counting_pendings)) AS c(n)
            LEFT JOIN (
                SELECT l.counting, sum(pr.units)::bigint AS units
                FROM unnest(v_link_countings, v_link_pairs) AS l(counting, pair)
                JOIN pair AS pr ON pr.pair = l.pair
                GROUP BY l.counting
            ) AS s ON s.counting = c.n;
        END IF;

        v_added := array_fill(0::bigint, ARRAY[coalesce(cardinality(v_key_names), 0)]);
        v_adds := coalesce(cardinality(v_add_positions), 0);
        v_created := array_fill(false, ARRAY[v_n]);
        v_outcomes := array_fill(NULL::text, ARRAY[v_n]);
        v_refused := array_fill(NULL::integer, ARRAY[v_n]);
        v_active := array_fill(0::bigint, ARRAY[v_n]);
        v_refused_limits := array_fill(NULL::integer, ARRAY[v_n]);
        v_found_workflows := array_fill(NULL::text, ARRAY[v_n]);
        v_found_namespaces := array_fill(NULL::text, ARRAY[v_n]);
        v_quota := 1;
        v_add := 1;
        v_made := 0;
        -- The decision of durable_start_run_v2 (its definition), for each element in order.
        FOR v_e IN 1 .. v_n LOOP
            v_first := v_quota;
            v_quota := v_quota + v_quotas[v_e];
            v_held := v_firsts[v_e];
            IF v_checks[v_e] AND v_held_workflows[v_held] IS NOT NULL THEN
                v_outcomes[v_e] := 'exists';
                v_found_workflows[v_e] := v_held_workflows[v_held];
                v_found_namespaces[v_e] := v_held_namespaces[v_held];
                CONTINUE;
            END IF;
            v_count := 0;
            v_refusing := NULL;
            FOR v_q IN v_first .. v_quota - 1 LOOP
                v_weight := v_weights[v_q];
                IF v_weight IS NULL OR v_weight < 1 THEN
                    RAISE EXCEPTION 'durable_start_runs_v2: weight % of key % is below 1',
                        v_weight, v_key_names[v_quota_keys[v_q]];
                END IF;
                v_count := v_counting_units[v_quota_countings[v_q]]
                    + v_counting_pendings[v_quota_countings[v_q]] * v_added[v_quota_keys[v_q]];
                v_limit := coalesce(v_key_limits[v_quota_keys[v_q]], v_limits[v_q]);
                IF NOT (v_count + v_weight <= v_limit) THEN
                    v_refusing := v_q - v_first + 1;
                    EXIT;
                END IF;
            END LOOP;
            IF v_refusing IS NOT NULL THEN
                v_outcomes[v_e] := 'refused';
                v_refused[v_e] := v_refusing;
                v_active[v_e] := v_count;
                v_refused_limits[v_e] := v_limit;
            ELSIF v_held_workflows[v_held] IS NOT NULL THEN
                v_outcomes[v_e] := 'exists';
                v_found_workflows[v_e] := v_held_workflows[v_held];
                v_found_namespaces[v_e] := v_held_namespaces[v_held];
            ELSE
                v_held_workflows[v_held] := v_workflows[v_e];
                v_held_namespaces[v_held] := v_namespaces[v_e];
                v_created[v_e] := true;
                v_made := v_made + 1;
                v_outcomes[v_e] := 'created';
                v_active[v_e] := v_count;
                v_found_workflows[v_e] := v_workflows[v_e];
                v_found_namespaces[v_e] := v_namespaces[v_e];
                WHILE v_add <= v_adds AND v_add_positions[v_add] <= v_e LOOP
                    IF v_add_positions[v_add] = v_e THEN
                        v_added[v_add_keys[v_add]] := v_added[v_add_keys[v_add]]
                            + v_add_weights[v_add];
                    END IF;
                    v_add := v_add + 1;
                END LOOP;
            END IF;
        END LOOP;

        EXIT WHEN v_made = 0;
        WITH made AS (
            INSERT INTO durable_run (
                id, workflow, version, namespace, status, queue, input, output, error,
                parent_id, blocked_reason, attempt, created_at, updated_at, started_at,
                finished_at
            )
            SELECT
                u.id, u.workflow, u.version, u.namespace, 'pending', u.queue, u.input, NULL, NULL,
                u.parent_id, '', u.attempt, u.now, u.now, NULL, NULL
            FROM (
                -- a subquery of its own: clock_timestamp() is read once per row
                SELECT u.*, clock_timestamp() AS now
                FROM unnest(
                    v_ids, v_workflows, v_versions, v_namespaces, v_queues, v_inputs,
                    v_parents, v_attempts, v_created
                ) AS u(id, workflow, version, namespace, queue, input, parent_id, attempt,
                    made)
                WHERE u.made
            ) AS u
            ON CONFLICT (id) DO NOTHING
            RETURNING durable_run.id
        )
        SELECT array_agg(m.id) INTO v_inserted FROM made AS m;
        IF coalesce(cardinality(v_inserted), 0) = v_made THEN
            INSERT INTO durable_run_tag (run_id, tag, status, namespace, weight)
            SELECT v_ids[t.pos], t.tag, 'pending', v_namespaces[t.pos], t.weight
            FROM unnest(v_tag_positions, v_tag_names, v_tag_weights) AS t(pos, tag, weight)
            WHERE v_created[t.pos];
            EXIT;
        END IF;
        -- An id met: undo the inserts, and decide again, every id of the batch looked for.
        DELETE FROM durable_run AS r WHERE r.id = ANY (v_inserted);
        v_passes := v_passes + 1;
        IF v_passes > v_n THEN
            RAISE EXCEPTION 'durable_start_runs_v2: its inserts met % times ids inserted by others',
                v_passes USING ERRCODE = '40001';
        END IF;
        SELECT array_agg(f.id ORDER BY f.n), array_agg(f.n ORDER BY f.n)
        INTO v_look_ids, v_look_positions
        FROM unnest(v_ids, v_firsts) WITH ORDINALITY AS f(id, first, n)
        WHERE f.first = f.n;
    END LOOP;

    RETURN QUERY
    SELECT o.ord::integer, o.oc, o.rf, o.ac, o.fw, o.fn, o.rl
    FROM unnest(
        v_outcomes, v_refused, v_active, v_found_workflows, v_found_namespaces,
        v_refused_limits
    ) WITH ORDINALITY AS o(oc, rf, ac, fw, fn, rl, ord);
END
$$;


-- durable_record_held_step_v1's record for a caller that commits in the same round trip,
-- a transactional step ("SELECT durable_record_held_step_v2(...); COMMIT", one query
-- string): when p_owner does not hold the running run it records nothing and raises
-- SQLSTATE 'DUR01', so that the server skips the COMMIT after it and the transaction,
-- the step's own writes with it, is rolled back by its caller.
CREATE OR REPLACE FUNCTION durable_record_held_step_v2(
    p_id text,
    p_owner text,
    p_position integer,
    p_name text,
    p_result jsonb,
    p_error jsonb,
    p_now timestamptz
) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT durable_record_held_step_v1(
        p_id, p_owner, p_position, p_name, p_result, p_error, p_now
    ) THEN
        RAISE EXCEPTION 'run % is not held by %', p_id, p_owner USING ERRCODE = 'DUR01';
    END IF;
END
$$;


-- A run's tag rows deleted with it: the trigger function of durable_run's trigger
-- durable_run_deleted (AFTER DELETE, FOR EACH ROW), installed with it by migration
-- 0006_tag_rows_deleted_with_their_run (durable_django.stores.run_deletion). The tag rows
-- have no foreign key to their run; a run deleted otherwise than through Django (which
-- deletes them first) must not leave an active tag row counted against its key for good.
-- Deleting an active quota tag row fires durable_quota_release_delete, so a waiting start
-- hears of the slot freed. Its statement is run_deletion.RULE, the text the other
-- databases' triggers are made of (a test binds the two).
CREATE OR REPLACE FUNCTION durable_run_deleted_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM durable_run_tag WHERE run_id = OLD.id;
    RETURN NULL;
END
$$;
