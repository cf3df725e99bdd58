"""The store contract: what the engine needs from the place runs are kept.

A store keeps runs, their tags, their recorded steps and the signals sent to them. The
engine talks to it only through :class:`BaseStore`, an abstract base class in the manner
of Django's ``SessionBase``: its **primitives** are abstract, and every store implements
them; its **composites** (the start, the quota count, a turn's claim, record and end, the
purge, the quota usage) are methods built from the primitives, which a store may override
with a faster equivalent that keeps their meaning. ``OrmStore`` overrides most of them
(one statement each on PostgreSQL); ``MemoryStore`` implements the primitives only.

Every change of a run's status goes through ``transition``: a conditional update (the
run must be in one of ``from_statuses``, and optionally held by a given worker) that
changes the run and its tags' copy of the status together, and says whether it happened.
That one primitive makes claiming, finishing, waking, cancelling and recovering runs safe
when several workers and tickers race.

The records that cross the contract (:class:`NewRun`, :class:`RunRecord`,
:class:`StepRecord`, :class:`StartOutcome`) live in :mod:`durable_django._core.records` and are
importable from here too. ``durable_django.testing.StoreContract`` is the test suite a
store runs against itself.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from django.db import transaction as db_transaction
from django.utils import timezone

from .._core.lifecycle import TERMINAL_STATUSES
from .._core.limits import RATE_TAG_PREFIX, TAG_PREFIX
from .._core.records import NewRun, RunRecord, StartOutcome, StepRecord
from .._rules.admission import Refusal, decide, rate_retry_after, window_start
from .._rules.concurrency import Quota
from .._rules.overrides import Override, in_force, scope_of
from .._rules.retention import active_ancestors
from .._rules.tickets import KeptTicket, Line, Ticket, place_in_line
from ..errors import ConcurrencyLimitError, DurableError

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncReleaseListener",
    "BaseStore",
    "NewRun",
    "QuotaDecision",
    "ReleaseListener",
    "RunRecord",
    "StartOutcome",
    "StartRequest",
    "StepRecord",
    "Store",
    "batch_index",
    "check_batch_ids",
    "check_quota",
    "check_quotas",
    "decide_quotas",
    "existing_outcome",
    "quota_list",
    "quota_transaction",
]


@dataclass(frozen=True, slots=True)
class StartRequest:
    """One start of a batch (:meth:`BaseStore.start_runs`): the run to create, its quotas
    (one, a list of them with distinct keys, or none: unlimited), and whether a run
    already holding its id is looked for. ``quotas`` is kept as a tuple."""

    run: NewRun
    quotas: tuple[Quota, ...]
    check_existing: bool

    def __init__(
        self, run: NewRun, quotas: Quota | Sequence[Quota] | None, check_existing: bool
    ) -> None:
        object.__setattr__(self, "run", run)
        object.__setattr__(self, "quotas", quota_list(quotas))
        object.__setattr__(self, "check_existing", check_existing)


class BaseStore(abc.ABC):
    """Where runs live: the primitives a store implements, and the composites built on them.

    Subclass it, set :attr:`is_shared`, implement every abstract method, and run
    ``durable_django.testing.StoreContract`` against the store. Override a composite only
    with an equivalent that is faster on your storage; the contract suite holds the
    override to the same meaning.
    """

    #: The alias of the Django database holding this store's runs, or ``None`` when they
    #: are kept elsewhere. Execution uses it to keep a refused write from breaking a
    #: transaction of the caller's, and (through :meth:`connection_lost`) to tell a
    #: database that went away from one that refused a statement.
    using: str | None = None

    # primitives: what every store implements ------------------------------------------

    @property
    @abc.abstractmethod
    def is_shared(self) -> bool:
        """True when other processes (workers) see what this store holds; only then does
        the engine send execution messages and keep leases. Set it as a class attribute."""

    @abc.abstractmethod
    def atomic(self) -> AbstractContextManager[Any]:
        """A transaction; nested calls join the outer one."""

    @abc.abstractmethod
    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the current transaction commits (at once outside one).
        An exception from ``callback`` is logged, not raised: the run is committed, and the
        tick sends its message again."""

    @abc.abstractmethod
    def create_run(self, run: NewRun) -> None:
        """Insert a pending run and its tags; raise if the run id exists."""

    @abc.abstractmethod
    def get_run(self, run_id: str) -> RunRecord | None:
        """The run with this id in any namespace, or ``None``."""

    @abc.abstractmethod
    def list_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        workflow: str | None = None,
        namespace: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs matching every filter given, newest first (latest created first)."""

    @abc.abstractmethod
    def transition(
        self,
        run_id: str,
        from_statuses: Collection[str],
        status: str,
        *,
        owner: str | None = None,
        lease_expired_before: datetime | None = None,
        updated_before: datetime | None = None,
        **fields: Any,
    ) -> bool:
        """Set ``status``, ``fields`` and ``updated_at`` if the run is in ``from_statuses``
        (and, when given, held by ``owner``, with a lease expired before
        ``lease_expired_before``, last updated before ``updated_before``); the tags'
        status copy changes with it, at once. Returns whether the run changed.

        One atomic conditional update: of two concurrent transitions from the same
        status, one succeeds.

        A **holder's check** (from running to running, by ``owner``, with no field:
        :func:`is_holders_check`) changes nothing, not even ``updated_at``: it says
        whether ``owner`` still holds the run, and inside a transaction keeps a concurrent
        cancel or hand-on out until it ends. A step's record is made under one."""

    @abc.abstractmethod
    def due_runs(self, now: datetime, pending_before: datetime, limit: int) -> list[RunRecord]:
        """Runs the tick must hand on: suspended or blocked ones due at ``now``, running ones
        whose lease expired before ``now``, pending ones untouched since ``pending_before``;
        at most ``limit``. Their ``tags`` may be left empty."""

    @abc.abstractmethod
    def get_steps(self, run_id: str) -> list[StepRecord]:
        """The run's recorded steps, by position."""

    @abc.abstractmethod
    def record_step(self, run_id: str, step: StepRecord, *, replace: bool = False) -> None:
        """Record one step's outcome; ``replace`` overwrites the record at that position
        (a step's next attempt). Recording a position twice without ``replace`` raises
        (a duplicate execution)."""

    @abc.abstractmethod
    def forget_failed_steps(self, run_id: str) -> None:
        """Delete the run's recorded step failures, so a retry executes them again."""

    @abc.abstractmethod
    def set_quota_tags(self, run_id: str, weights: Mapping[str, int]) -> None:
        """Replace the run's ``concurrency:`` tags with those of ``weights`` (``{tag:
        units}``; empty: none), each weighing its units; its other tags stay, and the new
        tags count with the run's current status."""

    @abc.abstractmethod
    def settle_units(self, run_id: str, tag: str, units: int) -> bool:
        """Make the run's tag ``tag`` weigh ``units`` (``0`` and up) in place of the weight it
        had, for every count read after it (a rate limit's window keeps the tag's
        creation time); the run's other tags stay as they are. Returns whether the run has
        that tag (``False``: nothing changed). A caller in a transaction that also
        changes the run locks the run first: transitions lock the run, then its tags."""

    @abc.abstractmethod
    def send_signal(self, token: str, payload: Any) -> None:
        """Keep ``payload`` for the first run that waits on ``token``."""

    @abc.abstractmethod
    def take_signal(self, run_id: str, token: str, step: StepRecord) -> tuple[bool, Any]:
        """Consume the oldest signal kept for ``token`` and record it as ``step`` (its
        payload as the result), in one transaction: a signal goes to one run only, and
        stays kept when the record fails. Returns ``(found, payload)``."""

    @abc.abstractmethod
    def has_signal(self, token: str) -> bool:
        """Whether a signal is kept for ``token``."""

    @abc.abstractmethod
    def runs_waiting_on_signal(self, token: str) -> list[RunRecord]:
        """Suspended runs whose ``wait`` is ``{"signal": token}``. Their ``tags`` may be
        left empty."""

    @abc.abstractmethod
    def delete_run(self, run_id: str) -> None:
        """Delete the run with its tags and recorded steps, whatever its status (nothing
        when it does not exist). Only :meth:`delete_runs` calls it, for runs it checked."""

    # composites: built from the primitives, overridable with a faster equivalent -------

    def quota_lock(self, key: str) -> AbstractContextManager[Any]:
        """A transaction that serialises the starts of quota ``key``: the lookup, the count
        and the insert that follow in it see every run committed before the lock was
        granted, and no other starter of the key gets in until it ends.

        The default is :meth:`atomic`, which serialises starts only as far as the store's
        transactions serialise each other: ``MemoryStore``'s one lock does; a database
        transaction at READ COMMITTED serialises nothing. A store shared by several
        starters overrides it."""
        return self.atomic()

    @contextmanager
    def quota_locks(self, keys: Collection[str]) -> Iterator[None]:
        """One transaction holding the lock of every key of ``keys`` (:meth:`quota_lock`),
        taken in one order, the keys' code point order (their UTF-8 byte order), so that
        two starters of overlapping keys never wait on each other in a cycle.

        The default nests :meth:`quota_lock` for each key in that order (nested
        transactions join the first one)."""
        with ExitStack() as stack:
            stack.enter_context(self.atomic())
            for key in sorted(set(keys)):
                stack.enter_context(self.quota_lock(key))
            yield

    def count_runs(
        self,
        *,
        tag: str | None = None,
        statuses: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        """How many runs match every filter given: the quota's count. The default counts a
        :meth:`list_runs` listing, which loads every matching run."""
        return len(self.list_runs(tag=tag, statuses=statuses, namespace=namespace))

    def quota_units(self, quotas: Sequence[Quota], namespace: str | None) -> list[int]:
        """The units each quota's key holds: the sum of the weights of the runs carrying
        its tag in its ``count_statuses`` (in ``namespace`` when given), one number per
        quota, in their order. A run weighs 1 on a tag unless its ``weights`` say more.
        The default reads a :meth:`list_runs` listing per quota."""
        return [
            sum(
                run.weights.get(quota.tag, 1)
                for run in self.list_runs(
                    tag=quota.tag, statuses=quota.count_statuses, namespace=namespace
                )
            )
            for quota in quotas
        ]

    def rate_units(
        self, quotas: Sequence[Quota], now: datetime, namespace: str | None
    ) -> list[int]:
        """The units each rate limit's key started in its window at ``now``: the sum of
        the weights of the runs carrying its tag created after
        :func:`~durable_django._rules.admission.window_start`, whatever their status (in
        ``namespace`` when given), one number per rate limit, in their order. The
        default sums :meth:`rate_window`."""
        return [
            sum(weight for _, weight in self.rate_window(quota, now, namespace)) for quota in quotas
        ]

    def rate_window(
        self, quota: Quota, now: datetime, namespace: str | None
    ) -> list[tuple[datetime, int]]:
        """The runs in rate limit ``quota``'s window at ``now`` (created after
        :func:`~durable_django._rules.admission.window_start`, any status, in ``namespace`` when
        given) as ``(created_at, weight)``, oldest first: what its exact ``retry_after``
        is read from. The default reads a :meth:`list_runs` listing."""
        since = window_start(quota, now)
        rows = [
            (run.created_at, run.weights.get(quota.tag, 1))
            for run in self.list_runs(tag=quota.tag, namespace=namespace)
            if run.created_at is not None and run.created_at > since
        ]
        return sorted(rows, key=lambda row: row[0])

    def existing_runs(self, run_ids: Collection[str]) -> dict[str, tuple[str, str]]:
        """The workflow and namespace of each run holding one of ``run_ids`` (ids no run
        holds are left out). The default reads them with :meth:`get_run`."""
        found = (self.get_run(run_id) for run_id in run_ids)
        return {run.run_id: (run.workflow, run.namespace) for run in found if run is not None}

    def start_run(
        self,
        run: NewRun,
        quotas: Quota | Sequence[Quota] | None,
        *,
        check_existing: bool,
        read_namespace: str | None,
        ticket: Ticket | None = None,
    ) -> StartOutcome:
        """Start ``run`` in one transaction holding the lock of every key of ``quotas``
        (one quota, a list of them with distinct keys, or none).

        The order is the contract: with ``check_existing``, an existing run with this id
        is returned and never refused (:func:`existing_outcome`); then each quota's key is
        counted in units (:meth:`quota_units`, in ``read_namespace`` when it is given) and
        :class:`~durable_django.ConcurrencyLimitError` raised for the first quota, in the
        order given, whose units and the run's weight would exceed its limit, creating
        nothing (a fair quota also counts the units held for kept tickets ahead of the
        start's ``ticket``: :func:`check_quotas`; the decision is
        :func:`durable_django._rules.admission.decide`); then the run is created, its quota tags
        weighing ``run.weights``.

        Without ``check_existing`` (the engine passes it for ids it generated) nothing is
        looked up before the quotas are counted: a start the quotas admit whose id turns
        out to be taken gets what ``check_existing`` would have given it, the existing
        run (:func:`existing_outcome`: ``created`` False, or the clash of ids raised),
        and creates nothing; one they refuse is refused."""
        quotas = quota_list(quotas)
        with quota_transaction(self, quotas):
            if check_existing:
                existing = self.get_run(run.run_id)
                if existing is not None:
                    return existing_outcome(
                        run, existing.workflow, existing.namespace, read_namespace
                    )
            decision = decide_quotas(self, quotas, read_namespace, ticket)
            if decision.refusal is not None:
                raise decision.refusal.error(run.workflow)
            if not check_existing:
                taken = self.get_run(run.run_id)
                if taken is not None:
                    return existing_outcome(run, taken.workflow, taken.namespace, read_namespace)
            decision.take(self)
            self.create_run(run)
        return StartOutcome(created=True, workflow=run.workflow, namespace=run.namespace)

    def start_runs(
        self, starts: Sequence[StartRequest], *, read_namespace: str | None
    ) -> list[StartOutcome | ConcurrencyLimitError]:
        """Start a batch in one transaction: for each of ``starts``, in order, what
        :meth:`start_run` does, its refusal returned in its place instead of raised.

        Returns one item per start: its :class:`StartOutcome`, or the
        :class:`~durable_django.ConcurrencyLimitError` of the first of its quotas that
        refused it (it created nothing). A later start sees what the earlier ones created:
        a run id given twice is created by the first and found by the second, as a
        second single start would find it (:func:`existing_outcome`: ``created`` False),
        and a key's units include the batch's earlier runs, with their weights. A run id
        held by another workflow or namespace (or created earlier in the batch in a
        namespace other than ``read_namespace``) raises
        :class:`~durable_django.DurableError` naming its index, and the batch creates
        nothing; so does one id given to starts of different workflows or namespaces
        (``ValueError``, :func:`check_batch_ids`).

        Every quota key of every start is locked first, before the first start, by one
        :meth:`quota_locks` (the keys' code point order, the order a single start under
        several quotas takes them in): two batches, or a batch and a single start, sharing
        keys take them in the same order and never wait on each other in a cycle. The
        locks are held until the transaction ends."""
        check_batch_ids(starts)
        keys = {quota.key for start in starts for quota in start.quotas}
        with self.quota_locks(keys):
            taken = self.existing_runs({start.run.run_id for start in starts})
            created: list[str] = []
            try:
                return [
                    self._start_in_batch(index, start, taken, created, read_namespace)
                    for index, start in enumerate(starts)
                ]
            except DurableError:
                # A clash of ids: what the batch created is undone, on a store whose
                # transactions do not roll back too.
                for run_id in created:
                    self.delete_run(run_id)
                raise

    def _start_in_batch(
        self,
        index: int,
        start: StartRequest,
        taken: dict[str, tuple[str, str]],
        created: list[str],
        read_namespace: str | None,
    ) -> StartOutcome | ConcurrencyLimitError:
        """Element ``index`` of :meth:`start_runs`: :meth:`start_run`'s steps, with the ids
        already ``taken`` (by earlier runs or earlier elements) in place of lookups."""
        run = start.run
        if start.check_existing and run.run_id in taken:
            with batch_index(index):
                return existing_outcome(run, *taken[run.run_id], read_namespace)
        decision = decide_quotas(self, start.quotas, read_namespace)
        if decision.refusal is not None:
            return decision.refusal.error(run.workflow)
        if run.run_id in taken:
            with batch_index(index):
                return existing_outcome(run, *taken[run.run_id], read_namespace)
        self.create_run(run)
        taken[run.run_id] = (run.workflow, run.namespace)
        created.append(run.run_id)
        return StartOutcome(True, run.workflow, run.namespace)

    def retry_run(
        self, run: RunRecord, quotas: Quota | Sequence[Quota] | None, *, read_namespace: str | None
    ) -> None:
        """A retry's part of the start path, in one transaction under the lock of every
        key of ``quotas``, as :meth:`start_run`'s: count each key's units
        (:class:`~durable_django.ConcurrencyLimitError` for the first quota over its limit,
        nothing changed), then, in place of the insert, make the failed ``run`` pending
        again as its next attempt, forget its failed steps and give it the quotas' tags,
        with their weights (or none). Raises :class:`~durable_django.DurableError` when
        the run is no longer failed."""
        quotas = quota_list(quotas)
        with quota_transaction(self, quotas):
            check_quotas(self, quotas, run.workflow, read_namespace)
            restarted = self.transition(
                run.run_id,
                ["failed"],
                "pending",
                attempt=run.attempt + 1,
                output=None,
                error=None,
                finished_at=None,
                wake_at=None,
                wait=None,
            )
            if not restarted:
                raise DurableError(f"run {run.run_id!r} changed while it was being retried")
            self.forget_failed_steps(run.run_id)
            self.set_quota_tags(run.run_id, {quota.tag: quota.weight for quota in quotas})

    def claim_run(self, run_id: str, **fields: Any) -> tuple[RunRecord, list[StepRecord]] | None:
        """A turn's claim: move a pending run to running with ``fields``, and return it and
        its recorded steps; ``None`` (nothing changed) when it was not pending."""
        with self.atomic():
            if not self.transition(run_id, ["pending"], "running", **fields):
                return None
            run = self.get_run(run_id)
            assert run is not None
            return run, self.get_steps(run_id)

    def record_held_step(
        self, run_id: str, step: StepRecord, owner: str, *, replace: bool = False
    ) -> bool:
        """Record ``step`` only while ``owner`` holds the running run, in one transaction;
        False, and nothing recorded, when it does not."""
        return self._record_held(run_id, owner, "running", step, replace=replace)

    def step_transaction(self) -> AbstractContextManager[Any]:
        """The transaction a transactional step's function and record share: ``atomic()``
        on the Django database :attr:`using`; none for a store kept elsewhere, which runs
        the function, then records it."""
        if self.using is None:
            return nullcontext()
        return db_transaction.atomic(using=self.using)

    def commit_held_step(self, run_id: str, step: StepRecord, owner: str) -> bool:
        """:meth:`record_held_step` for a transactional step, called last in the step's
        transaction (``atomic()`` on the store's database), which it may commit with the
        record. False, and nothing recorded, when ``owner`` no longer holds the run: the
        caller then rolls the transaction back. A store that can commit in the record's
        own round trip does (the ORM store on PostgreSQL); this one leaves the commit to
        the caller's ``atomic()``."""
        return self.record_held_step(run_id, step, owner)

    def end_turn(
        self, run_id: str, owner: str, status: str, step: StepRecord, **fields: Any
    ) -> bool:
        """The holder's transition ending a turn, ``transition(run_id, ["running"], status,
        owner=owner, **fields)``, and, when it happens, ``record_step(run_id, step)``, in
        one transaction: the turn's last step is recorded with its end."""
        return self._record_held(run_id, owner, status, step, **fields)

    def _record_held(
        self,
        run_id: str,
        owner: str,
        status: str,
        step: StepRecord,
        *,
        replace: bool = False,
        **fields: Any,
    ) -> bool:
        """The holder's transition from running to ``status`` (to running itself, one that
        only checks), then ``step``'s record, in one transaction."""
        with self.atomic():
            if not self.transition(run_id, ["running"], status, owner=owner, **fields):
                return False
            self.record_step(run_id, step, replace=replace)
            return True

    def quota_keys(
        self, statuses: Collection[str], namespace: str | None
    ) -> dict[str, dict[str, int]]:
        """``{key: {workflow: units}}`` for the quota keys holding runs in ``statuses`` (in
        ``namespace`` when it is given): the sum of the weights of those runs (their count,
        when each weighs 1). The default reads a :meth:`list_runs` listing."""
        return keys_of(self.list_runs(statuses=statuses, namespace=namespace), TAG_PREFIX)

    def rate_keys(self, since: datetime, namespace: str | None) -> dict[str, dict[str, int]]:
        """``{key: {workflow: units}}`` for the rate limit keys of the runs created after
        ``since`` (strictly), whatever their status (in ``namespace`` when it is given):
        the sum of their weights on each key's tag. The default reads a :meth:`list_runs`
        listing."""
        runs = self.list_runs(namespace=namespace)
        recent = [run for run in runs if run.created_at is not None and run.created_at > since]
        return keys_of(recent, RATE_TAG_PREFIX)

    def quota_holders(
        self, tag: str, statuses: Collection[str], namespace: str | None
    ) -> list[RunRecord]:
        """The runs carrying ``tag`` in ``statuses`` (in ``namespace`` when it is given),
        oldest first (earliest created first): the runs holding a quota key, with their
        weights. The default reads a :meth:`list_runs` listing."""
        runs = self.list_runs(tag=tag, statuses=statuses, namespace=namespace)[::-1]
        return sorted(runs, key=lambda run: (run.created_at is None, run.created_at))

    def finished_spans(
        self, tag: str, namespace: str | None, finished_since: datetime, limit: int
    ) -> list[tuple[datetime, datetime]]:
        """``(created_at, finished_at)`` of up to ``limit`` runs carrying ``tag`` (in
        ``namespace`` when it is given) that finished at or after ``finished_since``,
        latest finished first: how long a quota key's recent runs held their slot. The
        default reads a :meth:`list_runs` listing."""
        spans = [
            (run.created_at, run.finished_at)
            for run in self.list_runs(tag=tag, statuses=TERMINAL_STATUSES, namespace=namespace)
            if run.created_at is not None
            and run.finished_at is not None
            and run.finished_at >= finished_since
        ]
        spans.sort(key=lambda span: span[1], reverse=True)
        return spans[:limit]

    def delete_runs(self, run_ids: Collection[str]) -> list[str]:
        """Delete those of ``run_ids`` that have finished and whose whole ancestry has
        finished, with their tags and steps, in one transaction; return their ids. The
        others stay: active, or below an active run."""
        with self.atomic():
            batch = {
                run.run_id: run.parent_id
                for run in map(self.get_run, run_ids)
                if run is not None and run.status in TERMINAL_STATUSES
            }
            below_active = active_ancestors(batch, self._statuses_and_parents)
            deleted = [run_id for run_id in batch if run_id not in below_active]
            for run_id in deleted:
                self.delete_run(run_id)
            return deleted

    def _statuses_and_parents(self, run_ids: set[str]) -> dict[str, tuple[str, str | None]]:
        found = (self.get_run(run_id) for run_id in run_ids)
        return {run.run_id: (run.status, run.parent_id) for run in found if run is not None}

    def purge_runs(
        self,
        finished_before: datetime,
        statuses: Collection[str],
        namespace: str | None,
        limit: int,
        after: str | None = None,
    ) -> tuple[int, str | None]:
        """Delete, in one transaction, those of the next ``limit`` runs (by id, after
        ``after``) in ``statuses`` that finished before ``finished_before`` (in
        ``namespace`` when given) whose whole ancestry has finished, with their tags and
        steps (:meth:`delete_runs`). Returns how many it deleted and the id to go on after
        (``None``: no run left). The default reads a :meth:`list_runs` listing."""
        with self.atomic():
            batch = sorted(
                run.run_id
                for run in self.list_runs(statuses=statuses, namespace=namespace)
                if run.finished_at is not None
                and run.finished_at < finished_before
                and (after is None or run.run_id > after)
            )[:limit]
            deleted = self.delete_runs(batch)
        return len(deleted), batch[-1] if len(batch) == limit else None

    def purge_signals(self, taken_before: datetime, limit: int) -> int:
        """Delete up to ``limit`` signals taken by a run before ``taken_before``; signals
        still kept for a waiter stay. Returns how many it deleted.

        The default deletes nothing: a store may drop a signal when it is taken, and then
        has none to purge. A store that keeps taken signals (``OrmStore`` keeps them, with
        the run that took them) overrides it."""
        return 0

    # fair quotas' tickets ---------------------------------------------------------------
    #
    # A store that keeps tickets implements them all; the defaults refuse, so a fair
    # quota on a store without them fails with an error that says so.

    def ticket_line(self, key: str, namespace: str | None = None) -> list[KeptTicket]:
        """The tickets kept for quota ``key`` (in ``namespace``; every namespace when it
        is ``None``), live or not, in any order. Read inside the start's transaction,
        under the key's lock."""
        raise NotImplementedError(f"{type(self).__name__} keeps no tickets for fair quotas")

    def keep_ticket(self, ticket: KeptTicket, *, most: int) -> None:
        """Keep ``ticket`` (with its ``held_until``) unless its line (its key and
        namespace) already keeps ``most`` live tickets; or move the expiry of the one kept
        with its id to ``ticket.expires_at``. The key's tickets out of the line by then
        may be dropped. Called after the refused start's transaction, outside the key's
        lock: it must commit even when the caller's transaction is later rolled back,
        where the store can."""
        raise NotImplementedError(f"{type(self).__name__} keeps no tickets for fair quotas")

    def hold_tickets(self, key: str, namespace: str | None, until: datetime) -> None:
        """Bind the live tickets of ``key``'s line (in ``namespace``; every namespace when
        ``None``) that no hold binds yet to a hold running out at ``until``: a freed unit
        is held for them, and they leave the line together if it runs out unused.
        Written as :meth:`keep_ticket` is."""
        raise NotImplementedError(f"{type(self).__name__} keeps no tickets for fair quotas")

    def end_hold(self, key: str, namespace: str | None, now: datetime) -> None:
        """Unbind the tickets of ``key``'s line bound to a hold still running at ``now``:
        a kept ticket took the held unit. Called once that start's transaction commits
        (:meth:`on_commit`: a failure is logged, and the hold runs out as if unused)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no tickets for fair quotas")

    def purge_tickets(self, expired_before: datetime, limit: int) -> int:
        """Delete up to ``limit`` kept tickets out of their line (expired, or bound to a
        hold that ran out) before ``expired_before``; return how many. The default keeps
        none, so deletes none."""
        return 0

    def drop_ticket(self, ticket_id: str) -> None:
        """Forget the kept ticket ``ticket_id``: its start was admitted. Called inside the
        start's transaction."""
        raise NotImplementedError(f"{type(self).__name__} keeps no tickets for fair quotas")

    # operator overrides ---------------------------------------------------------------
    #
    # A store that keeps overrides implements the three writes and reads below; the
    # defaults keep none: setting one fails with an error that says so, and every start
    # finds none.

    def set_override(self, override: Override) -> None:
        """Store ``override`` for its key's tag and scope, in place of the one stored
        there (whatever its ``until``), committed when this returns (or, inside a
        transaction of the caller's, when that commits): the next start of the key, in
        any process, reads it."""
        raise NotImplementedError(f"{type(self).__name__} keeps no operator overrides")

    def clear_override(self, tag: str, scope: str) -> bool:
        """Delete the override of ``tag`` in ``scope``, committed as :meth:`set_override`
        is; whether one was stored (live or not)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no operator overrides")

    def list_overrides(self, scope: str | None, now: datetime) -> list[Override]:
        """The overrides in force at ``now`` (their ``until`` not reached) in ``scope``
        (every scope when ``None``), by tag. The default keeps none."""
        return []

    def override_limits(self, tags: Collection[str], scope: str, now: datetime) -> dict[str, int]:
        """``{tag: limit}`` for the overrides of ``tags`` in ``scope`` in force at ``now``:
        read inside a start's transaction, under its keys' locks. The default keeps
        none."""
        return {}

    # waiting for a slot ---------------------------------------------------------------

    def in_transaction(self) -> bool:
        """Whether the calling thread is inside a transaction of this store's (where a
        start may not wait for a slot: its locks are held, and it may not see releases).
        The default says no."""
        return False

    def waiting_in_transaction(self, keys: Collection[str]) -> str | None:
        """Asked inside a transaction of this store's, by a start that would wait for a
        slot of quota ``keys``: ``None`` when it may, each attempt in a savepoint
        (:meth:`atomic`) whose rollback releases what a refused attempt locked, and whose
        reads see the releases other transactions commit; else why it may not (for the
        error). The default: it may not."""
        return "this store keeps a refused start's locks until the transaction ends"

    def reconnect(self) -> None:
        """Drop this thread's connection to the store's database, which
        :meth:`connection_lost` said went away, so that the next operation opens a new
        one; never called inside a transaction. The default does nothing."""
        return None

    def release_listener(self, keys: Collection[str]) -> ReleaseListener | None:
        """A listener told when a slot of one of quota ``keys`` frees (a run leaves a
        counted status), already listening when returned; or ``None`` when the store
        cannot tell, and a waiting start polls. The default is ``None``."""
        return None

    async def arelease_listener(self, keys: Collection[str]) -> AsyncReleaseListener | None:
        """:meth:`release_listener` for async code. The default is ``None``."""
        return None

    # the store's environment ------------------------------------------------------------

    def connection_lost(self, error: BaseException) -> bool:
        """Whether ``error`` is the store's database going away (a restart, a failover, a
        network cut), not a refusal of one statement: the turn is then handed back rather
        than failed. The default says no: a store on a database overrides it."""
        return False

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        """System check messages about this store's configuration (``manage.py check``
        asks the default engine's store, with ``databases``, the aliases of
        ``--database``). The default has none."""
        return []


class ReleaseListener(abc.ABC):
    """Told when a slot of its keys frees: :meth:`wait` until then, :meth:`close` at the
    end (or use it as a context manager)."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a release; True if one came."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop listening and free what the listener holds."""

    def __enter__(self) -> ReleaseListener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncReleaseListener(abc.ABC):
    """:class:`ReleaseListener` for async code."""

    @abc.abstractmethod
    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a release, without blocking the loop."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop listening and free what the listener holds."""


