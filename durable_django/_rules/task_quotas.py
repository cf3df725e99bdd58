"""The settings of :class:`~durable_django.tasks_backend.DurableTaskBackend` checked
(:func:`backend_settings`, asked by the backend and by the system check, on any Django),
and its quotas on the tasks of Django's tasks framework, resolved per enqueue.

One task's quota is a dict:

```python
{"key": "reports", "limit": 4}                                 # one fixed key
{"key_function": "myapp.quotas.report_key", "limit": 4}        # a key per call
{"key_function": report_key, "limit": 4, "count_statuses": ["pending", "running"]}
```

``key`` is a fixed ``str``, or a callable; ``key_function`` the dotted path of a callable
(imported when first used). Either callable takes the task's arguments, as the task
function does (``report_key(*args, **kwargs)``), and returns the key, or ``None`` for an
enqueue without a quota. ``limit`` is an ``int``; ``count_statuses`` as on any quota.

One task's rate limit (``OPTIONS["rate_limit"]``) is a dict of the same form with ``per``
(seconds) in place of ``count_statuses``: ``{"key": "reports", "limit": 60, "per": 60}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .._core.user_code import user_failure
from .concurrency import DEFAULT_CONCURRENCY_STATUSES, Concurrency, RateLimit, validate_key

#: The keys one task's quota may have.
OPTION_NAMES = frozenset({"key", "key_function", "limit", "count_statuses"})
#: The keys one task's rate limit may have.
RATE_OPTION_NAMES = frozenset({"key", "key_function", "limit", "per"})

TaskKeyFunction = Callable[..., str | None]


@dataclass(frozen=True, slots=True)
class TaskQuota:
    """The quota of one task, its options checked: a fixed ``key``, or a ``key_function``
    (a callable, or the dotted path of one) of the task's arguments."""

    task: str
    limit: int
    key: str | None = None
    key_function: TaskKeyFunction | str | None = None
    count_statuses: tuple[str, ...] = DEFAULT_CONCURRENCY_STATUSES
    #: A rate limit's window, in seconds; ``None`` for a concurrency quota.
    per: float | None = None

    def function(self) -> TaskKeyFunction:
        """The key function, imported from its dotted path on first use."""
        function = self.key_function
        if function is None:
            raise ValueError(f"task {self.task!r}: the concurrency has no key nor key_function")
        if isinstance(function, str):
            try:
                imported = import_string(function)
            except ImportError as error:
                raise ValueError(
                    f"task {self.task!r}: the concurrency key_function {function!r} "
                    f"cannot be imported: {error}"
                ) from error
            if not callable(imported):
                raise TypeError(
                    f"task {self.task!r}: the concurrency key_function {function!r} is not "
                    f"callable but {type(imported).__name__}"
                )
            function = imported
            object.__setattr__(self, "key_function", function)
        return function

    def for_call(self, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The per-start quota of one enqueue, or ``None`` when its key is ``None``.

        A key function that raises, or returns something other than a str or ``None``,
        refuses the enqueue with an error naming the task."""
        key = self.key
        if key is None:
            function = self.function()
            try:
                found = function(*args, **kwargs)
            except BaseException as error:
                if not user_failure(error):
                    raise
                raise ValueError(
                    f"task {self.task!r}: the concurrency key function raised "
                    f"{type(error).__name__}: {error}"
                ) from error
            if found is None:
                return None
            if not isinstance(found, str):
                raise TypeError(
                    f"task {self.task!r}: the concurrency key function must return a str or "
                    f"None, not {type(found).__name__} {found!r}"
                )
            key = validate_key(found, f"task {self.task!r}: concurrency key")
        if self.per is not None:
            return {"key": key, "limit": self.limit, "per": self.per}
        return {"key": key, "limit": self.limit, "count_statuses": list(self.count_statuses)}


def task_quota(task: str, option: Any, rate: bool = False) -> TaskQuota:
    """Check one task's quota option (its rate limit with ``rate``; see the module's
    docstring); raise ``TypeError`` or ``ValueError`` saying what is wrong."""
    kind = "rate_limit" if rate else "concurrency"
    if not isinstance(option, Mapping):
        raise TypeError(
            f"a task's {kind} must be a dict with 'key' or 'key_function', and 'limit'; "
            f"not {type(option).__name__}"
        )
    names = RATE_OPTION_NAMES if rate else OPTION_NAMES
    unknown = set(option) - names
    if unknown:
        raise ValueError(f"unknown {kind} option(s) {sorted(unknown)}; expected {sorted(names)}")
    if rate and "per" not in option:
        raise ValueError("'per' is missing")
    if ("key" in option) == ("key_function" in option):
        raise ValueError("give one of 'key' (a str or a callable) and 'key_function'")
    if "limit" not in option:
        raise ValueError("'limit' is missing")
    limit = option["limit"]
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"'limit' must be an int, not {type(limit).__name__} {limit!r}")
    key = option.get("key")
    function = option.get("key_function")
    if "key" in option and not isinstance(key, str):
        if not callable(key):
            raise TypeError(f"'key' must be a str or a callable, not {type(key).__name__}")
        key, function = None, key
    elif "key_function" in option and not (
        callable(function) or (isinstance(function, str) and "." in function)
    ):
        raise TypeError(f"'key_function' must be a callable or its dotted path, not {function!r}")
    if rate:  # the checks every rate limit makes: the key's text, the limit, the window
        checked_rate = RateLimit(
            key if key is not None else (lambda input: None), limit, option["per"]
        )
        return TaskQuota(
            task=task, limit=limit, key=key, key_function=function, per=checked_rate.per
        )
    # The checks every quota makes: the key's text, the limit's range, the statuses.
    checked = Concurrency(
        key if key is not None else (lambda input: None),
        limit,
        option.get("count_statuses", DEFAULT_CONCURRENCY_STATUSES),
    )
    return TaskQuota(
        task=task,
        limit=limit,
        key=key,
        key_function=function,
        count_statuses=checked.count_statuses,
    )


def task_quotas(
    option: Any, where: str = "concurrency", rate: bool = False
) -> dict[str, TaskQuota]:
    """Check the backend's ``concurrency`` option (``rate_limit`` with ``rate``; named
    ``where`` in errors): the dotted path of each task to its quota. An error names the
    bad entry."""
    if not isinstance(option, Mapping):
        raise TypeError(
            f"{where} must be a dict of task paths to quotas, not {type(option).__name__}"
        )
    quotas = {}
    for task, spec in option.items():
        if not isinstance(task, str) or "." not in task:
            raise ValueError(
                f"{where} is keyed by the dotted path of each task "
                f"('myapp.tasks.send_report'), not {task!r}"
            )
        try:
            quotas[task] = task_quota(task, spec, rate)
        except (TypeError, ValueError) as error:
            kind = ValueError if isinstance(error, ValueError) else TypeError
            raise kind(f"{where}[{task!r}]: {error}") from None
    return quotas


#: The keys of the backend's ``OPTIONS``.
BACKEND_OPTION_NAMES = frozenset({"concurrency", "rate_limit"})
#: Django's queue of a task that names none (``django.tasks.DEFAULT_TASK_QUEUE_NAME``).
DEFAULT_QUEUE_NAME = "default"


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """A ``TASKS`` entry of the backend, checked: its ``QUEUES`` and the quota of each
    task named in ``OPTIONS["concurrency"]``."""

    queues: frozenset[str]
    quotas: dict[str, TaskQuota]
    rate_limits: dict[str, TaskQuota] = field(default_factory=dict)


def backend_settings(alias: str, params: Any) -> BackendSettings:
    """Check ``TASKS[alias]`` for the backend; raise ``ImproperlyConfigured`` naming the
    option that is wrong. The backend and the system check both ask it."""
    where = f"TASKS[{alias!r}]"
    if not isinstance(params, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict, not {type(params).__name__}")
    queues = params.get("QUEUES", [DEFAULT_QUEUE_NAME])
    if isinstance(queues, str | bytes) or not isinstance(queues, list | tuple | set | frozenset):
        raise ImproperlyConfigured(
            f"{where}['QUEUES'] must be a list of queue names, not {type(queues).__name__} "
            f"{queues!r}"
        )
    for name in queues:
        if not isinstance(name, str) or not name.strip():
            raise ImproperlyConfigured(
                f"{where}['QUEUES']: each queue name must be a non-empty str, not {name!r}"
            )
    options = params.get("OPTIONS", {})
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(
            f"{where}['OPTIONS'] must be a dict, not {type(options).__name__}"
        )
    unknown = set(options) - BACKEND_OPTION_NAMES
    if unknown:
        raise ImproperlyConfigured(
            f"{where}['OPTIONS']: unknown option(s) {sorted(unknown)}; "
            f"expected {sorted(BACKEND_OPTION_NAMES)}"
        )
    try:
        quotas = task_quotas(options.get("concurrency", {}), f"{where}['OPTIONS']['concurrency']")
        rates = task_quotas(
            options.get("rate_limit", {}), f"{where}['OPTIONS']['rate_limit']", rate=True
        )
    except (TypeError, ValueError) as error:
        raise ImproperlyConfigured(str(error)) from None
    return BackendSettings(queues=frozenset(queues), quotas=quotas, rate_limits=rates)


def celery_queue(queue_name: str) -> str:
    """The Celery queue of a task enqueued on Django queue ``queue_name``: the same name,
    except Django's ``"default"``, which is the workers' queue (``""``: the engine's,
    ``DURABLE["QUEUE"]``)."""
    return "" if queue_name == DEFAULT_QUEUE_NAME else queue_name


__all__ = [
    "BACKEND_OPTION_NAMES",
    "DEFAULT_QUEUE_NAME",
    "OPTION_NAMES",
    "RATE_OPTION_NAMES",
    "BackendSettings",
    "TaskQuota",
    "backend_settings",
    "celery_queue",
    "task_quota",
    "task_quotas",
]
