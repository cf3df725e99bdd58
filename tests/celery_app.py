"""The Celery app of the test suite, configured from the Django settings (JSON only),
with the settings docs/workers.md recommends for its broker."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def broker_settings(url: str) -> dict[str, Any]:
    """The Celery settings for the broker at ``url``: those docs/workers.md recommends,
    and on RabbitMQ no heartbeats, which would delay every warm shutdown of a test worker
    by seconds (a killed worker's connection closes with it)."""
    if url.startswith(("amqp://", "pyamqp://")):
        return {
            "task_acks_late": True,
            "worker_prefetch_multiplier": 1,
            "broker_transport_options": {"confirm_publish": True},
            "broker_heartbeat": 0,
        }
    return {
        "task_acks_late": False,
        "worker_prefetch_multiplier": 1,
        "worker_disable_prefetch": True,
    }


app = Celery("tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    event_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    broker_connection_retry_on_startup=True,
    **broker_settings(settings.CELERY_BROKER_URL),
)
app.autodiscover_tasks()