#: The store contract's former name, when it was a ``Protocol``: an alias of
#: :class:`BaseStore`.
Store = BaseStore


def is_holders_check(
    from_statuses: Collection[str], status: str, owner: str | None, fields: dict[str, Any]
) -> bool:
    """Whether a transition is a holder's check (see :meth:`BaseStore.transition`)."""
    return owner is not None and not fields and set(from_statuses) == {status} == {"running"}


def keys_of(runs: Iterable[RunRecord], prefix: str) -> dict[str, dict[str, int]]:
    """``{key: {workflow: units}}`` of the tags of ``runs`` that start with ``prefix``
    (a run weighs 1 on a tag unless its ``weights`` say more)."""
    found: dict[str, dict[str, int]] = {}
    for run in runs:
        for tag in run.tags:
            if tag.startswith(prefix):
                by_workflow = found.setdefault(tag[len(prefix) :], {})
                units = run.weights.get(tag, 1)
                by_workflow[run.workflow] = by_workflow.get(run.workflow, 0) + units
    return found


def quota_list(quotas: Quota | Sequence[Quota] | None) -> tuple[Quota, ...]:
    """``quotas`` as a tuple: one quota, a list of them, or none."""
    if quotas is None:
        return ()
    if isinstance(quotas, Quota):
        return (quotas,)
    return tuple(quotas)


