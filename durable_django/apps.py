"""The app's configuration: workflow discovery and system checks at startup."""

from __future__ import annotations

import sys

from django.apps import AppConfig


class DurableConfig(AppConfig):
    """Discovers each installed app's ``workflows`` module and registers the checks."""

    name = "durable_django"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401  (registers the system checks)
        from .engines import default_engine

        def reload_engine(setting: str, **kwargs: object) -> None:
            if setting == "DURABLE":
                default_engine.reload()
            elif setting.startswith("CELERY") and "durable_django.publishing" in sys.modules:
                sys.modules["durable_django.publishing"].forget_publisher()

        setting_changed.connect(reload_engine, weak=False, dispatch_uid="durable_reload")
        autodiscover_modules("workflows")
        from .tasks_backend import register_configured

        register_configured()
