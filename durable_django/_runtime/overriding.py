"""The engine's operator overrides: set, cleared and listed in the store, for the
engine's scope (``overrides.scope_of`` its read namespace), each change logged."""

from __future__ import annotations

import datetime
import logging

from django.utils import timezone

from .._core.runtime import Runtime
from .._rules.overrides import Kind, Override, checked, override_tag, scope_of

logger = logging.getLogger("durable_django")


def set_override(
    engine: Runtime, key: str, kind: Kind, limit: int, until: datetime.datetime | None
) -> Override:
    """Store the override of ``kind`` for ``key`` in the engine's scope, refused with an
    error naming what is wrong (nothing stored) when it could not be one."""
    now = timezone.now()
    checked(key, kind, limit, until, now)
    override = Override(key, kind, limit, until, scope_of(engine.read_namespace), now)
    engine.store.set_override(override)
    logger.info(
        "quota override set: %s key %r limited to %d%s",
        kind,
        key,
        limit,
        "" if until is None else f" until {until.isoformat()}",
        extra={"durable_key": key, "durable_kind": kind, "durable_limit": limit},
    )
    return override


def clear_override(engine: Runtime, key: str, kind: Kind) -> bool:
    """Delete the override of ``kind`` for ``key`` in the engine's scope; whether there
    was one."""
    cleared = engine.store.clear_override(override_tag(key, kind), scope_of(engine.read_namespace))
    if cleared:
        logger.info(
            "quota override cleared: %s key %r",
            kind,
            key,
            extra={"durable_key": key, "durable_kind": kind},
        )
    return cleared


def overrides(engine: Runtime, key: str | None = None, kind: Kind | None = None) -> list[Override]:
    """The overrides in force now in the engine's scope (of ``key``, of ``kind``, when
    given), by kind and key."""
    found = engine.store.list_overrides(scope_of(engine.read_namespace), timezone.now())
    return [o for o in found if (key is None or o.key == key) and (kind is None or o.kind == kind)]