def quota_transaction(
    store: BaseStore, quotas: Quota | Sequence[Quota] | None
) -> AbstractContextManager[Any]:
    """A transaction that holds the lock of every key of ``quotas`` (just a transaction
    without a quota; :meth:`BaseStore.quota_lock` for one)."""
    quotas = quota_list(quotas)
    if not quotas:
        return store.atomic()
    if len(quotas) == 1:
        return store.quota_lock(quotas[0].key)
    return store.quota_locks([quota.key for quota in quotas])


@dataclass(frozen=True, slots=True)
class QuotaDecision:
    """What :func:`decide_quotas` read and decided for one start: the
    :class:`~durable_django._rules.admission.Refusal` (``None``: admitted), and, under fair
    quotas, each quota's line (``None`` for a quota that is not fair) and the time they
    were read at."""

    refusal: Refusal | None
    lines: tuple[Line | None, ...] = ()
    now: datetime | None = None
    read_namespace: str | None = None

    def take(self, store: BaseStore) -> None:
        """An admitted start's writes for its fair quotas: its kept ticket is dropped
        (:meth:`BaseStore.drop_ticket`), and the hold its line is bound to ends once the
        start commits (:meth:`end_hold_on_commit`)."""
        ticket_id = self.taken_ticket()
        if ticket_id is not None:
            store.drop_ticket(ticket_id)
            self.end_hold_on_commit(store)

    def taken_ticket(self) -> str | None:
        """The id of the kept ticket an admitted start takes the place of, if any."""
        taken = self._taken()
        return taken[0] if taken is not None else None

    def end_hold_on_commit(self, store: BaseStore) -> None:
        """End the hold the taken ticket's line is bound to once the start commits
        (:meth:`BaseStore.end_hold`, through :meth:`BaseStore.on_commit`): the line took a
        held slot."""
        taken = self._taken()
        if taken is not None and taken[1] and self.now is not None:
            store.on_commit(_hold_ender(store, taken[1], self.read_namespace, self.now))

    def _taken(self) -> tuple[str, str] | None:
        """The taken ticket's id, and its line's key when a hold binds that line."""
        if self.now is None:
            return None
        taken = None
        for line in self.lines:
            if line is not None and line.kept and line.ticket is not None:
                taken = (line.ticket.id, line.ticket.key if line.hold_ends is not None else "")
        return taken


