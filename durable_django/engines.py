"""The engine: starts runs under their quotas, reads them, and executes them.

``durable_django.engine`` is the default engine, configured from ``settings.DURABLE``
when first used. Build others directly: ``Engine(store=MemoryStore(), namespace="blue")``.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from django.utils import timezone

from . import metrics
from ._core.limits import text_lengths
from ._core.records import NewRun
from ._core.runtime import EngineConfig as EngineConfig  # importable from here, as before
from ._core.serialization import check_text, json_copy, validate_text
from ._rules import concurrency as quotas
from ._rules.overrides import Override
from ._rules.registry import (
    Registry,
    WorkflowBody,
    WorkflowDefinition,
    default_registry,
    make_definition,
)
from ._rules.retention import PurgeResult
from ._rules.task_meta import task_priority
from ._runtime import estimates, starting
from ._runtime.estimates import Holder
from ._runtime.events import PublishResult, publish
from ._runtime.execution import execute_run
from ._runtime.handles import BatchStart, WorkflowRef
from ._runtime.handles import RunHandle as RunHandle  # importable from here too, as before
from ._runtime.overriding import clear_override, overrides, set_override
from ._runtime.purging import purge
from ._runtime.starting import StartOptions
from ._runtime.tick import TickResult as TickResult  # importable from here, as documented
from ._runtime.tick import tick
from ._runtime.usage import QuotaUsage, RateUsage, quota_usage, rate_usage
from ._runtime.waiting import Wait
from .conf import build_store, durable_settings
from .errors import RunNotFound, RunTimeout, WorkflowNotFound
from .signals import listened, run_finished
from .signals import send as send_signal
from .status import ACTIVE_STATUSES, ALL_STATUSES, TERMINAL_STATUSES, RunStatus
from .stores.base import BaseStore, RunRecord

#: ``DURABLE["PUBLISH"]``: messages sent from the process's sender thread, or by the
#: caller once its transaction commits.
PUBLISH_MODES = ("background", "inline")


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
        publish: str | None = None,
        registry: Registry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else default_registry
        self._options = {
            "STORE": store,
            "NAMESPACE": namespace,
            "SCOPE_READS": scope_reads,
            "QUEUE": queue,
            "ENQUEUE": enqueue,
            "PUBLISH": publish,
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
                publish=_publish_mode(merged["PUBLISH"]),
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
        rate_limit: quotas.RateLimitOption = None,
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
                rate_limit=rate_limit,
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
        rate_limit: quotas.RateLimitOption = None,
        tags: Iterable[str] = (),
        on_event: Iterable[str] = (),
        schedule: Any = None,
        priority: int | None = None,
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
                rate_limit=rate_limit,
                tags=tags,
                on_event=on_event,
                schedule=schedule,
                priority=priority,
            )
        )

    def definition(self, workflow: WorkflowRef) -> WorkflowDefinition:
        """The definition to start for a name, a declared workflow or a definition."""
        if isinstance(workflow, WorkflowDefinition):
            return workflow
        if not isinstance(workflow, str):  # a name has neither attribute: no need to look
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
        workflow: WorkflowRef,
        input: Any = None,
        run_id: str | None = None,
        *,
        concurrency: quotas.ConcurrencyOption = None,
        rate_limit: quotas.RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> RunHandle:
        """Create a run and enqueue its execution once the transaction commits.

        ``run_id`` is an idempotency key: re-starting it returns the existing run
        (``handle.created`` is False) and is never refused. ``concurrency`` (one quota or a
        list) replaces the workflow's quotas for this start. Raises
        :class:`ConcurrencyLimitError` for the first quota, in the list's order, that is
        full; then nothing is created and nothing is sent. ``wait`` (seconds or a
        ``timedelta``, at most an hour) waits that long for a slot before refusing, woken
        when one frees, and through a restart of the database
        (:mod:`durable_django._runtime.waiting`);
        not inside a workflow body, nor a transaction on the store's database but on
        PostgreSQL. ``ticket``: the ``error.ticket`` a fair
        quota gave an earlier refusal of this start, to keep its place in the key's line
        (:mod:`durable_django._rules.tickets`); without it, the ticket presented by the request
        being served, if any. The steps are :mod:`durable_django._runtime.starting`'s.
        """
        options = StartOptions(concurrency, tags, namespace, wait, ticket, rate_limit=rate_limit)
        return starting.start(self, workflow, input, run_id, options)

    async def astart(
        self,
        workflow: WorkflowRef,
        input: Any = None,
        run_id: str | None = None,
        *,
        concurrency: quotas.ConcurrencyOption = None,
        rate_limit: quotas.RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> RunHandle:
        """``start`` for async code; an async limit function is awaited on the loop, and
        ``wait`` waits without blocking it."""
        options = StartOptions(concurrency, tags, namespace, wait, ticket, rate_limit=rate_limit)
        return await starting.astart(self, workflow, input, run_id, options)

    def start_many(
        self,
        workflow: WorkflowRef,
        inputs: Iterable[Any],
        *,
        run_ids: Iterable[str | None] | None = None,
        concurrency: quotas.ConcurrencyOption = None,
        rate_limit: quotas.RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> BatchStart:
        """Start one run of ``workflow`` per input, in one transaction; returns a
        :class:`~durable_django._runtime.handles.BatchStart`.

        Each run is quota-checked against its own key in the order of ``inputs``, as
        ``start`` would one after another: a refused one is listed in ``refused`` with its
        index, and the others still start. ``run_ids`` (one per input, ``None`` for a new
        id) are idempotency keys as in ``start``. Every input is validated, and every
        quota resolved, before anything is written: bad input raises, naming its index,
        and the batch creates nothing. The messages are sent together once the
        transaction commits.
        """
        options = StartOptions(concurrency, tags, namespace, rate_limit=rate_limit)
        return starting.start_many(self, workflow, inputs, run_ids, options)

    async def astart_many(
        self,
        workflow: WorkflowRef,
        inputs: Iterable[Any],
        *,
        run_ids: Iterable[str | None] | None = None,
        concurrency: quotas.ConcurrencyOption = None,
        rate_limit: quotas.RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> BatchStart:
        """``start_many`` for async code; an async limit function is awaited on the loop."""
        options = StartOptions(concurrency, tags, namespace, rate_limit=rate_limit)
        return await starting.astart_many(self, workflow, inputs, run_ids, options)

    def start_child(
        self,
        parent: RunRecord,
        workflow: WorkflowRef,
        input: Any,
        run_id: str,
        *,
        concurrency: quotas.ConcurrencyOption = None,
        rate_limit: quotas.RateLimitOption = None,
        tags: Iterable[str] = (),
    ) -> RunHandle:
        """Start a child of ``parent``, in its namespace, under the child's quota."""
        options = StartOptions(concurrency, tags, rate_limit=rate_limit)
        return starting.start_child(self, parent, workflow, input, run_id, options)

    def send(
        self, run_id: str, queue: str, *, workflow: str = "", priority: int | None = None
    ) -> None:
        """Have a worker execute the run once the current transaction commits (a message on
        ``queue``; nothing when the engine does not enqueue or its store is not shared).
        The message leaves from this process's sender thread unless ``PUBLISH`` is
        ``"inline"``. ``workflow`` names it in Celery's tools; ``priority`` defaults to
        the workflow's (:meth:`message_priority`)."""
        config = self.config
        if config.enqueue and config.store.is_shared:
            self.send_many((run_id,), queue, workflow=workflow, priority=priority)

    def send_many(
        self,
        run_ids: Sequence[str],
        queue: str,
        *,
        workflow: str = "",
        priority: int | None = None,
    ) -> None:
        """``send`` for several runs of one queue: their messages are sent together
        (:func:`send_runs`) once the current transaction commits."""
        if priority is None:
            priority = self.message_priority(workflow)
        self._send_on_commit([(run_id, queue, workflow, priority, None) for run_id in run_ids])

    def send_each(self, runs: Iterable[RunRecord | NewRun]) -> None:
        """``send`` for runs as read from or written to the store: each on its queue, with
        its workflow's priority, and a ``django.tasks`` run with its task's
        (:func:`~durable_django._rules.task_meta.task_priority`), on every send of the run."""
        priorities: dict[str, int | None] = {}
        batch: list[Message] = []
        for run in runs:
            workflow = run.workflow
            if workflow not in priorities:
                priorities[workflow] = self.message_priority(workflow)
            task = task_priority(workflow, run.input)
            batch.append((run.run_id, run.queue, workflow, priorities[workflow], task))
        self._send_on_commit(batch)

    def _send_on_commit(self, batch: Sequence[Message]) -> None:
        config = self.config
        if batch and config.enqueue and config.store.is_shared:
            later = config.sends_later
            config.store.on_commit(lambda: send_runs(batch, later=later))

    def message_priority(self, workflow: str) -> int | None:
        """The priority declared by ``workflow``'s latest version here, if any (else its
        messages take the route's or Celery's ``task_default_priority``)."""
        if not workflow:
            return None
        try:
            return self.registry.latest(workflow).priority
        except WorkflowNotFound:
            return None

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
            self.send_each((run,))
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
        metrics.run_ended(run, status)
        if run.parent_id:
            self.wake(run.parent_id)
        if listened(run_finished, type(self)):
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
        return starting.retry(self, run_id, concurrency=concurrency)

    # events and schedules -------------------------------------------------------------

    def publish_event(self, name: str, payload: Any = None, id: str | None = None) -> PublishResult:
        """Start one run of every workflow subscribed to ``name`` (``on_event=[...]``).

        A subscriber refused by its quota is skipped (and ``event_skipped`` sent); the
        others still start. The runs are created in one transaction: an unexpected error
        creates and sends nothing. With ``id``, a re-publish of the same event starts
        nothing new.
        """
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
        ... still active may read their outcomes again), nor runs finished within the
        longest ``per`` of the rate limits declared on the engine's workflows (they may
        still count in a window). With ``SCOPE_READS``, only this engine's namespace.
        Examines ``batch_size`` runs per transaction."""
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
        """Every quota key holding active runs or overridden (or just ``key``): how many,
        for which workflows, against the limit they declare and the operator's override
        in force (``limit_in_force``). Busiest first."""
        _check_filters(key=key)
        return quota_usage(self, key)

    def rate_usage(self, key: str | None = None) -> list[RateUsage]:
        """Every rate limit key with runs inside its window or overridden (or just
        ``key``): the units used in the window now, against the limit and ``per`` its
        workflows declare and the operator's override in force (``limit_in_force``), and
        when a start of weight 1 next fits under the limit in force. Busiest first."""
        _check_filters(key=key)
        return rate_usage(self, key)

    # operator overrides ----------------------------------------------------------------

    def set_limit(self, key: str, limit: int, until: datetime.datetime | None = None) -> Override:
        """Limit concurrency key ``key`` to ``limit`` (0 pauses it), in place of the limit
        its workflows declare or a start gives, until ``until`` (an aware datetime; for
        good when ``None``) or :meth:`clear_limit`. Stored: the next start of the key in
        every process reads it under the key's lock; runs already admitted keep their
        place. Inside a transaction of the caller's it applies once that commits."""
        return set_override(self, key, "concurrency", limit, until)

    def set_rate_limit(
        self, key: str, limit: int, until: datetime.datetime | None = None
    ) -> Override:
        """:meth:`set_limit` for rate limit key ``key``: ``limit`` units per the window
        its rate limits declare (0 pauses it)."""
        return set_override(self, key, "rate", limit, until)

    def clear_limit(self, key: str) -> bool:
        """End the override of concurrency key ``key``: its starts obey the declared
        limit again. Whether there was one."""
        return clear_override(self, key, "concurrency")

    def clear_rate_limit(self, key: str) -> bool:
        """End the override of rate limit key ``key``; whether there was one."""
        return clear_override(self, key, "rate")

    def overrides(self, key: str | None = None) -> list[Override]:
        """The overrides in force now (of ``key`` only, when given), concurrency and rate
        keys alike, by kind and key."""
        _check_filters(key=key)
        return overrides(self, key)

    def quota_holders(self, key: str) -> list[Holder]:
        """The runs holding quota ``key`` now (in the statuses a quota counts by default,
        in this engine's read namespace), oldest first: each one's run id, workflow,
        status, created and started times, and age in seconds. Reads the tag index."""
        _check_filters(key=key)
        return estimates.holders(self, key)

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
        return execute_run(self, run_id)


