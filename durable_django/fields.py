"""Model fields of durable_django's own."""

from __future__ import annotations

from types import GenericAlias
from typing import TYPE_CHECKING, TypeVar, cast

from django.db import models

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.mysql.base import DatabaseWrapper as MySQLDatabaseWrapper

# What a field accepts and what it holds, as django-stubs types ``CharField[_ST, _GT]``.
_ST = TypeVar("_ST", contravariant=True)
_GT = TypeVar("_GT", covariant=True)

if TYPE_CHECKING:
    _CharField = models.CharField[_ST, _GT]
else:
    # Django's own class takes no subscript; a class based on this alias is based on
    # CharField itself.
    _CharField = GenericAlias(models.CharField, (_ST, _GT))


class ExactCharField(_CharField[_ST, _GT]):
    """A ``CharField`` compared byte for byte on every database: neither case, nor accents,
    nor trailing spaces are ignored.

    PostgreSQL (with its deterministic collations) and SQLite (``BINARY``) compare text
    that way already. On MySQL/MariaDB the column gets a binary, no-pad collation
    (:func:`binary_collation`): the server's usual collations ignore case and accents,
    and every ``PAD SPACE`` one, ``utf8mb4_bin`` too, ignores trailing spaces. Foreign
    keys to such a field get the same collation.
    """

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, str | None]:
        parameters = super().db_parameters(connection)
        if parameters.get("collation") is None and connection.vendor == "mysql":
            parameters["collation"] = binary_collation(cast("MySQLDatabaseWrapper", connection))
        return parameters


def binary_collation(connection: MySQLDatabaseWrapper) -> str:
    """The binary, no-pad collation of ``utf8mb4`` on this MySQL or MariaDB server."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
