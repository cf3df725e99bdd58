"""The engine: starts runs under their quotas, reads them, and executes them.

``durable_django.engine`` is the default engine, configured from ``settings.DURABLE``
when first used. Build others directly: ``Engine(store=MemoryStore(), namespace="blue")``.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from . import concurrency as quotas
from .conf import build_store, durable_settings
from .errors import ConcurrencyLimitError, DurableError, RunFailed, RunNotFound, RunTimeout
from .limits import text_lengths
from .registry import (
    Registry,
    WorkflowBody,
    WorkflowDefinition,
    default_registry,
    make_definition,
    validate_tags,
)
from .retention import PurgeResult, purge
from .serialization import check_text, json_copy, validate_text
from .signals import run_finished, run_refused, run_started
from .signals import send as send_signal
from .status import ACTIVE_STATUSES, ALL_STATUSES, TERMINAL_STATUSES, RunStatus
from .stores.base import (
    BaseStore,
    NewRun,
    RunRecord,
    StartOutcome,
    check_quota,
    quota_transaction,
)
from .tick import TickResult, tick

if TYPE_CHECKING:
    from .events import PublishResult
    from .usage import QuotaUsage


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """An engine's options once resolved against the settings."""

    store: BaseStore
    namespace: str
    scope_reads: bool
    queue: str
    enqueue: bool
    lease_seconds: float
    blocked_retry_seconds: float
    pending_resend_seconds: float