def _positive(options: dict[str, Any], name: str) -> float:
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"DURABLE[{name!r}] must be a positive number of seconds, not {value!r}")
    return float(value)


def _publish_mode(value: Any) -> str:
    if value not in PUBLISH_MODES:
        raise ValueError(f"DURABLE['PUBLISH'] must be one of {list(PUBLISH_MODES)}, not {value!r}")
    return str(value)


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


def send_run(run_id: str, queue: str, *, later: bool = False) -> None:
    """Send the Celery message that makes a worker execute ``run_id`` (JSON, never pickle):
    the lean publish of :mod:`durable_django._runtime.publishing`, inline, or from this process's
    sender thread when ``later`` (:mod:`durable_django._runtime.sending`)."""
    send_runs([(run_id, queue, "", None, None)], later=later)


#: A run's message as the engine hands it over:
#: :class:`~durable_django._runtime.publishing.RunMessage`'s fields
#: ``(run_id, queue, workflow, priority, task_priority)``; a tuple, so that the
#: engine imports neither Celery nor kombu.
Message = tuple[str, str, str, int | None, int | None]


def send_runs(runs: Sequence[Message], *, later: bool = False) -> None:
    """Send the Celery messages of several runs together: one message per run, as
    :func:`send_run` makes it, in one call of
    :func:`~durable_django._runtime.publishing.publish_runs` (one broker connection, one round
    trip on Redis; with ``task_always_eager`` each run executes at once); from this
    process's sender thread when ``later``."""
    if later:
        from ._runtime.sending import send_later

        send_later(runs)
    else:
        from ._runtime.publishing import publish_runs

        publish_runs(runs)


#: The default engine, configured from ``settings.DURABLE`` on first use.
default_engine = Engine()
metrics.read_by_default(default_engine)  # the gauge of quota usage reads it
