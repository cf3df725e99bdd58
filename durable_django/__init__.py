"""Durable workflows for Django, with concurrency quotas on starting runs."""

from .concurrency import DEFAULT_CONCURRENCY_STATUSES, Concurrency
from .declaration import BaseWorkflow, Workflow, workflow
from .engines import Engine, RunHandle
from .engines import default_engine as engine
from .errors import (
    ChildWorkflowError,
    ConcurrencyLimitError,
    DurableError,
    RunFailed,
    RunNotFound,
    RunTimeout,
    UnstorableValueError,
    WorkflowNotFound,
)
from .status import RunStatus

__all__ = [
    "DEFAULT_CONCURRENCY_STATUSES",
    "BaseWorkflow",
    "ChildWorkflowError",
    "Concurrency",
    "ConcurrencyLimitError",
    "DurableError",
    "Engine",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunStatus",
    "RunTimeout",
    "UnstorableValueError",
    "Workflow",
    "WorkflowNotFound",
    "engine",
    "workflow",
]
