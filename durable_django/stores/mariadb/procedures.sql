-- The MariaDB procedures of durable_django's ORM store: the only copy of their code.
--
-- Migration 0002_routines installs them, on MariaDB databases the database routers let
-- durable_django migrate, with the operation
-- durable_django.stores.mariadb.operations.InstallProcedures. OrmStore calls them by name
-- on MariaDB; MySQL (whose PREPARE takes no local variable), SQLite and PostgreSQL get
-- nothing, and MariaDB's other operations take the store's portable ORM path.
--
-- Versioned names. Every procedure's name ends with its version: _v1, _v2, ... Once
-- released (from 0.1.0 on), a version never changes, not its parameters, its result nor
-- its body. A change is a new version added to this file beside the old one, installed by
-- a new migration (InstallProcedures naming it) and called by the store from then on.
-- During a rolling deploy the workers of the previous release, which call the old version,
-- keep working until they are replaced. An old version stays in this file, installed,
-- until the migrations are squashed (a major release), when it leaves the file together
-- with the migration that installed it.
--
-- The form, which durable_django.stores.mariadb reads: nothing but comments and
-- "CREATE OR REPLACE PROCEDURE durable_<name>_v<N>(" statements, each ending with a line
-- "END;" (the statement is sent without its ";"). A procedure sets nothing beyond the call.
--
-- Collations. A variable compared with a column is declared in that column's character
-- set and collation, so that every comparison is the column's own (byte for byte for ids,
-- keys and tags) and uses its index. The file names them by placeholder, filled in by
-- InstallProcedures from information_schema when it installs the procedure:
-- {charset:TABLE.COLUMN} becomes "CHARACTER SET <set> COLLATE <collation>" of that column,
-- {introducer:TABLE.COLUMN} its character set's introducer ("_<set>").


