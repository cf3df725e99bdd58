"""The Celery task that executes runs. Messages carry only the run id, as JSON."""

from __future__ import annotations

import dataclasses

from celery import shared_task


@shared_task(name="durable_django.execute_run", ignore_result=True, serializer="json")
def execute_run(run_id: str) -> None:
    """Execute one turn of ``run_id`` with the default engine."""
    from .engines import default_engine

    default_engine.execute(run_id)


@shared_task(name="durable_django.tick", ignore_result=True, serializer="json")
def tick() -> dict[str, int]:
    """Run ``engine.tick()`` on the default engine; schedule it with Celery beat."""
    from .engines import default_engine

    return dataclasses.asdict(default_engine.tick())


def beat_schedule(seconds: float = 5.0) -> dict[str, dict[str, object]]:
    """A Celery beat entry running the tick every ``seconds``, on ``DURABLE["QUEUE"]``
    when one is set: ``app.conf.beat_schedule = {**beat_schedule(), ...}``."""
    from .conf import durable_settings

    entry: dict[str, object] = {"task": "durable_django.tick", "schedule": seconds}
    queue = durable_settings()["QUEUE"]
    if queue:
        entry["options"] = {"queue": queue}
    return {"durable-django-tick": entry}
