"""System checks: the store's own (for ``OrmStore``, a database configured so the quota
can serialise starts), a Celery app and a loadable broker to send runs to, and declared
quotas that make sense."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ._rules.registry import default_registry
from ._rules.task_quotas import backend_settings
from .conf import durable_settings
from .engines import default_engine
from .models import Schedule
from .tasks_backend import TASKS_AVAILABLE, configured_aliases, unavailable_message

if TYPE_CHECKING:
    from celery import Celery
    from django.apps import AppConfig

    from ._rules.registry import WorkflowDefinition


@checks.register(checks.Tags.compatibility, checks.Tags.database)
def check_store(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """The default engine's store's own checks (``BaseStore.check``), as Django's task
    checks ask each backend. ``OrmStore``'s are about its database: its settings always
    (``W001``, ``E002``), its columns with ``--database`` and during ``migrate``
    (``E004``). Nothing when the settings do not load: ``check_settings`` reports it."""
    try:
        store = default_engine.config.store
    except (ImproperlyConfigured, TypeError, ValueError):
        return []
    return list(store.check(databases=databases))


@checks.register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Refuse a ``DURABLE`` setting with unknown keys or an unloadable store."""
    try:
        durable_settings()
        default_engine.reload()
        default_engine.config  # noqa: B018  (builds the store)
    except (ImproperlyConfigured, TypeError, ValueError) as error:
        return [checks.Error(str(error), id="durable_django.E001")]
    return []


#: Where Celery sends messages when no broker is configured.
CELERY_DEFAULT_BROKER = "amqp://guest@localhost//"


