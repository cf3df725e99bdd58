"""The backend of Django's tasks framework (Django >= 6.0) on durable runs; imported
through :mod:`durable_django.tasks_backend`, which is importable on any Django."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskResult
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.utils.module_loading import import_string

from . import task_runs
from .engines import Engine, default_engine
from .serialization import json_copy
from .task_quotas import TaskQuota, task_quota, task_quotas

if TYPE_CHECKING:
    _Task = Task[..., Any]
else:
    _Task = Task

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: The keys of the backend's ``OPTIONS``.
OPTION_NAMES = frozenset({"concurrency"})


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableTask(_Task):
    """A task of :class:`DurableTaskBackend`: Django's ``Task``, plus its own
    ``concurrency`` quota (from Django 6.1, ``@task(concurrency={...})``). The backend's
    ``OPTIONS["concurrency"]`` entry for the task, if any, replaces it."""

    concurrency: Mapping[str, Any] | None = None


class DurableTaskBackend(BaseTaskBackend):
    """Runs each enqueued task as a durable run, executed by the Celery workers.

    ``TaskResult.id`` is the run id. ``OPTIONS["concurrency"]`` maps the dotted path of a
    task to its quota (see :mod:`durable_django.task_quotas`); an enqueue over it raises
    :class:`~durable_django.ConcurrencyLimitError` and creates nothing. ``QUEUES`` is
    not supported: every task runs on the engine's queue (``DURABLE["QUEUE"]``).
    """

    task_class = DurableTask

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}]"
        if self.queues != {DEFAULT_TASK_QUEUE_NAME}:
            raise ImproperlyConfigured(
                f"{where}['QUEUES']: DurableTaskBackend runs every task on the queue of its "
                f"workers (DURABLE['QUEUE']) and does not route by queue_name; leave QUEUES "
                f"out (only {DEFAULT_TASK_QUEUE_NAME!r})"
            )
        if not isinstance(self.options, Mapping):
            raise ImproperlyConfigured(f"{where}['OPTIONS'] must be a dict")
        unknown = set(self.options) - OPTION_NAMES
        if unknown:
            raise ImproperlyConfigured(
                f"{where}['OPTIONS']: unknown option(s) {sorted(unknown)}; "
                f"expected {sorted(OPTION_NAMES)}"
            )
        try:
            self.quotas: dict[str, TaskQuota] = task_quotas(
                self.options.get("concurrency", {}), f"{where}['OPTIONS']['concurrency']"
            )
        except (TypeError, ValueError) as error:
            raise ImproperlyConfigured(str(error)) from None
        self.engine: Engine = default_engine
        task_runs.register(self.engine)

    # tasks --------------------------------------------------------------------------

    def validate_task(self, task: Task[..., Any]) -> None:
        """Django's checks, and the task's own ``concurrency`` option."""
        super().validate_task(task)
        self._own_quota(task)

    def _own_quota(self, task: Task[..., Any]) -> TaskQuota | None:
        option = getattr(task, "concurrency", None)
        if option is None:
            return None
        try:
            return task_quota(task.module_path, option)
        except (TypeError, ValueError) as error:
            raise InvalidTask(f"task {task.module_path!r}: concurrency: {error}") from None

    def quota(self, task: Task[..., Any]) -> TaskQuota | None:
        """The quota of ``task``: the ``OPTIONS`` entry for its path, else its own."""
        return self.quotas.get(task.module_path) or self._own_quota(task)

    def enqueue(
        self, task: Task[_P, _R], args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[_P, _R]:
        """Start a run of the task, sent to a worker once the transaction commits.

        The arguments must be JSON. Raises :class:`~durable_django.ConcurrencyLimitError`
        when the task's quota is full: nothing is created, nothing is sent.
        """
        self.validate_task(task)
        path = task.module_path
        if getattr(_importable(path), "func", None) is not task.func:
            raise InvalidTask(
                f"task {path!r} cannot be found at its module path: a worker imports it "
                f"from there; declare it with @task at the module's top level"
            )
        args = json_copy(list(args), f"the arguments of task {path!r}")
        kwargs = json_copy(dict(kwargs), f"the keyword arguments of task {path!r}")
        quota = self.quota(task)
        run_after = task.run_after
        input = {
            "task": path,
            "args": args,
            "kwargs": kwargs,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "run_after": run_after.isoformat() if run_after is not None else None,
        }
        engine = self.engine
        handle = engine.start(
            task_runs.WORKFLOW,
            input,
            concurrency=quota.for_call(args, kwargs) if quota is not None else None,
        )
        result = task_runs.task_result(
            task,
            handle.run_id,
            TaskResultStatus.READY,
            input,
            enqueued_at=engine.get_run(handle.run_id).created_at,
            started=None,
        )
        engine.store.on_commit(lambda: task_runs.send(task_enqueued, input, task_result=result))
        return cast("TaskResult[_P, _R]", result)

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """The task run ``result_id`` as it is now, from any process."""
        return task_runs.read_result(self.engine, result_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Each task of ``OPTIONS["concurrency"]`` and its key function can be imported."""
        messages: list[checks.CheckMessage] = []
        for path, quota in self.quotas.items():
            where = f"TASKS[{self.alias!r}]['OPTIONS']['concurrency'][{path!r}]"
            found = _importable(path)
            if not isinstance(found, Task):
                messages.append(
                    checks.Error(
                        f"{where}: {path!r} is not a task (found {type(found).__name__})",
                        hint="Key each quota by the dotted path of a @task function.",
                        id="durable_django.E005",
                    )
                )
            if quota.key is None:
                try:
                    quota.function()
                except (TypeError, ValueError) as error:
                    messages.append(checks.Error(f"{where}: {error}", id="durable_django.E005"))
        return messages


def _importable(path: str) -> Any:
    try:
        return import_string(path)
    except ImportError:
        return None


__all__ = ["DurableTask", "DurableTaskBackend"]
