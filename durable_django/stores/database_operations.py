"""The base of the migration operations that change the database alone (routines,
triggers, indexes Django does not know of): nothing of the migration state moves, and
each is made only on the databases it applies to, where the routers allow it.

The routers are asked one way, as Django's own operations ask them: an operation on a
model's table asks for that model (``Operation.allow_migrate_model``, which passes
``model_name`` and ``model``, as ``AlterField`` beside it in the same migration does); an
operation on no table (the routines) asks for the app with the operation's ``hints``, as
``RunSQL`` does. A router that keeps the app, or the model, off a database keeps the
operation off it too.
"""

from __future__ import annotations

from typing import Any

from django.db import router
from django.db.migrations.operations.base import Operation


class DatabaseOperation(Operation):
    """An operation on the database alone, made where :meth:`applies_to` and the routers
    allow it (:meth:`allowed`). A subclass names the model whose table it changes
    (``model_name``), or none, and then takes ``hints`` for the routers."""

    reversible = True

    #: The model whose table the operation changes, or ``None`` (the app's routines).
    model_name: str | None = None
    #: What the routers are told of an operation on no table (``RunSQL``'s ``hints``).
    hints: dict[str, Any] = {}

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def applies_to(self, connection: Any) -> bool:
        """Whether the operation is made on ``connection``'s kind of database: every
        kind, unless a subclass says otherwise."""
        return True

    def allowed(self, app_label: str, schema_editor: Any, state: Any) -> bool:
        """Whether the operation is made on ``schema_editor``'s database, at ``state``."""
        connection = schema_editor.connection
        if not self.applies_to(connection):
            return False
        if self.model_name is None:
            return bool(router.allow_migrate(connection.alias, app_label, **self.hints))
        model = state.apps.get_model(app_label, self.model_name)
        return bool(self.allow_migrate_model(connection.alias, model))
