"""The ``DURABLE`` settings dict, with its defaults."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .stores.base import BaseStore

DEFAULTS: dict[str, Any] = {
    # Dotted path to a store class, or a store instance.
    "STORE": "durable_django.stores.OrmStore",
    # Stamped on every run the default engine creates.
    "NAMESPACE": "default",
    # True: the default engine's reads (and so the quota count) see only NAMESPACE.
    "SCOPE_READS": False,
    # Celery queue for executing runs; "" uses Celery's default queue.
    "QUEUE": "",
    # False: starts create runs but send nothing to Celery (drive them with run_until_idle).
    "ENQUEUE": True,
    # "background": a start's message leaves from a thread of the process, in batches, once
    # the start commits; "inline": the committing caller sends it (a broker round trip).
    "PUBLISH": "background",
    # A worker holds a running run under a lease this long, renewed every third of it;
    # a run whose worker died is handed to another once its lease lapses.
    "LEASE_SECONDS": 60,
    # A blocked run (its workflow version not registered where it landed) is handed on
    # again after this long.
    "BLOCKED_RETRY_SECONDS": 30,
    # A run still pending this long after its last message is sent again by the tick
    # (a lost message must not lose a run).
    "PENDING_RESEND_SECONDS": 300,
    # The metrics libraries recorded to, each when installed: "opentelemetry" (its API,
    # the otel extra) and "prometheus" (prometheus_client); [] records no metric.
    "METRICS": ["opentelemetry", "prometheus"],
}


def durable_settings() -> dict[str, Any]:
    """``settings.DURABLE`` merged over the defaults; unknown keys are refused."""
    configured = getattr(settings, "DURABLE", {}) or {}
    if not isinstance(configured, dict):
        raise ImproperlyConfigured("settings.DURABLE must be a dict")
    unknown = set(configured) - set(DEFAULTS)
    if unknown:
        raise ImproperlyConfigured(
            f"unknown key(s) in settings.DURABLE: {sorted(unknown)}; known: {sorted(DEFAULTS)}"
        )
    return {**DEFAULTS, **configured}


def build_store(value: Any) -> BaseStore:
    """A store from a dotted path, a class or an instance; refuse anything that is not a
    :class:`~durable_django.stores.BaseStore`."""
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as error:
            raise ImproperlyConfigured(
                f"DURABLE['STORE']: cannot import {value!r}: {error}"
            ) from error
    if isinstance(value, type):
        value = value()
    if not isinstance(value, BaseStore):
        raise TypeError(
            f"the store must be an instance of durable_django.stores.BaseStore (or a class "
            f"or dotted path making one), not {value!r}"
        )
    return value
