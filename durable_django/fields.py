"""Model fields of durable_django's own."""

from __future__ import annotations

from typing import Any

from django.db import models


class ExactCharField(models.CharField):
    """A ``CharField`` compared byte for byte on every database: neither case, nor accents,
    nor trailing spaces are ignored.

    PostgreSQL (with its deterministic collations) and SQLite (``BINARY``) compare text
    that way already. On MySQL/MariaDB the column gets a binary, no-pad collation
    (:func:`binary_collation`): the server's usual collations ignore case and accents,
    and every ``PAD SPACE`` one, ``utf8mb4_bin`` too, ignores trailing spaces. Foreign
    keys to such a field get the same collation.
    """

    def db_parameters(self, connection: Any) -> dict[str, Any]:
        parameters = super().db_parameters(connection)
        if parameters.get("collation") is None and connection.vendor == "mysql":
            parameters["collation"] = binary_collation(connection)
        return parameters


def binary_collation(connection: Any) -> str:
    """The binary, no-pad collation of ``utf8mb4`` on this MySQL or MariaDB server."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
