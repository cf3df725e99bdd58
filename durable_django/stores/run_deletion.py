"""A run's tag rows deleted with it by the database: the trigger that stands where the
foreign key of ``durable_run_tag.run_id`` stood.

Every tag row is inserted in the transaction that inserts its run (a start) or that holds
the run's row lock (a retry's new quotas, after its transition's update), so the key's
check on each insert only repeated what the store already guarantees, and cost a query
planned anew in every server process: a new connection's first start paid it. What the
key gave beyond that is kept, and made better: a run deleted without its tag rows (a
``DELETE`` written by hand) must not leave an active tag row behind, counted against its
key for good. The key made such a ``DELETE`` fail; the trigger deletes the tag rows with
the run, so the key's slot is freed (and, on PostgreSQL, the release is notified to the
starts waiting for it by ``durable_run_tag``'s own triggers).

Django deletes a run's tag rows itself before the run (``on_delete=CASCADE``), so through
the ORM the trigger finds none; its cost is one index search per deleted run, where the
key's check on a delete made one too.

The rule is one statement, :data:`RULE`: MariaDB's, MySQL's and SQLite's triggers are
made of it, and PostgreSQL's calls ``durable_run_deleted_v1`` of ``functions.sql``
(a trigger there calls a function), whose statement it is
(``tests/stores/test_run_deletion.py`` binds the two).

On SQLite, Django alters most columns of a table by making it again, which drops the
table's triggers with the old table: a later migration that does so to ``durable_run``
must run :class:`DeleteTagRowsWithRun` again after it (the same test fails until it does).
"""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations.base import OperationCategory

from .database_operations import DatabaseOperation
from .postgres import function_definitions

#: The trigger's name, on ``durable_run``.
TRIGGER = "durable_run_deleted"
#: The rule: the tag rows of the run being deleted (``OLD``), names filled in.
RULE = "DELETE FROM {tags} WHERE {run_id} = OLD.{id}"
#: The dialects the trigger is made for (Django's ``connection.vendor``).
VENDORS = ("postgresql", "mysql", "sqlite")


class DeleteTagRowsWithRun(DatabaseOperation):
    """Install, on every database where the routers let ``Run`` migrate, the trigger
    ``durable_run_deleted`` deleting a run's tag rows with the run (:data:`RULE`, after
    each deleted row of ``durable_run``); on PostgreSQL it calls ``function``, which the
    same migration installs first. Backwards, drop it."""

    category = OperationCategory.ADDITION
    model_name = "Run"

    def __init__(self, function: str) -> None:
        if function not in function_definitions():
            raise ValueError(f"DeleteTagRowsWithRun: functions.sql does not define {function!r}")
        self.function = function

    def _names(self, app_label: str, schema_editor: Any, state: Any) -> dict[str, str] | None:
        """The quoted names the statements use, or ``None`` where the operation is not
        made."""
        if not self.allowed(app_label, schema_editor, state):
            return None
        runs = state.apps.get_model(app_label, "Run")
        tags = state.apps.get_model(app_label, "RunTag")
        q = schema_editor.quote_name
        return {
            "runs": q(runs._meta.db_table),
            "tags": q(tags._meta.db_table),
            "run_id": q(tags._meta.get_field("run").column),
            "id": q(runs._meta.pk.column),
            "trigger": q(TRIGGER),
            "function": q(self.function),
        }

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        names = self._names(app_label, schema_editor, to_state)
        if names is not None:
            # No parameters: the statement is sent as it is written.
            schema_editor.execute(statement(schema_editor.connection.vendor, names), params=None)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        names = self._names(app_label, schema_editor, from_state)
        if names is not None:
            on = " ON {runs}" if schema_editor.connection.vendor == "postgresql" else ""
            schema_editor.execute(
                ("DROP TRIGGER IF EXISTS {trigger}" + on).format(**names), params=None
            )

    def describe(self) -> str:
        return "Install the trigger deleting a run's tag rows with it"

    @property
    def migration_name_fragment(self) -> str:
        return "run_deleted_trigger"


def statement(vendor: str, names: dict[str, str]) -> str:
    """The statement making the trigger on a database of ``vendor``, with ``names``
    (quoted: ``runs``, ``tags``, ``run_id``, ``id``, ``trigger``, ``function``)."""
    if vendor not in VENDORS:
        raise ValueError(f"DeleteTagRowsWithRun: no trigger for the {vendor!r} database")
    head = "CREATE TRIGGER {trigger} AFTER DELETE ON {runs} FOR EACH ROW ".format(**names)
    if vendor == "postgresql":
        return head + "EXECUTE FUNCTION {function}()".format(**names)
    rule = RULE.format(**names)
    return head + (rule if vendor == "mysql" else f"BEGIN {rule}; END")
