"""The Celery task that executes runs. Messages carry only the run id, as JSON."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="durable_django.execute_run", ignore_result=True, serializer="json")
def execute_run(run_id: str) -> None:
    """Execute one turn of ``run_id`` with the default engine."""
    from .engines import default_engine

    default_engine.execute(run_id)
