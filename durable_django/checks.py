"""System checks: databases configured so the quota can serialise starts."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import durable_settings

_SAFE_ISOLATION = {None, "", "read committed", "read uncommitted"}


@checks.register(checks.Tags.database, checks.Tags.compatibility)
def check_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Flag database settings under which the quota could admit too many runs."""
    return database_warnings(settings.DATABASES)


def database_warnings(databases: dict[str, dict[str, Any]]) -> list[checks.CheckMessage]:
    """The messages :func:`check_databases` gives for a ``DATABASES`` dict."""
    messages: list[checks.CheckMessage] = []
    for alias, config in databases.items():
        engine = config.get("ENGINE", "")
        options = config.get("OPTIONS", {}) or {}
        if engine.endswith("sqlite3") and str(options.get("transaction_mode", "")).upper() not in (
            "IMMEDIATE",
            "EXCLUSIVE",
        ):
            messages.append(
                checks.Warning(
                    f"database {alias!r} is SQLite without a write-locking transaction mode",
                    hint=(
                        f'Set DATABASES["{alias}"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" '
                        "so concurrent starts wait for each other instead of failing with "
                        '"database is locked".'
                    ),
                    id="durable_django.W001",
                )
            )
        isolation = options.get("isolation_level")
        if engine.endswith(("mysql", "postgresql")) and _isolation_name(isolation) not in (
            _SAFE_ISOLATION
        ):
            # An error, not a warning: at these levels the quota silently admits too many.
            messages.append(
                checks.Error(
                    f"database {alias!r} runs transactions at isolation level {isolation!r}",
                    hint=(
                        "The quota count must see every run committed before its lock was "
                        "taken; keep Django's default READ COMMITTED isolation."
                    ),
                    id="durable_django.E002",
                )
            )
    return messages


def _isolation_name(isolation: Any) -> str | None:
    if isinstance(isolation, str) or isolation is None:
        return isolation.lower() if isolation else isolation
    try:  # psycopg's IsolationLevel enum
        from psycopg import IsolationLevel
    except ImportError:  # pragma: no cover
        return str(isolation)
    try:
        return IsolationLevel(isolation).name.replace("_", " ").lower()
    except ValueError:
        return str(isolation)


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse a ``DURABLE`` setting with unknown keys or an unloadable store."""
    try:
        from .engines import default_engine

        durable_settings()
        default_engine.reload()
        default_engine.config  # noqa: B018  (builds the store)
    except (ImproperlyConfigured, TypeError, ValueError) as error:
        return [checks.Error(str(error), id="durable_django.E001")]
    return []
