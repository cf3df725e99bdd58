"""A database that refuses some inserts, for the tests of what a refused write does: a
trigger on ``durable_run`` that raises for the runs of one workflow, on SQLite,
PostgreSQL and MariaDB alike. DDL commits on MariaDB: use it in ``transaction=True``
tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection

MESSAGE = "refused by the test database"


@contextlib.contextmanager
def runs_refused(workflow: str) -> Iterator[None]:
    """While inside, the database refuses to insert a run of ``workflow``."""
    name = "durable_test_refuse"
    install = {
        "sqlite": [
            f"CREATE TRIGGER {name} BEFORE INSERT ON durable_run "
            f"WHEN NEW.workflow = '{workflow}' BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        ],
        "postgresql": [
            f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
            f"RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = '22023'; END $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER {name} BEFORE INSERT ON durable_run FOR EACH ROW "
            f"WHEN (NEW.workflow = '{workflow}') EXECUTE FUNCTION {name}()",
        ],
        "mysql": [
            f"CREATE TRIGGER {name} BEFORE INSERT ON durable_run FOR EACH ROW BEGIN "
            f"IF NEW.workflow = '{workflow}' THEN "
            f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{MESSAGE}'; END IF; END"
        ],
    }[connection.vendor]
    remove = {
        "sqlite": [f"DROP TRIGGER {name}"],
        "postgresql": [f"DROP TRIGGER {name} ON durable_run", f"DROP FUNCTION {name}()"],
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
