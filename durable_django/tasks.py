"""The Celery tasks that execute runs and tick. Messages carry only the run id, as JSON."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from celery import shared_task
from celery.signals import task_postrun, task_revoked
from django.db import InterfaceError, OperationalError

from ._runtime import sending
from .conf import durable_settings
from .db import close_connections
from .engines import default_engine
from .ticker import Ticker

#: How many times a message is tried again while the database cannot be reached, after
#: 1, 2, 4 ... 32 seconds (about a minute in all); the tick's resend covers longer outages.
EXECUTE_RETRIES = 6

_ticker = Ticker()

logger = logging.getLogger(__name__)


@shared_task(
    name="durable_django.execute_run",
    ignore_result=True,
    serializer="json",
    max_retries=EXECUTE_RETRIES,
)
def execute_run(run_id: str) -> None:
    """Execute one turn of ``run_id`` with the default engine.

    When the turn fails, the worker's connections are closed, so that the next message
    opens fresh ones. When it failed because the database could not be reached (an
    ``OperationalError`` or ``InterfaceError``), the message is sent again after 1, 2,
    4 ... 32 seconds; a run that was not waiting for a worker by then is left alone.
    """
    try:
        default_engine.execute(run_id)
    except (OperationalError, InterfaceError) as error:
        close_connections()
        task: Any = execute_run  # the task, as the decorator made it
        raise task.retry(exc=error, countdown=2**task.request.retries) from error
    except Exception:
        close_connections()
        raise


@task_postrun.connect(weak=False)
def send_before_the_next_task(**_: Any) -> None:
    """After each task a worker runs, wait (at most ``sending.EXIT_FLUSH_SECONDS``) for the
    run messages it handed to the sender: a pool process may be ended at any task's end,
    and its messages must not wait for the tick."""
    sending.flush(sending.EXIT_FLUSH_SECONDS)


@task_revoked.connect(weak=False)
def cancel_revoked_run(
    sender: Any = None, request: Any = None, expired: bool = False, **_: Any
) -> None:
    """A run's message revoked in Celery (``revoke``, ``revoke(terminate=True)``, Flower's
    Revoke and Terminate) cancels the run: its slot frees and it is not sent again.
    Runs in the worker's main process, where Celery announces the revoke."""
    if expired or getattr(sender, "name", None) != execute_run.name:
        return
    args = getattr(request, "args", None) or ()
    if not args:
        return
    try:
        default_engine.cancel(str(args[0]))
    except Exception:
        logger.exception("run %r: its message was revoked and it could not be cancelled", args[0])
    finally:
        close_connections()  # a prefork worker's main process forks new children


@shared_task(name="durable_django.tick", ignore_result=True, serializer="json")
def tick() -> dict[str, int] | None:
    """Run ``engine.tick()`` on the default engine; schedule it with Celery beat.

    A tick that fails is logged on one line at ERROR and closes the worker's
    connections; it is not retried, since the next tick does its work (see
    :class:`durable_django.ticker.Ticker`).
    """
    result = _ticker.tick()
    return None if result is None else dataclasses.asdict(result)


def beat_schedule(seconds: float = 5.0) -> dict[str, dict[str, object]]:
    """A Celery beat entry running the tick every ``seconds``, on ``DURABLE["QUEUE"]``
    when one is set: ``app.conf.beat_schedule = {**beat_schedule(), ...}``."""
    entry: dict[str, object] = {"task": "durable_django.tick", "schedule": seconds}
    queue = durable_settings()["QUEUE"]
    if queue:
        entry["options"] = {"queue": queue}
    return {"durable-django-tick": entry}