def decide_quotas(
    store: BaseStore,
    quotas: Sequence[Quota],
    read_namespace: str | None,
    ticket: Ticket | None = None,
) -> QuotaDecision:
    """Read what the admission rule needs, under the keys' locks, and decide
    (:func:`decide_read`): the operators' overrides of the keys' limits
    (:meth:`BaseStore.override_limits`), each key's units (:meth:`BaseStore.quota_units`,
    :meth:`BaseStore.rate_units`) and, for a fair quota, its key's line
    (:meth:`BaseStore.ticket_line`). Writes nothing."""
    if not quotas:
        return QuotaDecision(None)
    now = timezone.now()  # read under the keys' locks, before the run's creation time
    quotas = in_force(
        quotas, store.override_limits([q.tag for q in quotas], scope_of(read_namespace), now)
    )
    if not any(quota.rate for quota in quotas):
        units = store.quota_units(quotas, read_namespace)
        return decide_read(
            quotas,
            units,
            lambda key: store.ticket_line(key, read_namespace),
            read_namespace,
            ticket,
        )
    units = read_units(store, quotas, now, read_namespace)
    decision = decide_read(
        quotas, units, lambda key: store.ticket_line(key, read_namespace), read_namespace, ticket
    )
    if decision.refusal is None:
        return decision
    refusal = timed_refusal(store, decision.refusal, now, read_namespace)
    return dataclasses.replace(decision, refusal=refusal)