@checks.register()
def check_celery(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Warn when starts would send runs to Celery without a project app or a broker.

    It looks at the Celery app current in this process (``celery.current_app``), the one
    ``shared_task`` sends through, and only when the default engine sends messages
    (``DURABLE["ENQUEUE"]``, on a store workers share). It cannot tell whether the broker
    answers or whether a worker consumes the queue: checks do not touch the network.
    """
    app = _sending_celery_app()
    return [] if app is None else celery_warnings(app)


def _sending_celery_app() -> Celery | None:
    """The Celery app runs are sent through, or ``None`` when the default engine sends
    nothing (``ENQUEUE`` off, a store workers do not share, or settings that do not load:
    ``check_settings`` reports those)."""
    try:
        if not durable_settings()["ENQUEUE"]:
            return None
        if not default_engine.config.store.is_shared:
            return None
    except (ImproperlyConfigured, TypeError, ValueError):
        return None
    from celery.app import app_or_default

    return app_or_default()


def _is_fallback_app(app: Celery) -> bool:
    """Whether ``app`` is Celery's own fallback, made when no app was created in this
    process: named ``default``, without the fix-ups (Django's among them) of an app."""
    # celery-types does not declare ``fixups``, which Celery.__init__ sets on every app.
    return app.main == "default" and not app.fixups  # type: ignore[attr-defined]


def celery_warnings(app: Celery) -> list[checks.CheckMessage]:
    """The messages :func:`check_celery` gives for a Celery app, with the settings."""
    # Celery's own fallback reads nothing from the Django settings and sends to a local
    # RabbitMQ.
    if _is_fallback_app(app):
        return [
            checks.Warning(
                "no Celery app is loaded in this process: runs would be sent to Celery's "
                f"fallback app and its broker {CELERY_DEFAULT_BROKER}",
                hint=(
                    "Load the project's Celery app when Django starts: import it in the "
                    "project package's __init__.py (from .celery import app as celery_app), "
                    'configured with app.config_from_object("django.conf:settings", '
                    'namespace="CELERY"). Or set DURABLE["ENQUEUE"] = False when nothing '
                    "should be sent."
                ),
                id="durable_django.W002",
            )
        ]
    try:
        broker = app.conf.broker_url
    except Exception as error:  # a configuration that does not load
        return [
            checks.Warning(
                f"cannot read the broker of Celery app {app.main!r}: {error}",
                id="durable_django.W009",
            )
        ]
    if broker and broker != CELERY_DEFAULT_BROKER:
        return []
    configured = getattr(settings, "CELERY_BROKER_URL", None)
    if configured and configured == broker:
        return []  # the default broker, named on purpose
    if configured:
        return [
            checks.Warning(
                f"Celery app {app.main!r} does not use settings.CELERY_BROKER_URL: runs "
                f"would be sent to {broker or CELERY_DEFAULT_BROKER}",
                hint=(
                    "Configure the app from the settings: app.config_from_object("
                    '"django.conf:settings", namespace="CELERY").'
                ),
                id="durable_django.W008",
            )
        ]
    return [
        checks.Warning(
            f"no Celery broker is configured: runs would be sent to {CELERY_DEFAULT_BROKER}",
            hint=(
                'Set CELERY_BROKER_URL (e.g. "redis://localhost:6379/0") and configure the '
                "project's Celery app from the settings; or set "
                'DURABLE["ENQUEUE"] = False when nothing should be sent.'
            ),
            id="durable_django.W003",
        )
    ]


@checks.register()
def check_broker(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Refuse a broker whose kombu transport cannot be loaded in this process: its workers
    and beat would crash at start while the web process kept accepting runs."""
    app = _sending_celery_app()
    return [] if app is None else broker_errors(app)


def broker_errors(app: Celery) -> list[checks.CheckMessage]:
    """The messages :func:`check_broker` gives for a Celery app.

    It loads the transport of the app's broker URL as a worker does: kombu imports the
    transport's module, and its client library there or when the transport is made. It
    connects to nothing.
    """
    if _is_fallback_app(app):
        return []  # check_celery reports it
    try:
        url = app.conf.broker_write_url or app.conf.broker_url or CELERY_DEFAULT_BROKER
        transport = app.conf.broker_transport or _transport_name(url)
    except Exception:  # a configuration that does not load: check_celery reports it
        return []
    try:
        from kombu import Connection
        from kombu.transport import resolve_transport

        resolve_transport(transport)  # imports the transport's module
        connection = Connection(url, transport=app.conf.broker_transport)
        try:
            connection.transport  # noqa: B018  (some transports import their library here)
        finally:
            connection.release()
    except Exception as error:
        from kombu.utils.url import maybe_sanitize_url

        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        return [
            checks.Error(
                f"the Celery broker {maybe_sanitize_url(url)} cannot be used: kombu's "
                f"{transport!r} transport does not load ({type(error).__name__}: {error})",
                hint=(
                    "Use a transport kombu knows (redis://, amqp://, ...)."
                    if isinstance(error, KeyError)
                    else (f"Install the missing module {missing!r}. " if missing else "")
                    + "For Redis, install durable-django's redis extra (celery[redis]); "
                    "for another broker, Celery's extra named after it (celery[sqs], "
                    "celery[mongodb], ...). Without it workers and beat crash at start "
                    "while starts keep creating runs."
                ),
                id="durable_django.E003",
            )
        ]
    return []


def _transport_name(url: str) -> str:
    """The kombu transport a broker URL names: its scheme, or what precedes ``+`` in it
    (``sqla+postgresql://``); the first URL of a failover list ``url1;url2``."""
    scheme = url.split(";", 1)[0].strip().split("://", 1)[0]
    return scheme.split("+", 1)[0] if "+" in scheme else scheme


@checks.register()
def check_workflows(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Warn about declared quotas that cannot be what was meant: a limit that refuses
    every start. (Finished statuses in ``count_statuses`` are refused when declared.)"""
    return quota_warnings(default_registry.all())


def quota_warnings(definitions: Iterable[WorkflowDefinition]) -> list[checks.CheckMessage]:
    """The messages :func:`check_workflows` gives for workflow definitions.

    A limit given as a function is not called here (it takes a key, known only at start).
    """
    messages: list[checks.CheckMessage] = []
    for definition in definitions:
        where = f"workflow {definition.name!r} version {definition.version!r}"
        for concurrency in definition.concurrency:
            limit = concurrency.limit
            if isinstance(limit, int) and not isinstance(limit, bool) and limit <= 0:
                messages.append(
                    checks.Warning(
                        f"{where} declares concurrency limit {limit}: every start is refused",
                        hint=(
                            "Give a positive limit, or no concurrency= at all for starts "
                            "without a quota."
                        ),
                        obj=definition.name,
                        id="durable_django.W004",
                    )
                )
    return messages


@checks.register(checks.Tags.database)
def check_schedules(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """Warn about schedules whose workflow is not registered (``check --database``, and
    ``migrate``): each of their windows would be skipped with an error."""
    if not databases:
        return []
    from django.db import DatabaseError

    try:
        rows = list(Schedule.objects.enabled().values_list("key", "workflow"))
    except DatabaseError:
        return []  # not migrated yet
    messages: list[checks.CheckMessage] = []
    for key, workflow in rows:
        try:
            default_engine.registry.latest(workflow)
        except LookupError:
            messages.append(
                checks.Warning(
                    f"schedule {key!r} starts workflow {workflow!r}, which is not registered",
                    hint="Register the workflow, or disable or delete the schedule.",
                    id="durable_django.W006",
                )
            )
    return messages


@checks.register()
def check_tasks_backend(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Check each ``TASKS`` entry naming the durable task backend: its ``QUEUES`` and
    ``OPTIONS`` (``E006``: every enqueue would be refused; ``W004``: a task's quota limit
    refuses every enqueue of it), and, on a Django without ``django.tasks`` (before 6.0),
    warn that nothing would ever use it (``W007``)."""
    messages: list[checks.CheckMessage] = []
    for alias in configured_aliases():
        if not TASKS_AVAILABLE:
            messages.append(
                checks.Warning(
                    f"TASKS[{alias!r}]: {unavailable_message()}",
                    hint="Upgrade to Django 6.0 or later, or take DurableTaskBackend out of TASKS.",
                    id="durable_django.W007",
                )
            )
        try:
            checked = backend_settings(alias, settings.TASKS[alias])
        except ImproperlyConfigured as error:
            messages.append(
                checks.Error(
                    str(error),
                    hint="Every task enqueued on this backend is refused until it is fixed; "
                    "see the backend's QUEUES and OPTIONS in the django.tasks docs.",
                    id="durable_django.E006",
                )
            )
            continue
        messages += [
            checks.Warning(
                f"TASKS[{alias!r}]['OPTIONS']['concurrency'][{path!r}] has limit "
                f"{quota.limit}: every enqueue of the task is refused",
                hint="Give a positive limit, or no quota for the task.",
                id="durable_django.W004",
            )
            for path, quota in checked.quotas.items()
            if quota.limit <= 0
        ]
    return messages
