"""The app's configuration: workflow discovery, system checks and Celery tasks at startup."""

from __future__ import annotations

import sys

from django.apps import AppConfig

#: The module that keeps a publisher per Celery app.
PUBLISHING = "durable_django._runtime.publishing"


class DurableConfig(AppConfig):
    """Discovers each installed app's ``workflows`` module, registers the checks and the
    Celery tasks (so that ``task_always_eager`` finds them in any process)."""

    name = "durable_django"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed
        from django.utils.module_loading import autodiscover_modules

        # registers the system checks, and the Celery tasks execute_run and tick
        from . import checks, tasks  # noqa: F401
        from .engines import default_engine

        def reload_engine(setting: str, **kwargs: object) -> None:
            if setting == "DURABLE":
                default_engine.reload()
            elif setting.startswith("CELERY") and PUBLISHING in sys.modules:
                sys.modules[PUBLISHING].forget_publisher()

        setting_changed.connect(reload_engine, weak=False, dispatch_uid="durable_reload")
        autodiscover_modules("workflows")
        from .tasks_backend import register_configured

        register_configured()