def timed_refusal(
    store: BaseStore, refusal: Refusal, now: datetime, read_namespace: str | None
) -> Refusal:
    """A rate limit's refusal with its exact ``retry_after``, from its key's window at
    ``now`` (the time its units were counted at); any other refusal as it is."""
    if not refusal.quota.rate:
        return refusal
    window = store.rate_window(refusal.quota, now, read_namespace)
    return dataclasses.replace(refusal, retry_after=rate_retry_after(refusal.quota, window, now))


def read_units(
    store: BaseStore, quotas: Sequence[Quota], now: datetime, read_namespace: str | None
) -> list[int]:
    """Each quota's units, in their order: a concurrency quota's from
    :meth:`BaseStore.quota_units`, a rate limit's from :meth:`BaseStore.rate_units` in
    its window at ``now``; one read of each kind."""
    counted = [quota for quota in quotas if not quota.rate]
    rates = [quota for quota in quotas if quota.rate]
    by_kind = {
        False: iter(store.quota_units(counted, read_namespace) if counted else []),
        True: iter(store.rate_units(rates, now, read_namespace) if rates else []),
    }
    return [next(by_kind[quota.rate]) for quota in quotas]


def decide_read(
    quotas: Sequence[Quota],
    units: Sequence[int],
    line_of: Callable[[str], list[KeptTicket]],
    read_namespace: str | None,
    ticket: Ticket | None = None,
) -> QuotaDecision:
    """Decide from what was read (:func:`durable_django._rules.admission.decide`): each key's
    ``units`` and, for a fair quota, the start's place in its key's line of
    ``read_namespace``, read by ``line_of(key)``
    (:func:`durable_django._rules.tickets.place_in_line`: the live kept tickets ahead of the
    start's ``ticket``, all of them without one, hold their units)."""
    if not any(quota.fair for quota in quotas):
        return QuotaDecision(decide(quotas, units))
    now = timezone.now()
    lines = tuple(
        place_in_line(
            line_of(quota.key),
            ticket,
            quota.key,
            active=active,
            limit=quota.limit,
            weight=quota.weight,
            now=now,
        )
        if quota.fair
        else None
        for quota, active in zip(quotas, units, strict=True)
    )
    return QuotaDecision(decide(quotas, units, lines), lines, now, read_namespace)


