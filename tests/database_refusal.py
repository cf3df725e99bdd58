"""A database that refuses some writes, for the tests of what a refused write does: a
trigger of the test's own, on SQLite, PostgreSQL and MariaDB alike. DDL commits on
MariaDB: use it in ``transaction=True`` tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection

MESSAGE = "refused by a trigger"


@contextlib.contextmanager
def refusing(table: str, event: str, condition: str) -> Iterator[None]:
    """While inside, the database refuses an ``event`` (``INSERT``, ``UPDATE``) on ``table``
    whose new row meets the SQL ``condition`` (on ``NEW``), raising :data:`MESSAGE`."""
    name = "durable_test_refuse"
    install = {
        "sqlite": [
            f"CREATE TRIGGER {name} BEFORE {event} ON {table} "
            f"WHEN {condition} BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        ],
        "postgresql": [
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF {condition} THEN RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = '22023'; "
            "END IF; RETURN NEW; END $$",
            f"CREATE TRIGGER {name} BEFORE {event} ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {name}()",
        ],
        "mysql": [
            f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW BEGIN "
            f"IF {condition} THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{MESSAGE}'; "
            "END IF; END"
        ],
    }[connection.vendor]
    remove = {
        "sqlite": [f"DROP TRIGGER {name}"],
        "postgresql": [f"DROP TRIGGER {name} ON {table}", f"DROP FUNCTION {name}()"],
        "mysql": [f"DROP TRIGGER {name}"],
    }[connection.vendor]
    with connection.cursor() as cursor:
        for sql in install:
            cursor.execute(sql)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for sql in remove:
                cursor.execute(sql)


def runs_refused(workflow: str) -> contextlib.AbstractContextManager[None]:
    """While inside, the database refuses to insert a run of ``workflow``."""
    return refusing("durable_run", "INSERT", f"NEW.workflow = '{workflow}'")
