"""A backend for Django's tasks framework (``django.tasks``, Django 6.0 and later) that
runs each task as a durable run, under a concurrency quota per task if configured::

    TASKS = {
        "default": {
            "BACKEND": "durable_django.tasks_backend.DurableTaskBackend",
            "OPTIONS": {
                "concurrency": {
                    "myapp.tasks.send_report": {
                        "key_function": "myapp.quotas.report_key",
                        "limit": 4,
                    },
                },
            },
        },
    }

This module imports on any supported Django. Before 6.0, which has no tasks framework,
:class:`DurableTaskBackend` refuses to be built with ``ImproperlyConfigured``, and the
system check ``durable_django.W007`` warns when ``TASKS`` names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import django
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

#: The Django version that brings ``django.tasks``.
REQUIRED_DJANGO = (6, 0)
#: Whether this Django has the tasks framework.
TASKS_AVAILABLE = django.VERSION[:2] >= REQUIRED_DJANGO
#: Where ``TASKS`` names the backend.
BACKEND_PATH = "durable_django.tasks_backend.DurableTaskBackend"


def unavailable_message() -> str:
    """Why the backend cannot run on this Django."""
    return (
        f"{BACKEND_PATH} needs Django 6.0 or later (django.tasks); "
        f"this is Django {django.get_version()}"
    )


if TYPE_CHECKING:
    from ._runtime.usage import QuotaUsage
    from .engines import Engine

if TYPE_CHECKING or TASKS_AVAILABLE:
    from .django_tasks import DurableTask as DurableTask
    from .django_tasks import DurableTaskBackend as DurableTaskBackend
    from .django_tasks import task_usage as _task_usage
    from .task_runs import register as _register
else:

    class DurableTaskBackend:
        """Stands in for the backend on a Django without ``django.tasks``."""

        def __init__(self, alias: str = "default", params: Any = None) -> None:
            raise ImproperlyConfigured(unavailable_message())

    class DurableTask:
        """Stands in for the backend's task class on a Django without ``django.tasks``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImproperlyConfigured(unavailable_message())


def configured_aliases() -> list[str]:
    """The aliases of ``settings.TASKS`` whose backend is :class:`DurableTaskBackend` (by
    its path, or, from Django 6.0, a subclass of it)."""
    aliases = []
    for alias, params in getattr(settings, "TASKS", {}).items():
        path = params.get("BACKEND") if isinstance(params, Mapping) else None
        if path == BACKEND_PATH:
            aliases.append(alias)
        elif TASKS_AVAILABLE and isinstance(path, str):
            try:
                backend = import_string(path)
            except ImportError:
                continue  # Django's own check reports it
            if isinstance(backend, type) and issubclass(backend, DurableTaskBackend):
                aliases.append(alias)
    return aliases


def shown_usage(engine: Engine, usage: QuotaUsage) -> QuotaUsage:
    """A key's quota usage as the admin's quota page and ``durable quota`` show it: a key
    that task runs hold names their tasks, with their quota's limit (from Django 6.0)."""
    return _task_usage(engine, usage) if TASKS_AVAILABLE else usage


def register_configured() -> bool:
    """Register the workflow tasks run as, when ``TASKS`` uses the backend on a Django
    that has the tasks framework: at startup, so that a worker executes task runs before
    any task is enqueued in its process. True if it did."""
    if not (TASKS_AVAILABLE and configured_aliases()):
        return False
    _register()
    return True


__all__ = [
    "BACKEND_PATH",
    "REQUIRED_DJANGO",
    "TASKS_AVAILABLE",
    "DurableTask",
    "DurableTaskBackend",
    "configured_aliases",
    "register_configured",
    "shown_usage",
    "unavailable_message",
]