def check_quotas(
    store: BaseStore,
    quotas: Sequence[Quota],
    workflow: str,
    read_namespace: str | None,
    ticket: Ticket | None = None,
) -> None:
    """Raise :class:`ConcurrencyLimitError` for the first of ``quotas`` whose key's units
    and the run's weight would exceed its limit (:func:`decide_quotas`); a fair quota's
    refusal carries ``held`` and the ``line`` it saw. When every quota admits, take the
    start's place (:meth:`QuotaDecision.take`)."""
    decision = decide_quotas(store, quotas, read_namespace, ticket)
    if decision.refusal is not None:
        raise decision.refusal.error(workflow)
    decision.take(store)


def _hold_ender(
    store: BaseStore, key: str, namespace: str | None, now: datetime
) -> Callable[[], None]:
    """:meth:`BaseStore.end_hold` as an on-commit callback: a failure (a deadlock among
    the line's writes) is logged, and the hold runs out as if unused."""

    def end_hold() -> None:
        try:
            store.end_hold(key, namespace, now)
        except Exception:
            logger.warning("could not end the hold on key %r", key, exc_info=True)

    return end_hold


def check_quota(store: BaseStore, quota: Quota, workflow: str, read_namespace: str | None) -> None:
    """:func:`check_quotas` for one quota."""
    check_quotas(store, (quota,), workflow, read_namespace)


