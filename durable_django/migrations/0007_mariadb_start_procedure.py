"""A start in one call on MariaDB: the stored procedure ``durable_start_run_mariadb_v1``,
which takes the steps of the portable start (``OrmStore._start_portable``) in one round
trip.

Installed on MariaDB only, where the database routers let durable_django migrate; MySQL,
SQLite and PostgreSQL get nothing (MySQL keeps the portable start: its ``PREPARE`` takes no
local variable, and the procedure is tested on MariaDB alone). Dropped when the migration
is reversed. The procedure's text is written here, once: a change is a new
version (``durable_start_run_mariadb_v2``) in a new migration, the old one left installed
for the processes of the previous release during a rolling deploy.

What one ``CALL`` does, in the order of ``BaseStore.start_run``:

1. with ``p_own_transaction`` (the caller has no transaction open) ``START TRANSACTION``;
2. the lock rows of the keys ``p_keys`` (a JSON array of distinct keys) are locked by one
   ``UPDATE`` (``... WHERE key IN (...) ORDER BY key`` with several keys, so that starters
   of overlapping keys take their common keys in one order). A key whose row is missing is
   never inserted here: the procedure rolls back its transaction (or, inside the caller's,
   locks nothing: with several keys a read that takes no lock counts the rows first) and
   returns ``missing``; the caller inserts and commits the rows on their own, then calls
   again (``OrmStore._row_lock`` says why);
3. with ``p_check_existing``, a run with id ``p_id`` is returned as ``exists`` with its
   workflow and namespace, with nothing written (its own transaction rolled back);
4. for each quota of ``p_quotas`` (a JSON array, in declaration order, of ``[tag, limit,
   weight, [statuses]]``, at most seven statuses), the sum of the weights of the tag's rows
   in those statuses (in ``p_read_namespace`` when given); the first whose sum and weight
   exceed its limit returns ``refused``, its 1-based position and the sum, with nothing
   written (its own transaction rolled back);
5. the run (``pending``, ``created_at`` and ``updated_at`` ``p_now``) and its tags
   (``p_tags``, a JSON array of ``[tag, weight]``) are inserted, its own transaction
   committed, and ``created`` returned.

The result is one row, ``durable_start_run_v2``'s on PostgreSQL: outcome, refused, active,
found_workflow, found_namespace. An error rolls back its own transaction (a transaction of
the caller's is the caller's to roll back) and is raised again as it was (a deadlock's
1213, a duplicate run id's 1062).

Each variable compared with a column is declared in that column's character set and
collation, read from the table when the procedure is installed, so that every comparison is
the column's own (byte for byte for ids, keys and tags) and uses its index.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

PROCEDURE = "durable_start_run_mariadb_v1"

#: The columns a variable of the procedure is compared with: (model, field).
_COMPARED = {
    "id": ("Run", "id"),
    "key": ("QuotaLock", "key"),
    "tag": ("RunTag", "tag"),
    "status": ("RunTag", "status"),
    "namespace": ("RunTag", "namespace"),
}

_BODY = """
CREATE PROCEDURE {procedure}(
    IN p_id VARCHAR(255) {id},
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
    IN p_read_namespace VARCHAR(100) {namespace},
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
    DECLARE v_path VARCHAR(32) CHARACTER SET utf8mb4;
    DECLARE v_key VARCHAR(255) {key};
    DECLARE v_tag VARCHAR(255) {tag};
    DECLARE v_workflow VARCHAR(200) CHARACTER SET utf8mb4;
    DECLARE v_namespace VARCHAR(100) CHARACTER SET utf8mb4;
    DECLARE v_s1, v_s2, v_s3, v_s4, v_s5, v_s6, v_s7 VARCHAR(16) {status};
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
        UPDATE {lock_table} SET {last_start_at} = p_now WHERE {key_column} = v_key;
        SET v_found = ROW_COUNT();
    ELSEIF v_keys > 1 THEN
        IF NOT p_own_transaction THEN
            -- Inside the caller's transaction, a missing row is found by a read that
            -- takes no lock, before the UPDATE locks any row. (SELECT ... INTO: a
            -- subquery of a SET would take a shared lock of the row, and two starters
            -- holding one each would deadlock upgrading it.)
            WHILE v_i < v_keys DO
                SET v_key = JSON_VALUE(p_keys, CONCAT('$[', v_i, ']'));
                SELECT COUNT(*) INTO v_count FROM {lock_table} WHERE {key_column} = v_key;
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
                SET v_sql = CONCAT(v_sql, IF(v_i > 0, ', ', ''), '{key_introducer}X''',
                    HEX(v_key), '''');
                SET v_i = v_i + 1;
            END WHILE;
            SET v_sql = CONCAT('UPDATE {lock_table} SET {last_start_at} = ? WHERE ',
                '{key_column} IN (', v_sql, ') ORDER BY {key_column}');
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
        SELECT 'missing', NULL, 0, NULL, NULL;
        LEAVE body;
    END IF;

    IF p_check_existing THEN
        SELECT COUNT(*), MAX({workflow}), MAX({run_namespace})
            INTO v_found, v_workflow, v_namespace
            FROM {run_table} WHERE {id_column} = p_id;
        IF v_found > 0 THEN
            IF p_own_transaction THEN
                ROLLBACK;
            END IF;
            SELECT 'exists', NULL, 0, v_workflow, v_namespace;
            LEAVE body;
        END IF;
    END IF;

    SET v_i = 0;
    WHILE v_i < v_quotas DO
        SET v_path = CONCAT('$[', v_i, ']');
        SET v_tag = JSON_VALUE(p_quotas, CONCAT(v_path, '[0]'));
        SET v_limit = JSON_VALUE(p_quotas, CONCAT(v_path, '[1]'));
        SET v_weight = JSON_VALUE(p_quotas, CONCAT(v_path, '[2]'));
        SET v_s1 = JSON_VALUE(p_quotas, CONCAT(v_path, '[3][0]'));
        SET v_s2 = JSON_VALUE(p_quotas, CONCAT(v_path, '[3][1]'));
        SET v_s3 = JSON_VALUE(p_quotas, CONCAT(v_path, '[3][2]'));
        SET v_s4 = JSON_VALUE(p_quotas, CONCAT(v_path, '[3][3]'));
        SET v_s5 = JSON_VALUE(p_quotas, CONCAT(v_path, '[3][4]'));
        SET v_s6 = JSON_VALUE(p_quotas, CONCAT(v_path, '[3][5]'));
        SET v_s7 = JSON_VALUE(p_quotas, CONCAT(v_path, '[3][6]'));
        SELECT COALESCE(SUM({weight_column}), 0) INTO v_active FROM {tag_table}
            WHERE {tag_column} = v_tag
                AND {status_column} IN (v_s1, v_s2, v_s3, v_s4, v_s5, v_s6, v_s7)
                AND (p_read_namespace IS NULL OR {namespace_column} = p_read_namespace);
        IF v_active + v_weight > v_limit THEN
            IF p_own_transaction THEN
                ROLLBACK;
            END IF;
            SELECT 'refused', v_i + 1, v_active, NULL, NULL;
            LEAVE body;
        END IF;
        SET v_i = v_i + 1;
    END WHILE;

    INSERT INTO {run_table} ({run_columns}) VALUES (
        p_id, p_workflow, p_version, p_namespace, 'pending', p_queue, p_input, NULL, NULL,
        p_parent_id, '', p_attempt, p_now, p_now, NULL, NULL, NULL, NULL, '', NULL
    );
    SET v_i = 0;
    WHILE v_i < v_tags DO
        SET v_path = CONCAT('$[', v_i, ']');
        INSERT INTO {tag_table} ({tag_columns}) VALUES (
            p_id, JSON_VALUE(p_tags, CONCAT(v_path, '[0]')), 'pending', p_namespace,
            JSON_VALUE(p_tags, CONCAT(v_path, '[1]'))
        );
        SET v_i = v_i + 1;
    END WHILE;
    IF p_own_transaction THEN
        COMMIT;
    END IF;
    SELECT 'created', NULL, v_active, p_workflow, p_namespace;
END
"""

#: The run's columns in the order of the procedure's ``INSERT``.
_RUN_COLUMNS = (
    "id",
    "workflow",
    "version",
    "namespace",
    "status",
    "queue",
    "input",
    "output",
    "error",
    "parent_id",
    "blocked_reason",
    "attempt",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "wake_at",
    "wait",
    "lease_owner",
    "lease_expires_at",
)


def _allowed(apps: Any, schema_editor: Any) -> bool:
    """Whether the database is MariaDB (``RunPython`` asks the routers itself)."""
    connection = schema_editor.connection
    return connection.vendor == "mysql" and bool(connection.mysql_is_mariadb)


def procedure_sql(apps: Any, schema_editor: Any) -> str:
    """The ``CREATE PROCEDURE`` statement, for the tables of ``schema_editor``'s database."""
    quote = schema_editor.quote_name
    tables = {
        name: apps.get_model("durable_django", name)._meta.db_table
        for name in ("Run", "RunTag", "QuotaLock")
    }
    charsets: dict[str, tuple[str, str]] = {}
    with schema_editor.connection.cursor() as cursor:
        for placeholder, (model, column) in _COMPARED.items():
            cursor.execute(
                "SELECT CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = %s",
                [tables[model], column],
            )
            charset, collation = cursor.fetchone()
            charsets[placeholder] = (charset, collation)
    return _BODY.format(
        procedure=quote(PROCEDURE),
        **{
            placeholder: f"CHARACTER SET {charset} COLLATE {collation}"
            for placeholder, (charset, collation) in charsets.items()
        },
        key_introducer=f"_{charsets['key'][0]} ",
        lock_table=quote(tables["QuotaLock"]),
        run_table=quote(tables["Run"]),
        tag_table=quote(tables["RunTag"]),
        key_column=quote("key"),
        last_start_at=quote("last_start_at"),
        id_column=quote("id"),
        workflow=quote("workflow"),
        run_namespace=quote("namespace"),
        weight_column=quote("weight"),
        tag_column=quote("tag"),
        status_column=quote("status"),
        namespace_column=quote("namespace"),
        run_columns=", ".join(quote(column) for column in _RUN_COLUMNS),
        tag_columns=", ".join(
            quote(column) for column in ("run_id", "tag", "status", "namespace", "weight")
        ),
    )


def install(apps: Any, schema_editor: Any) -> None:
    if _allowed(apps, schema_editor):
        schema_editor.execute(procedure_sql(apps, schema_editor), params=None)


def drop(apps: Any, schema_editor: Any) -> None:
    if _allowed(apps, schema_editor):
        schema_editor.execute(
            f"DROP PROCEDURE IF EXISTS {schema_editor.quote_name(PROCEDURE)}", params=None
        )


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0006_quota_tickets'),
    ]

    operations = [
        migrations.RunPython(install, drop, atomic=False, elidable=False),
    ]
