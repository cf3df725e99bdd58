"""What a start returns: a run's handle (:class:`RunHandle`), a batch's outcome
(:class:`BatchStart`), and what names a workflow to start (:data:`WorkflowRef`).

Low and on its own, so that what holds or returns a handle (the turn's child starts, the
declared workflows) need not import the start path for a type.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias

from asgiref.sync import sync_to_async

from .._core.records import RunRecord
from .._rules.registry import WorkflowDefinition
from ..errors import ConcurrencyLimitError, RunFailed
from ..status import RunStatus

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    from .._core.runtime import Runtime

    #: A workflow's input and output, as its body declares them; ``Any`` where unsaid.
    Input = TypeVar("Input", default=Any)
    Output = TypeVar("Output", default=Any)
else:  # a TypeVar's default is the type checker's (PEP 696); Python 3.11 has none
    Input = typing.TypeVar("Input")
    Output = typing.TypeVar("Output")


class Declared(Protocol):
    """A declared workflow, as a ``@workflow`` function's :class:`~durable_django.Workflow`
    is: it holds its definition."""

    @property
    def definition(self) -> WorkflowDefinition:
        """The definition new runs start with."""


class DeclaredClass(Protocol):
    """A ``BaseWorkflow`` class decorated with ``@workflow``: its ``durable`` holds the
    :class:`~durable_django.Workflow`."""

    @property
    def durable(self) -> Declared:
        """The class's declared workflow."""


#: What names a workflow to start: its registered name, a declared workflow (a
#: ``@workflow`` function or ``BaseWorkflow`` class), or a definition. Told by their
#: shape, so that this module names nothing of the declarations above it.
WorkflowRef: TypeAlias = "str | WorkflowDefinition | Declared | DeclaredClass"


class RunHandle(Generic[Output]):
    """A started run: its id, its workflow, whether this start created it, and its fate.

    ``run_id`` (str), ``workflow`` (its name) and ``created`` (False when an idempotent
    re-start found the run already there) are plain attributes; ``status`` is read afresh.
    A handle from ``Wf.dispatch`` is typed with the workflow's output (``RunHandle[int]``
    for a body returning an ``int``), which ``result`` returns.
    """

    __slots__ = ("created", "engine", "run_id", "workflow")

    def __init__(self, engine: Runtime, run_id: str, workflow: str, created: bool) -> None:
        self.engine = engine
        self.run_id = run_id
        self.workflow = workflow
        self.created = created

    def __repr__(self) -> str:
        return f"<RunHandle {self.workflow} {self.run_id} created={self.created}>"

    @property
    def status(self) -> str:
        """The run's status, read afresh."""
        return self.engine.get_run(self.run_id).status

    def result(self, timeout: float | None = None) -> Output:
        """Wait for the run to settle; return its output, or raise :class:`RunFailed`."""
        output: Output = _outcome(self.engine.wait_for_run(self.run_id, timeout=timeout))
        return output

    async def aresult(self, timeout: float | None = None) -> Output:
        """``result`` for async code."""
        return await sync_to_async(self.result)(timeout)


def _outcome(run: RunRecord) -> Any:
    if run.status == RunStatus.COMPLETED:
        return run.output
    raise RunFailed(run.run_id, run.status, run.error)


@dataclass(frozen=True, slots=True)
class BatchStart(Generic[Output]):
    """What a batch of starts did (``Wf.dispatch_many``, ``engine.start_many``).

    ``started``: the handles of the runs started, in the order of the inputs (an
    idempotent re-start among them has ``created`` False). ``refused``: ``(index,
    error)`` pairs, the index of the input in the batch and the
    :class:`~durable_django.ConcurrencyLimitError` that refused it. ``handles``: one
    entry per input, its handle or ``None`` where it was refused.
    """

    started: list[RunHandle[Output]]
    refused: list[tuple[int, ConcurrencyLimitError]]
    handles: list[RunHandle[Output] | None]


__all__ = ["BatchStart", "Input", "Output", "RunHandle", "WorkflowRef"]
