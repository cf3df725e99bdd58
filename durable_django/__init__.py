"""Durable workflows for Django, with concurrency quotas on starting runs."""

from ._rules.concurrency import DEFAULT_CONCURRENCY_STATUSES, Concurrency, RateLimit
from ._runtime.execution import Context
from ._runtime.handles import BatchStart, RunHandle
from .declaration import BaseWorkflow, Workflow, workflow
from .engines import Engine
from .engines import default_engine as engine
from .errors import (
    ChildWorkflowError,
    ConcurrencyLimitError,
    DurableError,
    NonDeterminismError,
    RateLimitError,
    RunFailed,
    RunNotFound,
    RunTimeout,
    SignalTimeout,
    StepError,
    UnstorableValueError,
    WorkflowNotFound,
)
from .observability import RunInfo, current_run
from .status import RunStatus

__all__ = [
    "DEFAULT_CONCURRENCY_STATUSES",
    "BaseWorkflow",
    "BatchStart",
    "ChildWorkflowError",
    "Concurrency",
    "ConcurrencyLimitError",
    "Context",
    "DurableError",
    "Engine",
    "NonDeterminismError",
    "RateLimit",
    "RateLimitError",
    "RunFailed",
    "RunHandle",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "RunTimeout",
    "SignalTimeout",
    "StepError",
    "UnstorableValueError",
    "Workflow",
    "WorkflowNotFound",
    "current_run",
    "engine",
    "workflow",
]