class RunHandle:
    """A started run: its id, its workflow, whether this start created it, and its fate.

    ``run_id`` (str), ``workflow`` (its name) and ``created`` (False when an idempotent
    re-start found the run already there) are plain attributes; ``status`` is read afresh.
    """

    __slots__ = ("created", "engine", "run_id", "workflow")

    def __init__(self, engine: Engine, run_id: str, workflow: str, created: bool) -> None:
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

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the run to settle; return its output, or raise :class:`RunFailed`."""
        return _outcome(self.engine.wait_for_run(self.run_id, timeout=timeout))

    async def aresult(self, timeout: float | None = None) -> Any:
        """``result`` for async code."""
        return await sync_to_async(self.result)(timeout)


def _outcome(run: RunRecord) -> Any:
    if run.status == "completed":
        return run.output
    raise RunFailed(run.run_id, run.status, run.error)


class Engine:
    """Starts, reads and executes runs through one store.

    Options left as ``None`` are read from ``settings.DURABLE`` on first use.
    """

    def __init__(
        self,
        store: Any = None,
        *,
        namespace: str | None = None,
        scope_reads: bool | None = None,
        queue: str | None = None,
        enqueue: bool | None = None,
        registry: Registry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else default_registry
        self._options = {
            "STORE": store,
            "NAMESPACE": namespace,
            "SCOPE_READS": scope_reads,
            "QUEUE": queue,
            "ENQUEUE": enqueue,
            "LEASE_SECONDS": None,
            "BLOCKED_RETRY_SECONDS": None,
            "PENDING_RESEND_SECONDS": None,
        }
        self._config: EngineConfig | None = None

    def __repr__(self) -> str:
        return f"<Engine namespace={self.namespace!r} store={self.store!r}>"

    # configuration ------------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        """The resolved options (settings are read once, on first use)."""
        if self._config is None:
            given = {k: v for k, v in self._options.items() if v is not None}
            # Read the settings only for what was not given.
            defaults = durable_settings() if len(given) < len(self._options) else {}
            merged = {**defaults, **given}
            self._config = EngineConfig(
                store=build_store(merged["STORE"]),
                namespace=validate_text(merged["NAMESPACE"], "namespace", text_lengths().namespace),
                scope_reads=bool(merged["SCOPE_READS"]),
                queue=(
                    validate_text(merged["QUEUE"], "queue", text_lengths().queue)
                    if merged["QUEUE"]
                    else ""
                ),
                enqueue=bool(merged["ENQUEUE"]),
                lease_seconds=_positive(merged, "LEASE_SECONDS"),
                blocked_retry_seconds=_positive(merged, "BLOCKED_RETRY_SECONDS"),
                pending_resend_seconds=_positive(merged, "PENDING_RESEND_SECONDS"),
            )
        return self._config

    def reload(self) -> None:
        """Forget the resolved options; the next use reads the settings again."""
        self._config = None

    @property
    def store(self) -> BaseStore:
        """The store runs live in."""
        return self.config.store

    @property
    def namespace(self) -> str:
        """Stamped on every run this engine creates (unless a start names another)."""
        return self.config.namespace

    @property
    def read_namespace(self) -> str | None:
        """The namespace reads are fenced to, or ``None`` when they see every namespace."""
        config = self.config
        return config.namespace if config.scope_reads else None

    # registration -------------------------------------------------------------------

    def register(
        self,
        name: str,
        version: str,
        fn: WorkflowBody,
        *,
        concurrency: quotas.ConcurrencyOption = None,
        tags: Iterable[str] = (),
        on_event: Iterable[str] = (),
        schedule: Any = None,
    ) -> WorkflowDefinition:
        """Register ``fn(ctx, input)`` as workflow ``name`` at ``version``."""
        if not callable(fn):
            raise TypeError(f"workflow {name!r}: fn must be callable, not {type(fn).__name__}")
        return self.registry.add(
            make_definition(
                name,
                version,
                fn,
                concurrency=concurrency,
                tags=tags,
                on_event=on_event,
                schedule=schedule,
            )
        )

    def register_remote(
        self,
        name: str,
        version: str,
        *,
        queue: str,
        concurrency: quotas.ConcurrencyOption = None,
        tags: Iterable[str] = (),
        on_event: Iterable[str] = (),
        schedule: Any = None,
    ) -> WorkflowDefinition:
        """Register a workflow whose code runs in another deployment serving ``queue``.

        This engine creates and quota-checks its runs and routes them to ``queue``; it
        never executes them itself.
        """
        return self.registry.add(
            make_definition(
                name,
                version,
                None,
                queue=queue,
                remote=True,
                concurrency=concurrency,
                tags=tags,
                on_event=on_event,
                schedule=schedule,
            )
        )

    def definition(self, workflow: Any) -> WorkflowDefinition:
        """The definition to start for a name, a declared workflow or a definition."""
        if isinstance(workflow, WorkflowDefinition):
            return workflow
        declared = getattr(workflow, "durable", workflow)  # a decorated BaseWorkflow class
        definition = getattr(declared, "definition", None)
        if isinstance(definition, WorkflowDefinition):
            return definition
        return self.registry.latest(
            validate_text(workflow, "workflow name", text_lengths().workflow)
        )

    # starting -----------------------------------------------------------------------

    def start(
        self,
        workflow: Any,
        input: Any = None,
        run_id: str | None = None,
        *,
        concurrency: quotas.ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> RunHandle:
        """Create a run and enqueue its execution once the transaction commits.

        ``run_id`` is an idempotency key: re-starting it returns the existing run
        (``handle.created`` is False) and is never refused. ``concurrency`` replaces the
        workflow's quota for this start. Raises :class:`ConcurrencyLimitError` when the
        quota is full; then nothing is created and nothing is sent.
        """
        definition, input, concurrency = self._prepare(workflow, input, concurrency)
        quota = quotas.resolve(concurrency, input, definition.name)
        return self._start(definition, input, quota, run_id, tags, namespace)

    async def astart(
        self,
        workflow: Any,
        input: Any = None,
        run_id: str | None = None,
        *,
        concurrency: quotas.ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> RunHandle:
        """``start`` for async code; an async limit function is awaited on the loop."""
        definition, input, concurrency = self._prepare(workflow, input, concurrency)
        quota = await quotas.aresolve(concurrency, input, definition.name)
        return await sync_to_async(self._start)(definition, input, quota, run_id, tags, namespace)

    def start_child(
        self,
        parent: RunRecord,
        workflow: Any,
        input: Any,
        run_id: str,
        *,
        concurrency: quotas.ConcurrencyOption = None,
        tags: Iterable[str] = (),
    ) -> RunHandle:
        """Start a child of ``parent``, in its namespace, under the child's quota."""
        definition, input, concurrency = self._prepare(workflow, input, concurrency)
        quota = quotas.resolve(concurrency, input, definition.name)
        return self._start(
            definition, input, quota, run_id, tags, parent.namespace, parent_id=parent.run_id
        )

    def _prepare(
        self, workflow: Any, input: Any, concurrency: quotas.ConcurrencyOption
    ) -> tuple[WorkflowDefinition, Any, quotas.Concurrency | None]:
        """The definition, the input as JSON, and the quota that applies (a per-start
        one replaces the workflow's)."""
        definition = self.definition(workflow)
        input = json_copy(input, f"the input of workflow {definition.name!r}")
        option = quotas.for_start(concurrency) if concurrency is not None else None
        return definition, input, option or definition.concurrency

    def _start(
        self,
        definition: WorkflowDefinition,
        input: Any,
        quota: quotas.Quota | None,
        run_id: str | None,
        tags: Iterable[str],
        namespace: str | None,
        *,
        parent_id: str | None = None,
    ) -> RunHandle:
        config = self.config
        lengths = text_lengths()
        explicit_id = run_id is not None
        if explicit_id:
            validate_text(run_id, "run_id", lengths.run_id)
        else:
            run_id = uuid.uuid4().hex
        all_tags = (*definition.tags, *validate_tags(tags), *((quota.tag,) if quota else ()))
        queue = definition.queue if definition.remote else config.queue
        run = NewRun(
            run_id=run_id,
            workflow=definition.name,
            version=definition.version,
            namespace=(
                validate_text(namespace, "namespace", lengths.namespace)
                if namespace is not None
                else config.namespace
            ),
            input=input,
            tags=tuple(dict.fromkeys(all_tags)),
            queue=queue,
            parent_id=parent_id,
        )
        try:
            outcome = self._store_start(run, quota, explicit_id)
        except ConcurrencyLimitError as error:
            send_signal(run_refused, type(self), engine=self, workflow=run.workflow, error=error)
            raise
        if outcome.created:
            self.send(run_id, queue)
            if run_started.has_listeners():
                self.store.on_commit(
                    lambda: send_signal(
                        run_started,
                        type(self),
                        engine=self,
                        run_id=run.run_id,
                        workflow=run.workflow,
                        namespace=run.namespace,
                        parent_id=run.parent_id,
                    )
                )
        return RunHandle(self, run_id, outcome.workflow, outcome.created)

    def send(self, run_id: str, queue: str) -> None:
        """Have a worker execute the run once the current transaction commits (a message on
        ``queue``; nothing when the engine does not enqueue or its store is not shared)."""
        config = self.config
        if config.enqueue and config.store.is_shared:
            config.store.on_commit(lambda: send_run(run_id, queue))

    def _store_start(
        self, run: NewRun, quota: quotas.Quota | None, check_existing: bool
    ) -> StartOutcome:
        return self.store.start_run(
            run, quota, check_existing=check_existing, read_namespace=self.read_namespace
        )

    # waking, signals, cancel and retry ----------------------------------------------

    def wake(self, run_id: str) -> bool:
        """Make a suspended run pending and send it to a worker; False if it was not
        suspended. Waking a run early is harmless: it replays and suspends again."""
        run = self.store.get_run(run_id)
        if run is None:
            return False
        woken = self.store.transition(
            run_id, [RunStatus.SUSPENDED], RunStatus.PENDING, wake_at=None, wait=None
        )
        if woken:
            self.send(run_id, run.queue)
        return woken

    def signal(self, token: str, payload: Any = None) -> None:
        """Deliver ``payload`` to the run waiting on ``token``, or keep it for the first
        run that will. One signal is taken by one wait."""
        validate_text(token, "signal token", text_lengths().signal_token)
        payload = json_copy(payload, f"the payload of signal {token!r}")
        self.store.send_signal(token, payload)
        for run in self.store.runs_waiting_on_signal(token):
            self.wake(run.run_id)

    def cancel(self, run_id: str) -> bool:
        """Cancel a run that has not ended; its slot frees at once. Returns False when
        the run had already ended. A worker executing it stops at its next durable call."""
        run = self.get_run(run_id)
        cancelled = self.store.transition(
            run_id,
            ACTIVE_STATUSES,
            RunStatus.CANCELLED,
            finished_at=timezone.now(),
            lease_owner="",
            lease_expires_at=None,
            wake_at=None,
            error={"type": "cancelled", "message": "cancelled"},
        )
        if cancelled:
            self.finished(run, RunStatus.CANCELLED)
        return cancelled

    def finished(self, run: RunRecord, status: str) -> None:
        """What follows a run's end: its parent is woken, and ``run_finished`` is sent once
        the transaction commits (at once outside one)."""
        if run.parent_id:
            self.wake(run.parent_id)
        if run_finished.has_listeners():
            self.store.on_commit(
                lambda: send_signal(
                    run_finished,
                    type(self),
                    engine=self,
                    run_id=run.run_id,
                    workflow=run.workflow,
                    status=status,
                )
            )

    def retry(self, run_id: str, *, concurrency: quotas.ConcurrencyOption = None) -> RunHandle:
        """Start a failed run again as a new attempt, through the quota like any start.

        Its completed steps are replayed, its failed ones executed again. The quota is the
        workflow's (resolved for the run's input) unless ``concurrency`` replaces it.
        Raises :class:`ConcurrencyLimitError` when the quota is full, and
        :class:`DurableError` when the run has not failed.
        """
        run = self.get_run(run_id)
        if run.status != RunStatus.FAILED:
            raise DurableError(f"only a failed run can be retried; run {run_id!r} is {run.status}")
        definition = self.registry.get(run.workflow, run.version) or self.registry.latest(
            run.workflow
        )
        option = quotas.for_start(concurrency) if concurrency is not None else None
        quota = quotas.resolve(option or definition.concurrency, run.input, run.workflow)
        store = self.store
        with quota_transaction(store, quota):
            if quota is not None:
                try:
                    check_quota(store, quota, run.workflow, self.read_namespace)
                except ConcurrencyLimitError as error:
                    send_signal(
                        run_refused, type(self), engine=self, workflow=run.workflow, error=error
                    )
                    raise
            restarted = store.transition(
                run_id,
                [RunStatus.FAILED],
                RunStatus.PENDING,
                attempt=run.attempt + 1,
                output=None,
                error=None,
                finished_at=None,
                wake_at=None,
                wait=None,
            )
            if not restarted:
                raise DurableError(f"run {run_id!r} changed while it was being retried")
            store.forget_failed_steps(run_id)
            store.set_quota_tag(run_id, quota.tag if quota else None)
        self.send(run_id, run.queue)
        return RunHandle(self, run_id, run.workflow, True)

    # events and schedules -------------------------------------------------------------

    def publish_event(self, name: str, payload: Any = None, id: str | None = None) -> PublishResult:
        """Start one run of every workflow subscribed to ``name`` (``on_event=[...]``).

        A subscriber refused by its quota is skipped (and ``event_skipped`` sent); the
        others still start. The runs are created in one transaction: an unexpected error
        creates and sends nothing. With ``id``, a re-publish of the same event starts
        nothing new.
        """
        from .events import publish

        return publish(self, name, payload, id)

    # the tick -------------------------------------------------------------------------

    def tick(self, now: datetime.datetime | None = None, *, limit: int = 1000) -> TickResult:
        """Hand on what is due: wake runs whose timer is due, hand runs whose worker died
        (lease lapsed) and blocked runs to a worker again, send again runs whose message
        seems lost, and (on a shared store) fire the due schedule windows after syncing
        the declared schedules. Idempotent, and safe from several processes at once: each
        hand-on is a conditional update that only one ticker wins."""
        return tick(self, now or timezone.now(), limit)

    def purge(
        self,
        older_than: datetime.timedelta | datetime.datetime,
        *,
        statuses: Collection[str] | None = None,
        batch_size: int = 1000,
    ) -> PurgeResult:
        """Delete the runs that finished before ``older_than`` (a ``timedelta`` ago, or a
        ``datetime``), with their tags and recorded steps, and the signals taken before
        it. ``statuses`` narrows the finished statuses purged (all three by default);
        active runs are never purged, nor runs below an active run (a parent, grandparent,
        ... still active may read their outcomes again). With ``SCOPE_READS``, only this
        engine's namespace. Examines ``batch_size`` runs per transaction."""
        return purge(self, older_than, statuses, batch_size)

    # reading ------------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord:
        """The run with this id, or :class:`RunNotFound`."""
        _check_filters(run_id=run_id)
        run = self.store.get_run(run_id)
        read_namespace = self.read_namespace
        if run is None or (read_namespace is not None and run.namespace != read_namespace):
            raise RunNotFound(run_id)
        return run

    def _read_namespace_for(self, namespace: str | None) -> str | None:
        _check_filters(namespace=namespace)
        read_namespace = self.read_namespace
        if read_namespace is None:
            return namespace
        if namespace is not None and namespace != read_namespace:
            raise ValueError(
                f"this engine reads only namespace {read_namespace!r}, not {namespace!r}"
            )
        return read_namespace

    def list_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        workflow: str | None = None,
        namespace: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs matching every filter given, newest first."""
        _check_filters(tag=tag, workflow=workflow)
        return self.store.list_runs(
            tag=tag,
            statuses=_check_statuses(statuses),
            workflow=workflow,
            namespace=self._read_namespace_for(namespace),
            limit=limit,
        )

    def count_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        """How many runs match; the same count the quota makes for ``tag``."""
        _check_filters(tag=tag)
        statuses = _check_statuses(statuses)
        namespace = self._read_namespace_for(namespace)
        return self.store.count_runs(tag=tag, statuses=statuses, namespace=namespace)

    def quota_usage(self, key: str | None = None) -> list[QuotaUsage]:
        """Every quota key holding active runs (or just ``key``): how many, for which
        workflows, against the limit they declare. Busiest first."""
        from .usage import quota_usage

        _check_filters(key=key)
        return quota_usage(self, key)

    def wait_for_run(self, run_id: str, timeout: float | None = None) -> RunRecord:
        """Poll until the run is completed, failed or cancelled; :class:`RunTimeout` if not."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            run = self.get_run(run_id)
            if run.status in TERMINAL_STATUSES:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise RunTimeout(f"run {run_id!r} is still {run.status} after {timeout}s")
            time.sleep(delay if deadline is None else min(delay, deadline - time.monotonic()))
            delay = min(delay * 2, 0.25)

    # executing ----------------------------------------------------------------------

    def execute(self, run_id: str) -> bool:
        """Execute one turn of the run if it is waiting for a worker; True if it did."""
        from .execution import execute_run

        return execute_run(self, run_id)


def _positive(options: dict[str, Any], name: str) -> float:
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"DURABLE[{name!r}] must be a positive number of seconds, not {value!r}")
    return float(value)


def _check_filters(**filters: Any) -> None:
    """Refuse text no run can hold (a NUL or a surrogate): the database would raise."""
    for name, value in filters.items():
        if isinstance(value, str):
            check_text(value, name)


def _check_statuses(statuses: Collection[str] | None) -> list[str] | None:
    if statuses is None:
        return None
    if isinstance(statuses, str):
        statuses = [statuses]
    unknown = [s for s in statuses if s not in ALL_STATUSES]
    if unknown:
        raise ValueError(f"unknown status(es) {unknown}; known: {sorted(ALL_STATUSES)}")
    return list(statuses)


def send_run(run_id: str, queue: str) -> None:
    """Send the Celery message that makes a worker execute ``run_id`` (JSON, never pickle)."""
    from .tasks import execute_run

    execute_run.apply_async((run_id,), queue=queue or None, serializer="json")


#: The default engine, configured from ``settings.DURABLE`` on first use.
default_engine = Engine()
