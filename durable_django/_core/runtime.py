"""What the runtime services need of the engine: the :class:`Runtime` protocol.

The services (the start path, the tick, schedules, quota usage, estimates, events, the
purge, the metrics' gauge) are module functions taking the engine as their first
argument. They name it by this protocol, defined low, rather than by
:class:`~durable_django.engines.Engine`, which imports them: so the direction of their
dependency is real, and a service can be driven by anything that has these few members.
``Engine`` has them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._rules.registry import Registry, WorkflowDefinition
    from ..stores.base import BaseStore
    from .records import NewRun, RunRecord


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """An engine's options once resolved against the settings."""

    store: BaseStore
    namespace: str
    scope_reads: bool
    queue: str
    enqueue: bool
    publish: str
    lease_seconds: float
    blocked_retry_seconds: float
    pending_resend_seconds: float

    @property
    def sends_later(self) -> bool:
        """Whether run messages leave from the process's sender thread (``PUBLISH``)."""
        return self.publish == "background"


class Runtime(Protocol):
    """The members of the engine the runtime services use."""

    @property
    def config(self) -> EngineConfig:
        """The resolved options."""

    @property
    def store(self) -> BaseStore:
        """The store runs live in."""

    @property
    def registry(self) -> Registry:
        """The workflows this process knows."""

    @property
    def namespace(self) -> str:
        """Stamped on every run the engine creates."""

    @property
    def read_namespace(self) -> str | None:
        """The namespace reads are fenced to, or ``None``."""

    def definition(self, workflow: Any) -> WorkflowDefinition:
        """The definition to start for a name, a declared workflow or a definition."""

    def send_each(self, runs: Iterable[RunRecord | NewRun]) -> None:
        """Have workers execute ``runs`` once the current transaction commits."""

    def get_run(self, run_id: str) -> RunRecord:
        """The run ``run_id`` (in the read namespace)."""

    def wait_for_run(self, run_id: str, timeout: float | None = None) -> RunRecord:
        """The run once it has finished, waiting at most ``timeout`` seconds."""

    def wake(self, run_id: str) -> bool:
        """Make a suspended run pending and send it to a worker; whether it was suspended."""

    def finished(self, run: RunRecord, status: str) -> None:
        """What follows a run's end: its parent woken, ``run_finished`` sent on commit."""


__all__ = ["EngineConfig", "Runtime"]