-- A start in one call: the steps of the portable start (OrmStore._start_portable) in one
-- round trip. What one CALL does, in the order of BaseStore.start_run:
--
-- 1. with p_own_transaction (the caller has no transaction open) START TRANSACTION;
-- 2. the lock rows of the keys p_keys (a JSON array of distinct keys) are locked by one
--    UPDATE (... WHERE key IN (...) ORDER BY key with several keys, so that starters of
--    overlapping keys take their common keys in one order). A key whose row is missing is
--    never inserted here: the procedure rolls back its transaction (or, inside the
--    caller's, locks nothing: with several keys a read that takes no lock counts the rows
--    first) and returns 'missing'; the caller inserts and commits the rows on their own,
--    then calls again (OrmStore._row_lock says why);
-- 3. with p_check_existing, a run with id p_id is returned as 'exists' with its workflow
--    and namespace, with nothing written (its own transaction rolled back);
-- 4. for each quota of p_quotas (a JSON array, in declaration order, of [tag, limit,
--    weight, [statuses]], any number of statuses, each counted once), the sum of the
--    weights of the tag's rows in those statuses (in p_read_namespace when given), read
--    from the (tag, status, namespace) index by tag and status; for a rate limit, [tag,
--    limit, weight, [], per], the sum of the weights of the tag's rows created after
--    p_now less per seconds, whatever their status, read from the (tag, created_at,
--    weight) index; its limit is an operator's override's when one of the tag is in
--    force at p_now for the starts reading p_read_namespace (durable_quota_override,
--    scope '' for those reading every namespace), else the limit given; the first whose
--    sum and weight exceed its limit returns 'refused', its 1-based position, the sum and
--    the limit, with nothing written (its own transaction rolled back);
-- 5. the run ('pending', created_at and updated_at p_now) and its tags (p_tags, a JSON
--    array of [tag, weight], and [tag, weight, 1] for a rate limit's tag, whose row keeps
--    created_at p_now) are inserted, its own transaction committed, and 'created'
--    returned.
--
-- The result is one row, durable_start_run_v2's on PostgreSQL: outcome, refused, active,
-- found_workflow, found_namespace, refused_limit. An error rolls back its own transaction (a transaction
-- of the caller's is the caller's to roll back) and is raised again as it was (a
-- deadlock's 1213, a duplicate run id's 1062).
CREATE OR REPLACE PROCEDURE durable_start_run_mariadb_v1(
    IN p_id VARCHAR(255) {charset:durable_run.id},
    IN p_check_existing BOOLEAN,
    IN p_workflow VARCHAR(200) CHARACTER SET utf8mb4,
    IN p_version VARCHAR(64) CHARACTER SET utf8mb4,
    IN p_namespace VARCHAR(100) CHARACTER SET utf8mb4,
    IN p_input LONGTEXT CHARACTER SET utf8mb4,
    IN p_tags LONGTEXT CHARACTER SET utf8mb4,
    IN p_queue VARCHAR(200) CHARACTER SET utf8mb4,
    IN p_parent_id VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_attempt INT UNSIGNED,
    IN p_keys LONGTEXT CHARACTER SET utf8mb4,
    IN p_quotas LONGTEXT CHARACTER SET utf8mb4,
    IN p_read_namespace VARCHAR(100) {charset:durable_run_tag.namespace},
    IN p_now DATETIME(6),
    IN p_own_transaction BOOLEAN
)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
body: BEGIN
    DECLARE v_keys INT DEFAULT COALESCE(JSON_LENGTH(p_keys), 0);
    DECLARE v_quotas INT DEFAULT COALESCE(JSON_LENGTH(p_quotas), 0);
    DECLARE v_tags INT DEFAULT COALESCE(JSON_LENGTH(p_tags), 0);
    DECLARE v_i INT DEFAULT 0;
    DECLARE v_found BIGINT DEFAULT 0;
    DECLARE v_count BIGINT DEFAULT 0;
    DECLARE v_active BIGINT DEFAULT 0;
    DECLARE v_limit BIGINT;
    DECLARE v_weight BIGINT;
    DECLARE v_per DOUBLE;
    DECLARE v_path VARCHAR(32) CHARACTER SET utf8mb4;
    DECLARE v_key VARCHAR(255) {charset:durable_quota_lock.key};
    DECLARE v_tag VARCHAR(255) {charset:durable_run_tag.tag};
    DECLARE v_workflow VARCHAR(200) CHARACTER SET utf8mb4;
    DECLARE v_namespace VARCHAR(100) CHARACTER SET utf8mb4;
    DECLARE v_sql LONGTEXT CHARACTER SET utf8mb4;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        IF p_own_transaction THEN
            ROLLBACK;
        END IF;
        RESIGNAL;
    END;

    IF p_own_transaction THEN
        START TRANSACTION;
    END IF;
    IF v_keys = 1 THEN
        SET v_key = JSON_VALUE(p_keys, '$[0]');
        UPDATE durable_quota_lock SET last_start_at = p_now WHERE `key` = v_key;
        SET v_found = ROW_COUNT();
    ELSEIF v_keys > 1 THEN
        IF NOT p_own_transaction THEN
            -- Inside the caller's transaction, a missing row is found by a read that
            -- takes no lock, before the UPDATE locks any row. (SELECT ... INTO: a
            -- subquery of a SET would take a shared lock of the row, and two starters
            -- holding one each would deadlock upgrading it.)
            WHILE v_i < v_keys DO
                SET v_key = JSON_VALUE(p_keys, CONCAT('$[', v_i, ']'));
                SELECT COUNT(*) INTO v_count FROM durable_quota_lock WHERE `key` = v_key;
                SET v_found = v_found + v_count;
                SET v_i = v_i + 1;
            END WHILE;
        END IF;
        IF p_own_transaction OR v_found = v_keys THEN
            -- One UPDATE of every row in key order; the keys are written into it as
            -- hexadecimal literals of the column's character set.
            SET v_sql = '';
            SET v_i = 0;
            WHILE v_i < v_keys DO
                SET v_key = JSON_VALUE(p_keys, CONCAT('$[', v_i, ']'));
                SET v_sql = CONCAT(v_sql, IF(v_i > 0, ', ', ''),
                    '{introducer:durable_quota_lock.key} X''',
                    HEX(v_key), '''');
                SET v_i = v_i + 1;
            END WHILE;
            SET v_sql = CONCAT('UPDATE durable_quota_lock SET last_start_at = ? WHERE ',
                '`key` IN (', v_sql, ') ORDER BY `key`');
            PREPARE durable_lock_quota_rows FROM v_sql;
            EXECUTE durable_lock_quota_rows USING p_now;
            SET v_found = ROW_COUNT();
            DEALLOCATE PREPARE durable_lock_quota_rows;
        END IF;
    END IF;
    IF v_found < v_keys THEN
        IF p_own_transaction THEN
            ROLLBACK;
        END IF;
        SELECT 'missing', NULL, 0, NULL, NULL, NULL;
        LEAVE body;
    END IF;

    IF p_check_existing THEN
        SELECT COUNT(*), MAX(workflow), MAX(namespace)
            INTO v_found, v_workflow, v_namespace
            FROM durable_run WHERE id = p_id;
        IF v_found > 0 THEN
            IF p_own_transaction THEN
                ROLLBACK;
            END IF;
            SELECT 'exists', NULL, 0, v_workflow, v_namespace, NULL;
            LEAVE body;
        END IF;
    END IF;

    SET v_i = 0;
    WHILE v_i < v_quotas DO
        SET v_path = CONCAT('$[', v_i, ']');
        SET v_tag = JSON_VALUE(p_quotas, CONCAT(v_path, '[0]'));
        SET v_limit = JSON_VALUE(p_quotas, CONCAT(v_path, '[1]'));
        SET v_weight = JSON_VALUE(p_quotas, CONCAT(v_path, '[2]'));
        SET v_per = JSON_VALUE(p_quotas, CONCAT(v_path, '[4]'));
        IF v_per IS NULL THEN
            SELECT COALESCE(SUM(t.weight), 0) INTO v_active FROM durable_run_tag AS t
                WHERE t.tag = v_tag
                    AND t.status IN (SELECT j.status FROM JSON_TABLE(
                        JSON_EXTRACT(p_quotas, CONCAT(v_path, '[3]')), '$[*]'
                        COLUMNS (status VARCHAR(16) {charset:durable_run_tag.status} PATH '$')
                    ) AS j)
                    AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace);
        ELSE
            SELECT COALESCE(SUM(t.weight), 0) INTO v_active FROM durable_run_tag AS t
                WHERE t.tag = v_tag
                    AND t.created_at > p_now - INTERVAL ROUND(v_per * 1000000) MICROSECOND
                    AND (p_read_namespace IS NULL OR t.namespace = p_read_namespace);
        END IF;
        -- An operator's override of the tag in force for these starts, in place of the
        -- limit given (the unique index on (tag, scope) answers it).
        SELECT COALESCE(MAX(o.quota_limit), v_limit) INTO v_limit
            FROM durable_quota_override AS o
            WHERE o.tag = v_tag AND o.scope = COALESCE(p_read_namespace, '')
                AND (o.until IS NULL OR o.until > p_now);
        IF v_active + v_weight > v_limit THEN
            IF p_own_transaction THEN
                ROLLBACK;
            END IF;
            SELECT 'refused', v_i + 1, v_active, NULL, NULL, v_limit;
            LEAVE body;
        END IF;
        SET v_i = v_i + 1;
    END WHILE;

    INSERT INTO durable_run (
        id, workflow, version, namespace, status, queue, input, output, error, parent_id,
        blocked_reason, attempt, created_at, updated_at, started_at, finished_at, wake_at,
        wait, lease_owner, lease_expires_at
    ) VALUES (
        p_id, p_workflow, p_version, p_namespace, 'pending', p_queue, p_input, NULL, NULL,
        p_parent_id, '', p_attempt, p_now, p_now, NULL, NULL, NULL, NULL, '', NULL
    );
    SET v_i = 0;
    WHILE v_i < v_tags DO
        SET v_path = CONCAT('$[', v_i, ']');
        INSERT INTO durable_run_tag (run_id, tag, status, namespace, weight, created_at)
        VALUES (
            p_id, JSON_VALUE(p_tags, CONCAT(v_path, '[0]')), 'pending', p_namespace,
            JSON_VALUE(p_tags, CONCAT(v_path, '[1]')),
            IF(JSON_VALUE(p_tags, CONCAT(v_path, '[2]')) IS NULL, NULL, p_now)
        );
        SET v_i = v_i + 1;
    END WHILE;
    IF p_own_transaction THEN
        COMMIT;
    END IF;
    SELECT 'created', NULL, v_active, p_workflow, p_namespace, NULL;
END;
