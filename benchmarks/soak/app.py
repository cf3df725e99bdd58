"""The Celery app of ``benchmarks.soak``: its workers run ``-A benchmarks.soak.app``
with ``--include benchmarks.soak.work`` (the workflow)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.soak.settings")

app = Celery("durable_soak")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)
app.autodiscover_tasks(["durable_django"])
