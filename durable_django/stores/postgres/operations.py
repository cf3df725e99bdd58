"""Migration operations made on PostgreSQL only, where the database routers allow them
(:class:`~durable_django.stores.database_operations.DatabaseOperation`), as Django's
``django.contrib.postgres.operations.CreateExtension`` is.

- :class:`InstallFunctions` installs functions of ``functions.sql`` (and drops them
  backwards);
- :class:`InstallReleaseTriggers` installs the triggers notifying a quota slot's release
  (and drops them backwards);
- :class:`RemoveLikeIndexes` keeps out the ``varchar_pattern_ops`` indexes (``..._like``)
  Django makes on PostgreSQL beside the index of a ``CharField``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.migrations.operations.base import OperationCategory

from ..._core.lifecycle import ACTIVE_STATUSES
from ..._core.limits import TAG_PREFIX
from ..database_operations import DatabaseOperation
from ..routines import InstallRoutines
from . import FUNCTIONS, function_definitions


class InstallFunctions(InstallRoutines):
    """Install the functions ``names`` of ``functions.sql`` on a PostgreSQL database where
    the routers let the app migrate (``router.allow_migrate(alias, app_label, **hints)``);
    backwards, drop them. Other databases get nothing.

    A migration names the functions it installs: a later one adding a new version of a
    function installs that version alone, and its reverse drops that version alone.
    """

    file = FUNCTIONS

    def applies_to(self, connection: Any) -> bool:
        return bool(connection.vendor == "postgresql")

    def describe(self) -> str:
        return f"Install the PostgreSQL functions {', '.join(self.names)}"

    @property
    def migration_name_fragment(self) -> str:
        return "postgresql_functions"


class InstallReleaseTriggers(DatabaseOperation):
    """Install, on a PostgreSQL database where the routers let ``RunTag`` migrate, the
    triggers of ``durable_run_tag`` calling ``function`` (which the same migration
    installs first) for each quota tag (``concurrency:...``) leaving an active status:

    - ``durable_quota_release``: ``AFTER UPDATE OF status``, for a row whose status moves
      from an active status to a finished one;
    - ``durable_quota_release_delete``: ``AFTER DELETE``, for a row deleted while active.

    Backwards, drop them. Other databases get nothing.
    """

    category = OperationCategory.ADDITION
    model_name = "RunTag"

    TRIGGERS = ("durable_quota_release", "durable_quota_release_delete")

    def __init__(self, function: str) -> None:
        if function not in function_definitions():
            raise ValueError(f"InstallReleaseTriggers: functions.sql does not define {function!r}")
        self.function = function

    def applies_to(self, connection: Any) -> bool:
        return bool(connection.vendor == "postgresql")

    def _table(self, app_label: str, schema_editor: Any, state: Any) -> str | None:
        """The quoted table of the run tags, or ``None`` where the operation is not made."""
        if not self.allowed(app_label, schema_editor, state):
            return None
        model = state.apps.get_model(app_label, self.model_name)
        return str(schema_editor.quote_name(model._meta.db_table))

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        table = self._table(app_label, schema_editor, to_state)
        if table is None:
            return
        active = ", ".join(f"'{status}'" for status in ACTIVE_STATUSES)
        quota = f"OLD.tag LIKE '{TAG_PREFIX}%'"
        function = schema_editor.quote_name(self.function)
        update, delete = (schema_editor.quote_name(name) for name in self.TRIGGERS)
        schema_editor.execute(
            f"CREATE TRIGGER {update} AFTER UPDATE OF status ON {table} FOR EACH ROW "
            f"WHEN (OLD.status IN ({active}) AND NEW.status NOT IN ({active}) AND {quota}) "
            f"EXECUTE FUNCTION {function}()",
            params=None,
        )
        schema_editor.execute(
            f"CREATE TRIGGER {delete} AFTER DELETE ON {table} FOR EACH ROW "
            f"WHEN (OLD.status IN ({active}) AND {quota}) "
            f"EXECUTE FUNCTION {function}()",
            params=None,
        )

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        table = self._table(app_label, schema_editor, from_state)
        if table is None:
            return
        for name in self.TRIGGERS:
            schema_editor.execute(
                f"DROP TRIGGER IF EXISTS {schema_editor.quote_name(name)} ON {table}",
                params=None,
            )

    def describe(self) -> str:
        return f"Install the triggers notifying quota releases through {self.function}"

    @property
    def migration_name_fragment(self) -> str:
        return "quota_release_notify"


class RemoveLikeIndexes(DatabaseOperation):
    """Keep out, on PostgreSQL, the ``varchar_pattern_ops`` index (``..._like``) Django
    makes beside the index of each of ``fields`` of ``model_name``; backwards, make them.

    They serve ``LIKE 'prefix%'`` queries only, and every write that changes the row's
    indexed columns updates them. Placed after the model's creation in the same
    migration, it removes them from the schema editor's deferred statements before they
    are made; later, it drops them.
    """

    category = OperationCategory.REMOVAL
    model_name: str

    def __init__(self, model_name: str, fields: Sequence[str]) -> None:
        self.model_name = model_name
        self.fields = list(fields)

    def applies_to(self, connection: Any) -> bool:
        return bool(connection.vendor == "postgresql")

    def _fields(self, app_label: str, schema_editor: Any, state: Any) -> list[tuple[Any, Any]]:
        """``(model, field)`` of each field, or nothing where the operation is not made."""
        if not self.allowed(app_label, schema_editor, state):
            return []
        model = state.apps.get_model(app_label, self.model_name)
        return [(model, model._meta.get_field(name)) for name in self.fields]

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        for model, field in self._fields(app_label, schema_editor, to_state):
            statement = schema_editor._create_like_index_sql(model, field)
            if statement is None:
                continue
            made = str(statement)
            schema_editor.deferred_sql = [
                deferred for deferred in schema_editor.deferred_sql if str(deferred) != made
            ]
            name = schema_editor._create_index_name(
                model._meta.db_table, [field.column], suffix="_like"
            )
            schema_editor.execute(schema_editor._delete_index_sql(model, name))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        for model, field in self._fields(app_label, schema_editor, from_state):
            statement = schema_editor._create_like_index_sql(model, field)
            if statement is not None:
                schema_editor.execute(statement)

    def describe(self) -> str:
        return f"Remove the LIKE indexes of {self.model_name}.{', '.join(self.fields)}"

    @property
    def migration_name_fragment(self) -> str:
        return f"remove_{self.model_name.lower()}_like_indexes"
