"""Operators' overrides of quota limits as rows of ``durable_quota_override``
(``QuotaOverride``): one row per key's tag and scope, written through the ORM, and read by
a start inside its transaction, under its keys' locks, by one statement
(:func:`limits_statement`) that the portable path sends alone and PostgreSQL's fair path
sends with its other reads."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import PositiveIntegerField, Q
from django.utils import timezone

from .._rules.overrides import Override
from ..models import QuotaOverride, model_field


def store(using: str, override: Override) -> None:
    """Write ``override`` in place of the row of its tag and scope (in the caller's
    transaction when one is open: it applies once that commits)."""
    with transaction.atomic(using=using):
        QuotaOverride.objects.using(using).update_or_create(
            tag=override.tag,
            scope=override.scope,
            defaults={
                "limit": override.limit,
                "until": override.until,
                "changed_at": override.changed_at or timezone.now(),
            },
        )


def clear(using: str, tag: str, scope: str) -> bool:
    """Delete the row of ``tag`` in ``scope``; whether there was one."""
    deleted, _ = QuotaOverride.objects.using(using).filter(tag=tag, scope=scope).delete()
    return deleted > 0


def live(using: str, scope: str | None, now: datetime) -> list[Override]:
    """The overrides in force at ``now`` in ``scope`` (every scope when ``None``), by tag."""
    rows = QuotaOverride.objects.using(using).filter(Q(until__isnull=True) | Q(until__gt=now))
    if scope is not None:
        rows = rows.filter(scope=scope)
    return [
        Override.from_tag(tag, limit, until, row_scope, changed_at)
        for tag, limit, until, row_scope, changed_at in rows.order_by("tag", "scope").values_list(
            "tag", "limit", "until", "scope", "changed_at"
        )
    ]


def limits_statement(
    connection: BaseDatabaseWrapper, tags: Collection[str], scope: str, now: datetime
) -> tuple[str, list[Any]]:
    """The statement reading the limits of the overrides of ``tags`` in ``scope`` in force
    at ``now``, and its parameters; its rows, ``(tag, limit)``, read by
    :func:`limits_from`."""
    quote = connection.ops.quote_name
    table = quote(QuotaOverride._meta.db_table)
    column = quote(model_field(QuotaOverride, "limit", PositiveIntegerField).column or "")
    tag, until = quote("tag"), quote("until")
    return (
        f"SELECT {tag}, {column} FROM {table} WHERE {quote('scope')} = %s "
        f"AND {tag} IN ({', '.join(['%s'] * len(tags))}) "
        f"AND ({until} IS NULL OR {until} > %s)",
        [scope, *tags, connection.ops.adapt_datetimefield_value(now)],
    )


def limits_from(rows: Iterable[tuple[str, int]]) -> dict[str, int]:
    """``{tag: limit}`` from :func:`limits_statement`'s rows."""
    return {tag: int(limit) for tag, limit in rows}


def limits(using: str, tags: Collection[str], scope: str, now: datetime) -> dict[str, int]:
    """:func:`limits_statement` sent on ``using``'s cursor."""
    if not tags:
        return {}
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(*limits_statement(connection, tags, scope, now))
        return limits_from(cursor.fetchall())
