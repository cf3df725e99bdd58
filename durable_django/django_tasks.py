"""The backend of Django's tasks framework (Django >= 6.0) on durable runs; imported
through :mod:`durable_django.tasks_backend`, which is importable on any Django."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskResult
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend
from django.tasks.signals import task_enqueued
from django.utils.module_loading import import_string

from . import task_runs
from ._core.serialization import json_copy
from ._rules.task_meta import TASK_WORKFLOW, task_path
from ._rules.task_quotas import TaskQuota, backend_settings, celery_queue, task_quota
from ._runtime.usage import RECENT_RUNS, QuotaUsage
from .engines import Engine, default_engine
from .errors import ConcurrencyLimitError

if TYPE_CHECKING:
    _Task = Task[..., Any]
else:
    _Task = Task

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableTask(_Task):
    """A task of :class:`DurableTaskBackend`: Django's ``Task``, plus its own
    ``concurrency`` quota (from Django 6.1, ``@task(concurrency={...})``). The backend's
    ``OPTIONS["concurrency"]`` entry for the task, if any, replaces it."""

    concurrency: Mapping[str, Any] | None = None


class DurableTaskBackend(BaseTaskBackend):
    """Runs each enqueued task as a durable run, executed by the Celery workers.

    ``TaskResult.id`` is the run id. ``OPTIONS["concurrency"]`` maps the dotted path of a
    task to its quota (see :mod:`durable_django._rules.task_quotas`); an enqueue over it raises
    :class:`~durable_django.ConcurrencyLimitError` and creates nothing. A task's
    ``queue_name`` (one of ``QUEUES``) is the Celery queue its run is sent to, Django's
    ``"default"`` being the workers' queue (``DURABLE["QUEUE"]``); its ``priority`` is
    kept on the run, for its message. Settings that are wrong are reported by the system
    check (``durable_django.E006``) and refuse every task with ``ImproperlyConfigured``.
    """

    task_class = DurableTask

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Built as Django's own check asks for it: settings that are wrong are kept, to be
        # reported by the check and raised by every task, not raised here.
        self.settings_error: ImproperlyConfigured | None = None
        try:
            checked = backend_settings(alias, params)
        except ImproperlyConfigured as error:
            self.settings_error = error
            params = {}
            self.quotas: dict[str, TaskQuota] = {}
            self.rate_limits: dict[str, TaskQuota] = {}
        else:
            self.quotas = checked.quotas
            self.rate_limits = checked.rate_limits
        super().__init__(alias, params)
        self.engine: Engine = default_engine
        self._queue_engines: dict[str, tuple[Any, Engine]] = {}
        task_runs.register(self.engine)

    # tasks --------------------------------------------------------------------------

    def validate_task(self, task: Task[..., Any]) -> None:
        """The backend's settings, Django's checks, and the task's own ``concurrency``."""
        if self.settings_error is not None:
            raise ImproperlyConfigured(str(self.settings_error))
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
        when the task's quota is full (:class:`~durable_django.RateLimitError` when its
        ``OPTIONS["rate_limit"]`` entry is): nothing is created, nothing is sent.
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
        rate = self.rate_limits.get(path)
        run_after = task.run_after
        input = {
            "task": path,
            "args": args,
            "kwargs": kwargs,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "run_after": run_after.isoformat() if run_after is not None else None,
        }
        engine = self.queue_engine(task.queue_name)
        try:
            handle = engine.start(
                task_runs.WORKFLOW,
                input,
                concurrency=quota.for_call(args, kwargs) if quota is not None else None,
                rate_limit=rate.for_call(args, kwargs) if rate is not None else None,
            )
        except ConcurrencyLimitError as error:
            raise _refused(error, path) from None
        result = task_runs.task_result(
            task,
            handle.run_id,
            TaskResultStatus.READY,
            input,
            enqueued_at=engine.get_run(handle.run_id).created_at,
            started=[],
        )
        engine.store.on_commit(lambda: task_runs.send(task_enqueued, input, task_result=result))
        return cast("TaskResult[_P, _R]", result)

    def queue_engine(self, queue_name: str) -> Engine:
        """The engine that starts the tasks of Django queue ``queue_name``: the default
        engine, with the queue's Celery queue
        (:func:`~durable_django._rules.task_quotas.celery_queue`) as the queue of the runs it
        creates and sends."""
        queue = celery_queue(queue_name)
        default = self.engine
        config = default.config
        if not queue or queue == config.queue:
            return default
        made = self._queue_engines.get(queue)
        if made is None or made[0] is not config:  # new, or the settings changed since
            engine = Engine(
                config.store,
                namespace=config.namespace,
                scope_reads=config.scope_reads,
                queue=queue,
                enqueue=config.enqueue,
                publish=config.publish,
                registry=default.registry,
            )
            made = self._queue_engines[queue] = (config, engine)
        return made[1]

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """The task run ``result_id`` as it is now, from any process."""
        return task_runs.read_result(self.engine, result_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Each task of ``OPTIONS["concurrency"]`` and its key function can be imported.
        (Settings that are wrong are ``durable_django.E006``, of the app's own check.)"""
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


# quota usage --------------------------------------------------------------------------


def task_usage(engine: Engine, usage: QuotaUsage) -> QuotaUsage:
    """``usage`` of a key that task runs hold, as tasks show it: the dotted paths of the
    tasks of its latest runs in place of the workflow tasks run as, and, when no workflow
    declares the key's limit, the limit of the quota its latest task run was enqueued
    under."""
    if TASK_WORKFLOW not in usage.workflows:
        return usage
    runs = engine.store.list_runs(
        tag=usage.tag, workflow=TASK_WORKFLOW, namespace=engine.read_namespace, limit=RECENT_RUNS
    )
    paths = {path for run in runs if (path := task_path(run.workflow, run.input))}
    shown = {*usage.workflows, *paths} - {TASK_WORKFLOW} if paths else set(usage.workflows)
    limit = usage.limit
    if limit is None and runs:
        limit = _quota_limit(runs[0].input)
    return dataclasses.replace(usage, workflows=tuple(sorted(shown)), limit=limit)


def _quota_limit(input: dict[str, Any]) -> int | None:
    """The limit of the quota of the task ``input`` names, on its backend in this
    process (``None`` when either cannot be found here)."""
    try:
        backend = task_backends[input["backend"]]
        task = import_string(input["task"])
    except (InvalidTaskBackend, ImportError, KeyError):
        return None
    if not isinstance(backend, DurableTaskBackend) or not isinstance(task, Task):
        return None
    try:
        quota = backend.quota(task)
    except Exception:  # a task's own quota that does not check: nothing to show
        return None
    return quota.limit if quota is not None else None


def _refused(error: ConcurrencyLimitError, path: str) -> ConcurrencyLimitError:
    """``error`` as the refusal of task ``path``: the task's path stands for the workflow
    every task runs as, in ``error.workflow`` and its message."""
    kind, arguments = error.__reduce__()[:2]
    refused: ConcurrencyLimitError = kind(path, *arguments[1:])
    refused.engine, refused.line = error.engine, error.line
    return refused


def _importable(path: str) -> Any:
    try:
        return import_string(path)
    except ImportError:
        return None


__all__ = ["DurableTask", "DurableTaskBackend", "task_usage"]
