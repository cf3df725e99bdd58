"""The array arguments of a start's call, written as PostgreSQL array literals.

psycopg adapts a Python list by looking at its elements to choose the array's type, which
costs a start more client time than all its other arguments together. The call of
``durable_start_run_v2`` casts each array argument to its type (``%s::text[]``), so the
start passes each as the text PostgreSQL's array input reads: every text element in
double quotes, ``\\`` and ``"`` in it escaped with a backslash, ``NULL`` unquoted (as
psycopg writes it), integers in decimal, each row of a two-dimensional array in braces
of its own.
"""

from __future__ import annotations

from collections.abc import Iterable


def text_array(values: Iterable[str | None]) -> str:
    """A ``text[]`` literal of ``values`` (``None`` is ``NULL``)."""
    return "{" + ",".join(_text_element(value) for value in values) + "}"


def integer_array(values: Iterable[int]) -> str:
    """An ``integer[]`` literal of ``values``."""
    return "{" + ",".join(f"{value:d}" for value in values) + "}"


def float_array(values: Iterable[float | None]) -> str:
    """A ``double precision[]`` literal of ``values`` (``None`` is ``NULL``), each written
    as ``repr`` writes it, which reads back to the same float."""
    return "{" + ",".join("NULL" if value is None else repr(float(value)) for value in values) + "}"


def text_rows(rows: Iterable[Iterable[str | None]]) -> str:
    """A two-dimensional ``text[]`` literal, one row per item of ``rows`` (the rows of
    one length: PostgreSQL refuses ragged ones)."""
    return "{" + ",".join(text_array(row) for row in rows) + "}"


def _text_element(value: str | None) -> str:
    if value is None:
        return "NULL"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