def check_batch_ids(starts: Sequence[StartRequest]) -> None:
    """Refuse a batch giving one run id to starts of different workflows or namespaces
    (``ValueError`` naming the index). The same id given twice for the same workflow and
    namespace is allowed: the first start creates the run, the later ones find it."""
    first: dict[str, NewRun] = {}
    for index, start in enumerate(starts):
        run = first.setdefault(start.run.run_id, start.run)
        if (run.workflow, run.namespace) != (start.run.workflow, start.run.namespace):
            raise ValueError(
                f"inputs[{index}]: run id {run.run_id!r} is given to a start of workflow "
                f"{run.workflow!r} in namespace {run.namespace!r} earlier in the batch"
            )


class batch_index:
    """Name element ``index`` of a batch in the message of a ``DurableError``, ``TypeError``
    or ``ValueError`` raised inside (``"inputs[3]: ..."``); the error keeps its type.

    A class rather than a ``@contextmanager`` generator: a batch enters one per element,
    and this costs a fraction of a generator's setup."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: object, error: BaseException | None, traceback: object
    ) -> Literal[False]:
        if isinstance(error, DurableError | TypeError | ValueError):
            prefix = f"inputs[{self.index}]: "
            if (
                error.args
                and isinstance(error.args[0], str)
                and not error.args[0].startswith(prefix)
            ):
                error.args = (prefix + error.args[0], *error.args[1:])
        return False


def existing_outcome(
    run: NewRun, workflow: str, namespace: str, read_namespace: str | None
) -> StartOutcome:
    """Re-starting ``run.run_id``, already held by a run of ``workflow`` in ``namespace``.

    The same workflow in a namespace this engine may read gets that run back; anything
    else is a clash of ids, refused.
    """
    if read_namespace is not None and namespace != read_namespace:
        raise DurableError(f"run id {run.run_id!r} is taken by a run in namespace {namespace!r}")
    if workflow != run.workflow:
        raise DurableError(
            f"run id {run.run_id!r} is taken by a run of workflow {workflow!r}, "
            f"not {run.workflow!r}"
        )
    return StartOutcome(created=False, workflow=workflow, namespace=namespace)
