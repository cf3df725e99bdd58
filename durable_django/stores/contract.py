"""The store contract as a test suite: what every :class:`BaseStore` must do, call by call.

Subclass :class:`StoreContract` in a test module and give it a ``store`` fixture::

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self, db):
            return MyStore()

pytest then runs every ``test_*`` method of the suite against the store. Each test starts
from an empty store (a fresh one, or the test database, emptied between tests) and
calls the store directly, one call at a time. Expected failures are made inside
``store.atomic()``, so that on a database they roll back to a savepoint and leave the
test's transaction usable.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import pytest
from django.utils import timezone

from .._core.records import NewRun, RunRecord, StartOutcome, StepRecord
from .._rules.concurrency import DEFAULT_CONCURRENCY_STATUSES, Quota, quota_tag, rate_tag
from .._rules.overrides import Override
from .._rules.tickets import KeptTicket, issue
from ..errors import ConcurrencyLimitError, DurableError, RateLimitError
from ..status import TERMINAL_STATUSES, RunStatus
from .base import BaseStore, StartRequest

__all__ = ["StoreContract"]

SECOND = datetime.timedelta(seconds=1)
HOUR = datetime.timedelta(hours=1)

#: Texts that a comparison ignoring case, accents or trailing spaces would confuse.
CONFUSABLE = [("export:alice", "export:Alice"), ("k", "k "), ("e", "é")]


def fresh_ticket_key(store: BaseStore) -> str:
    """A quota key of its own for a test of tickets, which a store may write outside the
    test's transaction; the test is skipped on a store that keeps no tickets."""
    key = f"fair:{uuid.uuid4().hex[:12]}"
    try:
        store.ticket_line(key)
    except NotImplementedError:
        pytest.skip("the store keeps no tickets: fair quotas are not available on it")
    return key


def stores_overrides(store: BaseStore) -> None:
    """Skip a test of overrides on a store that keeps none (its starts find none)."""
    try:
        store.clear_override(quota_tag("nothing"), "")
    except NotImplementedError:
        pytest.skip("the store keeps no operator overrides")


def new_run(run_id: str, workflow: str = "wf", **fields: Any) -> NewRun:
    """A run to create: workflow ``wf`` version ``1`` in namespace ``default``."""
    fields.setdefault("namespace", "default")
    fields.setdefault("input", {"run": run_id})
    return NewRun(run_id=run_id, workflow=workflow, version="1", **fields)


def quota(
    key: str,
    limit: int,
    statuses: tuple[str, ...] = DEFAULT_CONCURRENCY_STATUSES,
    weight: int = 1,
) -> Quota:
    """A quota on ``key``."""
    return Quota(key=key, limit=limit, count_statuses=statuses, weight=weight)


def rate(key: str, limit: int, per: float = 60.0, weight: int = 1) -> Quota:
    """A rate limit on ``key``: ``limit`` units per ``per`` seconds."""
    return Quota(key=key, limit=limit, count_statuses=(), weight=weight, per=per)


def start(
    store: BaseStore,
    run: NewRun,
    under: Quota | list[Quota] | None = None,
    *,
    check_existing: bool = True,
    read_namespace: str | None = None,
) -> StartOutcome:
    """``store.start_run`` with the run carrying its quotas' tags and weights, as the
    engine makes it."""
    quotas = [] if under is None else [under] if isinstance(under, Quota) else under
    run = dataclasses.replace(
        run,
        tags=tuple(dict.fromkeys((*run.tags, *(q.tag for q in quotas)))),
        weights={q.tag: q.weight for q in quotas if q.weight != 1},
    )
    return store.start_run(
        run, quotas, check_existing=check_existing, read_namespace=read_namespace
    )


def batch(
    store: BaseStore,
    *starts: tuple[NewRun, Quota | list[Quota] | None],
    check_existing: bool = True,
    read_namespace: str | None = None,
) -> list[StartOutcome | ConcurrencyLimitError]:
    """``store.start_runs`` with each run carrying its quotas' tags and weights, as the
    engine makes it."""
    requests = []
    for run, under in starts:
        quotas = [] if under is None else [under] if isinstance(under, Quota) else under
        run = dataclasses.replace(
            run,
            tags=tuple(dict.fromkeys((*run.tags, *(q.tag for q in quotas)))),
            weights={q.tag: q.weight for q in quotas if q.weight != 1},
        )
        requests.append(StartRequest(run, quotas, check_existing))
    return store.start_runs(requests, read_namespace=read_namespace)


def refused_at(outcomes: list[StartOutcome | ConcurrencyLimitError]) -> list[int]:
    return [i for i, outcome in enumerate(outcomes) if isinstance(outcome, ConcurrencyLimitError)]


def make(
    store: BaseStore, run_id: str, status: str = RunStatus.PENDING, **fields: Any
) -> RunRecord:
    """Create a run and move it to ``status`` with ``fields``; return it as read."""
    tags = fields.pop("tags", ())
    namespace = fields.pop("namespace", "default")
    workflow = fields.pop("workflow", "wf")
    parent_id = fields.pop("parent_id", None)
    store.create_run(
        new_run(run_id, workflow, tags=tuple(tags), namespace=namespace, parent_id=parent_id)
    )
    if status != RunStatus.PENDING or fields:
        assert store.transition(run_id, [RunStatus.PENDING], status, **fields)
    return read(store, run_id)


def read(store: BaseStore, run_id: str) -> RunRecord:
    """The run, which must exist."""
    run = store.get_run(run_id)
    assert run is not None, f"run {run_id!r} not found"
    return run


def ids(runs: list[RunRecord]) -> list[str]:
    return [run.run_id for run in runs]


def finished(store: BaseStore, run_id: str, ago: datetime.timedelta, **fields: Any) -> None:
    """A completed run that finished ``ago``."""
    make(store, run_id, RunStatus.COMPLETED, finished_at=timezone.now() - ago, **fields)


class StoreContract:
    """The contract suite: subclass it in a test module and provide a ``store`` fixture
    returning an empty store (see the module docstring). Every test takes only that
    fixture."""

    # creating and reading runs ------------------------------------------------------

    def test_a_created_run_is_pending_with_what_it_was_given(self, store: BaseStore) -> None:
        before = timezone.now()
        store.create_run(
            NewRun(
                run_id="run-1",
                workflow="chat.turn",
                version="3",
                namespace="blue",
                input={"message": "héllo", "n": [1, 2.5, None, True]},
                tags=("vip", "concurrency:tenant:acme"),
                queue="turns",
                parent_id="parent",
                attempt=2,
            )
        )
        run = read(store, "run-1")
        assert isinstance(run, RunRecord)
        assert (run.workflow, run.version, run.namespace, run.status) == (
            "chat.turn",
            "3",
            "blue",
            RunStatus.PENDING,
        )
        assert run.input == {"message": "héllo", "n": [1, 2.5, None, True]}
        assert run.tags == ["concurrency:tenant:acme", "vip"]
        assert (run.queue, run.parent_id, run.attempt) == ("turns", "parent", 2)
        assert (run.output, run.error, run.wait, run.blocked_reason) == (None, None, None, "")
        assert (run.started_at, run.finished_at, run.wake_at) == (None, None, None)
        assert (run.lease_owner, run.lease_expires_at) == ("", None)
        assert run.created_at is not None and run.created_at >= before - SECOND
        assert run.updated_at is not None and run.updated_at >= run.created_at

    def test_an_unknown_run_is_none(self, store: BaseStore) -> None:
        assert store.get_run("no-such-run") is None
        assert store.get_steps("no-such-run") == []

    def test_a_run_id_is_created_once(self, store: BaseStore) -> None:
        store.create_run(new_run("run-1", input={"first": True}))
        with pytest.raises(Exception), store.atomic():  # noqa: B017 (any error refuses it)
            store.create_run(new_run("run-1", input={"second": True}))
        assert read(store, "run-1").input == {"first": True}
        assert len(store.list_runs()) == 1

    def test_list_runs_filters_on_every_filter_given_newest_first(self, store: BaseStore) -> None:
        make(store, "run-1", tags=["a"], workflow="x")
        make(store, "run-2", RunStatus.RUNNING, tags=["a", "b"], workflow="y")
        make(store, "run-3", tags=["b"], workflow="x", namespace="blue")
        make(store, "run-4", RunStatus.COMPLETED, workflow="x")
        assert ids(store.list_runs()) == ["run-4", "run-3", "run-2", "run-1"]
        assert ids(store.list_runs(limit=2)) == ["run-4", "run-3"]
        assert ids(store.list_runs(tag="a")) == ["run-2", "run-1"]
        assert ids(store.list_runs(tag="b", workflow="x")) == ["run-3"]
        assert ids(store.list_runs(statuses=["pending"])) == ["run-3", "run-1"]
        assert ids(store.list_runs(statuses=["running", "completed"])) == ["run-4", "run-2"]
        assert ids(store.list_runs(namespace="blue")) == ["run-3"]
        assert ids(store.list_runs(tag="a", statuses=["pending"], namespace="default")) == ["run-1"]
        assert store.list_runs(tag="c") == []
        assert store.list_runs(statuses=[]) == []

    def test_ids_names_tags_and_namespaces_compare_exactly(self, store: BaseStore) -> None:
        for first, second in CONFUSABLE:
            for text in (first, second):
                make(store, f"id:{text}", tags=[f"tag:{text}"], workflow=f"wf:{text}")
                make(store, f"ns:{text}", namespace=f"ns:{text}")
            for text in (first, second):
                assert read(store, f"id:{text}").run_id == f"id:{text}"
                assert ids(store.list_runs(tag=f"tag:{text}")) == [f"id:{text}"]
                assert ids(store.list_runs(workflow=f"wf:{text}")) == [f"id:{text}"]
                assert ids(store.list_runs(namespace=f"ns:{text}")) == [f"ns:{text}"]
                assert store.count_runs(tag=f"tag:{text}") == 1
                assert store.count_runs(namespace=f"ns:{text}") == 1

    # counting -----------------------------------------------------------------------

    def test_count_runs_counts_what_list_runs_lists(self, store: BaseStore) -> None:
        make(store, "run-1", tags=["a"])
        make(store, "run-2", RunStatus.RUNNING, tags=["a", "b"])
        make(store, "run-3", RunStatus.SUSPENDED, tags=["a"], namespace="blue")
        make(store, "run-4", RunStatus.COMPLETED, tags=["a"])
        filters: list[dict[str, Any]] = [
            {},
            {"tag": "a"},
            {"tag": "b"},
            {"tag": "none"},
            {"statuses": ["pending"]},
            {"statuses": list(DEFAULT_CONCURRENCY_STATUSES)},
            {"statuses": list(TERMINAL_STATUSES)},
            {"tag": "a", "statuses": ["pending", "running"]},
            {"tag": "a", "namespace": "blue"},
            {"tag": "a", "statuses": ["suspended"], "namespace": "default"},
            {"namespace": "default"},
        ]
        for given in filters:
            assert store.count_runs(**given) == len(store.list_runs(**given)), given
        assert store.count_runs(tag="a") == 4
        assert store.count_runs(tag="a", statuses=list(DEFAULT_CONCURRENCY_STATUSES)) == 3

    def test_the_count_follows_every_transition(self, store: BaseStore) -> None:
        tag = quota_tag("k")
        make(store, "run-1", tags=[tag])
        for status in (*DEFAULT_CONCURRENCY_STATUSES, *TERMINAL_STATUSES):
            store.transition("run-1", list(RunStatus.values), status)
            assert store.count_runs(tag=tag, statuses=[status]) == 1, status
            others = [s for s in RunStatus.values if s != status]
            assert store.count_runs(tag=tag, statuses=others) == 0, status

    # transitions --------------------------------------------------------------------

    def test_a_transition_happens_only_from_the_statuses_given(self, store: BaseStore) -> None:
        make(store, "run-1")
        assert not store.transition("run-1", [RunStatus.RUNNING], RunStatus.COMPLETED)
        assert not store.transition("run-1", [], RunStatus.COMPLETED)
        assert read(store, "run-1").status == RunStatus.PENDING
        assert store.transition("run-1", [RunStatus.PENDING], RunStatus.RUNNING)
        assert read(store, "run-1").status == RunStatus.RUNNING
        # Of two transitions from the same status, the second finds it changed.
        assert not store.transition("run-1", [RunStatus.PENDING], RunStatus.RUNNING)
        assert not store.transition("no-such-run", RunStatus.values, RunStatus.RUNNING)

    def test_a_transition_sets_its_fields_and_the_time_of_the_change(
        self, store: BaseStore
    ) -> None:
        created = make(store, "run-1")
        now = timezone.now()
        fields: dict[str, Any] = {
            "output": {"reply": "done", "tokens": [1, 2]},
            "error": {"type": "x.Error", "message": "m"},
            "wait": {"signal": "token"},
            "wake_at": now + HOUR,
            "finished_at": now,
            "started_at": now - SECOND,
            "blocked_reason": "version 1 is not here",
            "lease_owner": "worker-1",
            "lease_expires_at": now + HOUR,
            "attempt": 3,
        }
        assert store.transition("run-1", [RunStatus.PENDING], RunStatus.SUSPENDED, **fields)
        run = read(store, "run-1")
        assert run.status == RunStatus.SUSPENDED
        assert {name: getattr(run, name) for name in fields} == fields
        assert created.updated_at is not None and run.updated_at is not None
        assert run.updated_at >= created.updated_at
        assert (run.input, run.created_at) == (created.input, created.created_at)

    def test_a_transition_checks_the_holder(self, store: BaseStore) -> None:
        make(store, "run-1", RunStatus.RUNNING, lease_owner="worker-1")
        assert not store.transition(
            "run-1", [RunStatus.RUNNING], RunStatus.COMPLETED, owner="worker-2"
        )
        assert read(store, "run-1").status == RunStatus.RUNNING
        assert store.transition("run-1", [RunStatus.RUNNING], RunStatus.COMPLETED, owner="worker-1")

    def test_a_holders_check_changes_nothing(self, store: BaseStore) -> None:
        # From running to running, by its holder, with no field: it only says whether the
        # owner holds the run, and leaves the run as it was, ``updated_at`` included.
        before = make(store, "run-1", RunStatus.RUNNING, lease_owner="w")
        assert store.transition("run-1", [RunStatus.RUNNING], RunStatus.RUNNING, owner="w")
        assert not store.transition("run-1", [RunStatus.RUNNING], RunStatus.RUNNING, owner="v")
        assert read(store, "run-1") == before

    def test_a_transition_checks_the_lease_and_the_last_change(self, store: BaseStore) -> None:
        now = timezone.now()
        make(store, "held", RunStatus.RUNNING, lease_owner="w", lease_expires_at=now)
        make(store, "free", RunStatus.RUNNING)  # no lease at all
        running = [RunStatus.RUNNING]
        assert not store.transition("held", running, "pending", lease_expired_before=now - SECOND)
        assert not store.transition("held", running, "pending", lease_expired_before=now)
        assert not store.transition("free", running, "pending", lease_expired_before=now + HOUR)
        assert store.transition("held", running, "pending", lease_expired_before=now + SECOND)

        changed = read(store, "free").updated_at
        assert changed is not None
        assert not store.transition("free", running, "pending", updated_before=changed)
        assert store.transition("free", running, "pending", updated_before=changed + HOUR)

    def test_due_runs_are_those_the_tick_hands_on(self, store: BaseStore) -> None:
        now = timezone.now()
        make(store, "woken", RunStatus.SUSPENDED, wake_at=now - SECOND)
        make(store, "woken-now", RunStatus.SUSPENDED, wake_at=now)
        make(store, "asleep", RunStatus.SUSPENDED, wake_at=now + HOUR)
        make(store, "waiting", RunStatus.SUSPENDED)
        make(store, "unblocked", RunStatus.BLOCKED, wake_at=now - SECOND)
        make(store, "lapsed", RunStatus.RUNNING, lease_owner="w", lease_expires_at=now - SECOND)
        make(store, "held", RunStatus.RUNNING, lease_owner="w", lease_expires_at=now + HOUR)
        make(store, "pending")
        make(store, "done", RunStatus.COMPLETED, wake_at=now - SECOND)
        expected = {"woken", "woken-now", "unblocked", "lapsed"}
        assert set(ids(store.due_runs(now, now - HOUR, 100))) == expected
        assert set(ids(store.due_runs(now, now + HOUR, 100))) == expected | {"pending"}
        assert len(store.due_runs(now, now + HOUR, 2)) == 2

    # steps --------------------------------------------------------------------------

    def test_steps_are_read_back_by_position(self, store: BaseStore) -> None:
        make(store, "run-1")
        make(store, "run-2")
        steps = [
            StepRecord(2, "third", error={"type": "x.Error", "message": "failed"}),
            StepRecord(0, "first", result={"value": [1, "é", None]}),
            StepRecord(1, "second", result=None),
        ]
        for step in steps:
            store.record_step("run-1", step)
        store.record_step("run-2", StepRecord(0, "other", result=1))
        assert store.get_steps("run-1") == sorted(steps, key=lambda step: step.position)
        assert store.get_steps("run-2") == [StepRecord(0, "other", result=1)]

    def test_a_position_is_recorded_once_unless_replaced(self, store: BaseStore) -> None:
        make(store, "run-1")
        failed = StepRecord(0, "call", error={"type": "x.Error", "message": "first attempt"})
        store.record_step("run-1", failed)
        with pytest.raises(Exception), store.atomic():  # noqa: B017 (a duplicate execution)
            store.record_step("run-1", StepRecord(0, "call", result="again"))
        assert store.get_steps("run-1") == [failed]
        store.record_step("run-1", StepRecord(0, "call", result="retried"), replace=True)
        assert store.get_steps("run-1") == [StepRecord(0, "call", result="retried")]

    def test_forgetting_failed_steps_keeps_the_others(self, store: BaseStore) -> None:
        make(store, "run-1")
        make(store, "run-2")
        kept = StepRecord(0, "ok", result="fine")
        store.record_step("run-1", kept)
        store.record_step("run-1", StepRecord(1, "bad", error={"type": "E", "message": "m"}))
        store.record_step("run-2", StepRecord(0, "bad", error={"type": "E", "message": "m"}))
        store.forget_failed_steps("run-1")
        assert store.get_steps("run-1") == [kept]
        assert len(store.get_steps("run-2")) == 1

    # the quota tag ------------------------------------------------------------------

    def test_set_quota_tags_replaces_the_quota_tags_only(self, store: BaseStore) -> None:
        make(store, "run-1", RunStatus.RUNNING, tags=["user", "CONCURRENCY:x", quota_tag("a")])
        store.set_quota_tags("run-1", {quota_tag("b"): 1})
        assert read(store, "run-1").tags == sorted(["user", "CONCURRENCY:x", quota_tag("b")])
        assert store.count_runs(tag=quota_tag("a")) == 0
        # The new tag counts with the run's status.
        assert store.count_runs(tag=quota_tag("b"), statuses=[RunStatus.RUNNING]) == 1
        assert store.count_runs(tag=quota_tag("b"), statuses=[RunStatus.PENDING]) == 0
        store.set_quota_tags("run-1", {quota_tag("b"): 1})  # the same tag again: unchanged
        assert store.count_runs(tag=quota_tag("b"), statuses=[RunStatus.RUNNING]) == 1
        # Several tags, with their weights; a kept tag takes its new weight.
        store.set_quota_tags("run-1", {quota_tag("b"): 3, quota_tag("c"): 2})
        run = read(store, "run-1")
        assert run.tags == sorted(["user", "CONCURRENCY:x", quota_tag("b"), quota_tag("c")])
        assert run.weights == {quota_tag("b"): 3, quota_tag("c"): 2}
        running = (RunStatus.RUNNING,)
        assert store.quota_units([quota("b", 9, running), quota("c", 9, running)], None) == [3, 2]
        store.set_quota_tags("run-1", {})
        assert read(store, "run-1").tags == ["CONCURRENCY:x", "user"]
        assert read(store, "run-1").weights == {}
        assert store.count_runs(tag=quota_tag("b")) == 0

    def test_set_quota_tags_keeps_the_weights_of_the_other_tags(self, store: BaseStore) -> None:
        start(store, new_run("run-1"), [quota("a", 9, weight=2), rate("tokens", 9, weight=4)])
        store.set_quota_tags("run-1", {quota_tag("b"): 3})
        run = read(store, "run-1")
        assert run.weights == {quota_tag("b"): 3, rate_tag("tokens"): 4}
        assert store.rate_units([rate("tokens", 9)], timezone.now(), None) == [4]
        # A tag of the run named in ``weights`` takes the weight given there, 1 included.
        store.set_quota_tags("run-1", {quota_tag("b"): 3, rate_tag("tokens"): 1})
        assert read(store, "run-1").weights == {quota_tag("b"): 3}
        assert read(store, "run-1").tags.count(rate_tag("tokens")) == 1

    def test_a_rate_tag_set_later_counts_from_the_runs_creation(self, store: BaseStore) -> None:
        # A retry under a rate limit the run did not start under: its tag counts in the
        # window from the run's creation time, as if the run had started under it.
        start(store, new_run("run-1"))
        store.set_quota_tags("run-1", {rate_tag("later"): 2})
        created = read(store, "run-1").created_at
        assert created is not None
        assert store.rate_units([rate("later", 9)], timezone.now(), None) == [2]
        assert store.rate_window(rate("later", 9), timezone.now(), None) == [(created, 2)]

    # signals ------------------------------------------------------------------------

    def test_signals_are_kept_until_taken_oldest_first(self, store: BaseStore) -> None:
        make(store, "run-1")
        assert not store.has_signal("token")
        store.send_signal("token", {"n": 1})
        store.send_signal("token", [2])
        store.send_signal("other", "not this one")
        assert store.has_signal("token")
        assert store.take_signal("run-1", "token", StepRecord(0, "signal")) == (True, {"n": 1})
        assert store.take_signal("run-1", "token", StepRecord(1, "signal")) == (True, [2])
        assert store.take_signal("run-1", "token", StepRecord(2, "signal")) == (False, None)
        assert not store.has_signal("token")
        assert store.has_signal("other")
        # Each taken signal is recorded as its step, the payload as the result.
        assert store.get_steps("run-1") == [
            StepRecord(0, "signal", result={"n": 1}),
            StepRecord(1, "signal", result=[2]),
        ]

    def test_a_signal_whose_record_fails_stays_kept(self, store: BaseStore) -> None:
        make(store, "run-1")
        store.record_step("run-1", StepRecord(0, "taken"))
        store.send_signal("token", "payload")
        with pytest.raises(Exception), store.atomic():  # noqa: B017 (position 0 is taken)
            store.take_signal("run-1", "token", StepRecord(0, "signal"))
        assert store.has_signal("token")
        assert store.take_signal("run-1", "token", StepRecord(1, "signal")) == (True, "payload")

    def test_signal_tokens_compare_exactly(self, store: BaseStore) -> None:
        for first, second in CONFUSABLE:
            make(store, f"waits:{second}", RunStatus.SUSPENDED, wait={"signal": second})
            store.send_signal(first, first)
            assert not store.has_signal(second)
            assert store.runs_waiting_on_signal(first) == []
            assert ids(store.runs_waiting_on_signal(second)) == [f"waits:{second}"]
            assert store.take_signal(f"waits:{second}", second, StepRecord(0, "s")) == (
                False,
                None,
            )

    def test_the_runs_waiting_on_a_signal_are_the_suspended_ones(self, store: BaseStore) -> None:
        make(store, "waiting", RunStatus.SUSPENDED, wait={"signal": "token"})
        make(store, "woken", RunStatus.PENDING, wait={"signal": "token"})
        make(store, "timer", RunStatus.SUSPENDED, wait={"timer": "token"})
        make(store, "elsewhere", RunStatus.SUSPENDED, wait={"signal": "other"})
        assert ids(store.runs_waiting_on_signal("token")) == ["waiting"]

    # starting (start_run, quota_lock, count_runs) ---------------------------------------

    def test_a_start_creates_the_run(self, store: BaseStore) -> None:
        outcome = start(store, new_run("run-1", "chat.turn", namespace="blue"), quota("k", 1))
        assert outcome == StartOutcome(created=True, workflow="chat.turn", namespace="blue")
        run = read(store, "run-1")
        assert (run.status, run.tags) == (RunStatus.PENDING, [quota_tag("k")])
        assert start(store, new_run("run-2"), None) == StartOutcome(True, "wf", "default")

    def test_a_start_over_the_limit_is_refused_and_creates_nothing(self, store: BaseStore) -> None:
        limit_two = quota("tenant:acme", 2)
        start(store, new_run("run-1"), limit_two)
        start(store, new_run("run-2", "other.workflow"), limit_two)  # the key spans workflows
        with pytest.raises(ConcurrencyLimitError) as refused:
            start(store, new_run("run-3"), limit_two)
        error = refused.value
        assert (error.workflow, error.key, error.limit, error.active) == (
            "wf",
            "tenant:acme",
            2,
            2,
        )
        assert store.get_run("run-3") is None
        assert store.count_runs(tag=limit_two.tag) == 2
        # Another key has slots of its own.
        assert start(store, new_run("run-4"), quota("tenant:globex", 2)).created
        with pytest.raises(ConcurrencyLimitError) as closed:
            start(store, new_run("run-5"), quota("closed", 0))
        assert (closed.value.limit, closed.value.active) == (0, 0)
        assert store.get_run("run-5") is None

    # rate limits -------------------------------------------------------------------

    def test_a_rate_limit_counts_the_units_started_in_its_window(self, store: BaseStore) -> None:
        per_minute = rate("tokens:acme", 10, weight=4)
        start(store, new_run("run-1"), per_minute)
        start(store, new_run("run-2", "other.workflow"), per_minute)  # the key spans workflows
        store.transition("run-1", RunStatus.values, RunStatus.COMPLETED)  # still counted
        with pytest.raises(RateLimitError) as refused:
            start(store, new_run("run-3"), per_minute)
        error = refused.value
        assert (error.key, error.limit, error.active, error.per) == ("tokens:acme", 10, 8, 60.0)
        assert store.get_run("run-3") is None
        created = [read(store, run_id).created_at for run_id in ("run-1", "run-2")]
        # run-1 leaving the window makes room: exactly when it is a minute old.
        assert created[0] is not None
        now = timezone.now()
        assert 0 < error.retry_after <= 60.0
        assert abs(error.retry_after - (created[0] + 60 * SECOND - now).total_seconds()) < 5
        assert store.rate_units([per_minute], now, None) == [8]
        assert store.rate_units([per_minute], now + 120 * SECOND, None) == [0]
        window = store.rate_window(per_minute, now, None)
        assert [weight for _, weight in window] == [4, 4]
        assert [at for at, _ in window] == sorted(created)  # type: ignore[type-var]
        # A concurrency quota of the same key is a quota of its own.
        assert start(store, new_run("run-4"), quota("tokens:acme", 1)).created

    def test_settled_units_replace_the_weight_in_the_window(self, store: BaseStore) -> None:
        per_minute = rate("tokens:acme", 10, weight=6)
        start(store, new_run("run-1", tags=("user",)), [per_minute, rate("other", 10, weight=3)])
        with pytest.raises(RateLimitError):
            start(store, new_run("run-2"), per_minute)
        created = read(store, "run-1").created_at
        assert store.settle_units("run-1", per_minute.tag, 2)
        now = timezone.now()
        assert store.rate_units([per_minute, rate("other", 1)], now, None) == [2, 3]
        assert store.rate_window(per_minute, now, None) == [(created, 2)]
        assert read(store, "run-1").weights == {per_minute.tag: 2, "rate:other": 3}
        assert start(store, new_run("run-2"), per_minute).created  # 2 + 6 fit in 10
        # Settling the units it already weighs still finds the tag; 0 frees them all.
        assert store.settle_units("run-1", per_minute.tag, 2)
        assert store.settle_units("run-1", per_minute.tag, 0)
        assert store.rate_units([per_minute], timezone.now(), None) == [6]
        # More than reserved, even past the limit: the window holds what was used.
        assert store.settle_units("run-2", per_minute.tag, 12)
        assert store.rate_units([per_minute], timezone.now(), None) == [12]
        assert store.settle_units("run-2", per_minute.tag, 1)
        assert read(store, "run-2").weights == {}
        assert read(store, "run-1").tags == sorted(["user", per_minute.tag, "rate:other"])
        # A tag the run does not have, or a run that does not exist: nothing changes.
        assert not store.settle_units("run-1", rate_tag("tokens:globex"), 1)
        assert not store.settle_units("no-such-run", per_minute.tag, 1)
        assert store.rate_units([per_minute], timezone.now(), None) == [1]

    def test_rate_keys_group_the_units_created_after_since(self, store: BaseStore) -> None:
        start(store, new_run("run-1"), [rate("tokens", 10, weight=4), quota("tokens", 5)])
        start(store, new_run("run-2", "other.workflow"), rate("tokens", 10, weight=3))
        start(store, new_run("run-3", namespace="blue"), rate("mail", 10))
        store.transition("run-2", RunStatus.values, RunStatus.FAILED)  # still counted
        created = read(store, "run-1").created_at
        assert created is not None
        before = created - SECOND
        assert store.rate_keys(before, None) == {
            "tokens": {"wf": 4, "other.workflow": 3},
            "mail": {"wf": 1},
        }
        assert store.rate_keys(before, "blue") == {"mail": {"wf": 1}}
        times = [read(store, run_id).created_at for run_id in ("run-1", "run-2", "run-3")]
        last = max(at for at in times if at is not None)
        assert store.rate_keys(last, None) == {}  # created after since, strictly

    def test_a_rate_limit_and_a_quota_admit_all_or_nothing(self, store: BaseStore) -> None:
        slot, window = quota("k", 1), rate("k", 1)
        start(store, new_run("run-1"), [slot, window])
        store.transition("run-1", RunStatus.values, RunStatus.COMPLETED)  # the slot frees
        with pytest.raises(RateLimitError):
            start(store, new_run("run-2"), [slot, window])
        with pytest.raises(ConcurrencyLimitError):
            start(store, new_run("run-3"), [quota("full", 0), rate("other", 1)])
        assert store.get_run("run-2") is None and store.get_run("run-3") is None
        assert store.rate_units([rate("other", 1)], timezone.now(), None) == [0]

    def test_a_rate_limit_in_a_batch_counts_the_earlier_starts(self, store: BaseStore) -> None:
        window = rate("k", 2)
        outcomes = batch(store, *[(new_run(f"run-{n}"), window) for n in range(3)])
        assert [isinstance(outcome, RateLimitError) for outcome in outcomes] == [
            False,
            False,
            True,
        ]

    def test_a_rate_limit_counts_every_namespace_unless_reads_are_fenced(
        self, store: BaseStore
    ) -> None:
        window = rate("k", 1)
        start(store, new_run("run-1", namespace="blue"), window)
        with pytest.raises(RateLimitError):
            start(store, new_run("run-2", namespace="green"), window)
        assert start(store, new_run("run-3", namespace="green"), window, read_namespace="green")

    def test_only_the_quotas_statuses_hold_a_slot(self, store: BaseStore) -> None:
        pending_only = quota("k", 1, (RunStatus.PENDING,))
        start(store, new_run("run-1"), pending_only)
        with pytest.raises(ConcurrencyLimitError):
            start(store, new_run("run-2"), pending_only)
        store.transition("run-1", [RunStatus.PENDING], RunStatus.SUSPENDED)
        assert start(store, new_run("run-2"), pending_only).created
        # Under the default statuses, the suspended run holds its slot.
        with pytest.raises(ConcurrencyLimitError) as refused:
            start(store, new_run("run-3"), quota("k", 2))
        assert refused.value.active == 2
        for run_id in ("run-1", "run-2"):
            store.transition(run_id, RunStatus.values, RunStatus.COMPLETED)
        assert start(store, new_run("run-3"), quota("k", 1)).created

    def test_a_status_named_twice_counts_once(self, store: BaseStore) -> None:
        twice = quota("k", 2, (RunStatus.RUNNING, RunStatus.PENDING, RunStatus.RUNNING))
        start(store, new_run("run-1"), twice)
        store.transition("run-1", [RunStatus.PENDING], RunStatus.RUNNING)
        assert start(store, new_run("run-2"), twice).created
        assert refused_at(batch(store, (new_run("run-3"), twice))) == [0]
        assert store.quota_units([twice], None) == [2]

    def test_an_existing_run_is_returned_before_the_quota_is_counted(
        self, store: BaseStore
    ) -> None:
        full = quota("k", 1)
        start(store, new_run("order:1", input={"n": 1}), full)
        again = start(store, new_run("order:1", input={"n": 2}), full)
        assert again == StartOutcome(created=False, workflow="wf", namespace="default")
        assert read(store, "order:1").input == {"n": 1}
        store.transition("order:1", RunStatus.values, RunStatus.COMPLETED)
        assert not start(store, new_run("order:1"), full).created

    def test_a_run_id_held_by_another_workflow_or_namespace_is_refused(
        self, store: BaseStore
    ) -> None:
        start(store, new_run("shared", "a", namespace="blue"))
        with pytest.raises(DurableError, match="taken by a run of workflow 'a'"):
            start(store, new_run("shared", "b", namespace="blue"))
        with pytest.raises(DurableError, match="namespace 'blue'"):
            start(store, new_run("shared", "a", namespace="green"), read_namespace="green")
        assert start(store, new_run("shared", "a"), read_namespace="blue") == StartOutcome(
            False, "a", "blue"
        )
        assert len(store.list_runs()) == 1

    def test_the_quota_counts_every_namespace_unless_reads_are_fenced(
        self, store: BaseStore
    ) -> None:
        shared = quota("shared", 2)
        start(store, new_run("blue-1", namespace="blue"), shared)
        start(store, new_run("green-1", namespace="green"), shared)
        with pytest.raises(ConcurrencyLimitError):
            start(store, new_run("blue-2", namespace="blue"), shared)
        # Fenced to its namespace, blue counts only its own run.
        assert start(
            store, new_run("blue-2", namespace="blue"), shared, read_namespace="blue"
        ).created
        with pytest.raises(ConcurrencyLimitError):
            start(store, new_run("blue-3", namespace="blue"), shared, read_namespace="blue")
        assert store.count_runs(tag=shared.tag, namespace="green") == 1

    def test_quota_keys_compare_exactly(self, store: BaseStore) -> None:
        for first, second in CONFUSABLE:
            for key in (first, second):
                assert start(store, new_run(f"{key}/1"), quota(key, 1)).created
            for key in (first, second):
                with pytest.raises(ConcurrencyLimitError):
                    start(store, new_run(f"{key}/2"), quota(key, 1))
                assert store.count_runs(tag=quota_tag(key)) == 1

    def test_the_quota_lock_is_a_transaction(self, store: BaseStore) -> None:
        with store.quota_lock("k"):
            store.create_run(new_run("run-1", tags=(quota_tag("k"),)))
            assert store.count_runs(tag=quota_tag("k")) == 1
        assert read(store, "run-1").status == RunStatus.PENDING
        with store.quota_locks(["k", "j", "k"]):
            store.create_run(new_run("run-2", tags=(quota_tag("j"),)))
        assert read(store, "run-2").status == RunStatus.PENDING
        with store.quota_locks([]):  # no key: a transaction all the same
            store.create_run(new_run("run-3"))
        assert read(store, "run-3").status == RunStatus.PENDING

    # several quotas and weights ----------------------------------------------------

    def test_a_start_under_several_quotas_needs_every_one(self, store: BaseStore) -> None:
        tenant, user = quota("tenant:acme", 3), quota("user:ann", 1)
        outcome = start(store, new_run("run-1"), [tenant, user])
        assert outcome.created
        assert read(store, "run-1").tags == sorted([tenant.tag, user.tag])
        # The user's quota is full: refused, though the tenant's has room.
        with pytest.raises(ConcurrencyLimitError) as refused:
            start(store, new_run("run-2"), [tenant, user])
        error = refused.value
        assert (error.key, error.limit, error.active) == ("user:ann", 1, 1)
        assert store.get_run("run-2") is None
        assert store.count_runs(tag=tenant.tag) == 1
        # Another user of the tenant gets in; then the tenant is full, named first.
        start(store, new_run("run-3"), [tenant, quota("user:bob", 1)])
        start(store, new_run("run-4"), [tenant, quota("user:cy", 1)])
        with pytest.raises(ConcurrencyLimitError) as full:
            start(store, new_run("run-5"), [tenant, quota("user:dee", 1)])
        assert (full.value.key, full.value.active) == ("tenant:acme", 3)
        assert store.get_run("run-5") is None
        assert store.count_runs(tag=quota_tag("user:dee")) == 0
        # Every refusing quota: the first in the order given is named.
        with pytest.raises(ConcurrencyLimitError) as both:
            start(store, new_run("run-6"), [user, tenant])
        assert both.value.key == "user:ann"
        # A slot frees on each of the run's keys when it ends.
        store.transition("run-1", RunStatus.values, RunStatus.COMPLETED)
        assert start(store, new_run("run-6"), [tenant, user]).created

    def test_a_run_occupies_its_weight(self, store: BaseStore) -> None:
        gpu = quota("gpu", 10, weight=4)
        start(store, new_run("run-1"), gpu)
        start(store, new_run("run-2"), gpu)
        assert read(store, "run-1").weights == {gpu.tag: 4}
        assert store.quota_units([gpu], None) == [8]
        # 8 units held, 4 more would make 12: refused, in units.
        with pytest.raises(ConcurrencyLimitError) as refused:
            start(store, new_run("run-3"), gpu)
        assert (refused.value.active, refused.value.limit) == (8, 10)
        assert store.get_run("run-3") is None
        # 2 units fit exactly; then the key is full even for 1.
        assert start(store, new_run("run-3"), quota("gpu", 10, weight=2)).created
        with pytest.raises(ConcurrencyLimitError) as full:
            start(store, new_run("run-4"), quota("gpu", 10))
        assert full.value.active == 10
        # Weighted runs count in their statuses only, and free their units when they end.
        store.transition("run-1", RunStatus.values, RunStatus.SUSPENDED)
        assert store.quota_units([quota("gpu", 10, (RunStatus.PENDING,))], None) == [6]
        store.transition("run-1", RunStatus.values, RunStatus.FAILED)
        assert store.quota_units([quota("gpu", 10)], None) == [6]
        assert start(store, new_run("run-4"), quota("gpu", 10, weight=4)).created
        # A weight larger than the limit is refused, whatever the key holds.
        with pytest.raises(ConcurrencyLimitError):
            start(store, new_run("run-5"), quota("other", 3, weight=4))

    def test_several_weighted_quotas_count_each_key_in_its_namespace(
        self, store: BaseStore
    ) -> None:
        a, b = quota("a", 5, weight=2), quota("b", 4, weight=3)
        start(store, new_run("blue-1", namespace="blue"), [a, b])
        start(store, new_run("green-1", namespace="green"), [quota("a", 5, weight=2)])
        assert store.quota_units([a, b], None) == [4, 3]
        assert store.quota_units([a, b], "blue") == [2, 3]
        with pytest.raises(ConcurrencyLimitError) as refused:
            start(store, new_run("blue-2", namespace="blue"), [a, b], read_namespace="blue")
        assert (refused.value.key, refused.value.active) == ("b", 3)
        assert start(store, new_run("blue-2", namespace="blue"), [a], read_namespace="blue")
        with pytest.raises(ConcurrencyLimitError) as full:
            start(store, new_run("blue-3"), [a])
        assert (full.value.key, full.value.active) == ("a", 6)

    def test_a_retry_takes_every_quota_and_its_weight(self, store: BaseStore) -> None:
        make(store, "run-1", RunStatus.FAILED, tags=[quota_tag("old")])
        start(store, new_run("run-2"), quota("b", 3, weight=2))
        failed = read(store, "run-1")
        with pytest.raises(ConcurrencyLimitError) as refused:
            store.retry_run(failed, [quota("a", 5), quota("b", 3, weight=2)], read_namespace=None)
        assert (refused.value.key, refused.value.active) == ("b", 2)
        assert read(store, "run-1").status == RunStatus.FAILED
        store.retry_run(failed, [quota("a", 5), quota("b", 4, weight=2)], read_namespace=None)
        run = read(store, "run-1")
        assert (run.status, run.tags) == (RunStatus.PENDING, [quota_tag("a"), quota_tag("b")])
        assert store.quota_units([quota("a", 5), quota("b", 4)], None) == [1, 4]

    # a batch of starts (start_runs) ----------------------------------------------------

    def test_a_batch_starts_each_run_in_order_under_its_own_quota(self, store: BaseStore) -> None:
        a, b = quota("a", 2), quota("b", 1)
        start(store, new_run("old"), a)
        outcomes = batch(
            store,
            (new_run("run-1"), a),
            (new_run("run-2"), b),
            (new_run("run-3"), a),  # a is full: old and run-1
            (new_run("run-4"), b),
            (new_run("run-5"), None),
            (new_run("run-6", "other", namespace="blue"), quota("closed", 0)),
        )
        assert refused_at(outcomes) == [2, 3, 5]
        assert outcomes[0] == StartOutcome(True, "wf", "default")
        assert outcomes[4] == StartOutcome(True, "wf", "default")
        error = outcomes[2]
        assert isinstance(error, ConcurrencyLimitError)
        assert (error.workflow, error.key, error.limit, error.active) == ("wf", "a", 2, 2)
        closed = outcomes[5]
        assert isinstance(closed, ConcurrencyLimitError)
        assert (closed.workflow, closed.key, closed.active) == ("other", "closed", 0)
        assert sorted(ids(store.list_runs())) == ["old", "run-1", "run-2", "run-5"]
        assert read(store, "run-2").tags == [quota_tag("b")]
        assert store.count_runs(tag=quota_tag("a")) == 2
        assert batch(store) == []

    def test_a_batch_returns_runs_already_there_and_ids_given_twice(self, store: BaseStore) -> None:
        full = quota("k", 1)
        start(store, new_run("order:1", input={"n": 1}), full)
        outcomes = batch(
            store,
            (new_run("order:1", input={"n": 2}), full),  # never refused
            (new_run("order:2", input={"n": 3}), None),
            (new_run("order:2", input={"n": 4}), None),
            (new_run("order:3"), full),
        )
        assert outcomes[:3] == [
            StartOutcome(False, "wf", "default"),
            StartOutcome(True, "wf", "default"),
            StartOutcome(False, "wf", "default"),
        ]
        assert refused_at(outcomes) == [3]
        assert (read(store, "order:1").input, read(store, "order:2").input) == ({"n": 1}, {"n": 3})

    def test_a_batch_meeting_an_id_of_another_run_creates_nothing(self, store: BaseStore) -> None:
        start(store, new_run("shared", "a"))
        with store.atomic(), pytest.raises(DurableError, match=r"inputs\[1\]: run id 'shared'"):
            batch(store, (new_run("new"), quota("k", 5)), (new_run("shared", "b"), None))
        assert ids(store.list_runs()) == ["shared"]
        with store.atomic(), pytest.raises(ValueError, match=r"inputs\[1\]: run id 'twice'"):
            batch(store, (new_run("twice", "a"), None), (new_run("twice", "b"), None))
        assert ids(store.list_runs()) == ["shared"]

    def test_an_id_given_twice_in_a_namespace_not_read_clashes_as_two_starts_do(
        self, store: BaseStore
    ) -> None:
        blue = new_run("twice", namespace="blue")
        with store.atomic(), pytest.raises(DurableError, match=r"inputs\[2\]: .*namespace .blue."):
            batch(
                store,
                (new_run("first"), None),
                (blue, None),
                (blue, None),
                read_namespace="default",
            )
        assert store.list_runs() == []
        assert batch(store, (blue, None), (blue, None), read_namespace="blue") == [
            StartOutcome(True, "wf", "blue"),
            StartOutcome(False, "wf", "blue"),
        ]

    def test_an_unchecked_start_on_a_taken_id_gets_the_existing_run(self, store: BaseStore) -> None:
        start(store, new_run("taken"))
        again = start(store, new_run("taken", input={"n": 2}), quota("k", 5), check_existing=False)
        assert again == StartOutcome(False, "wf", "default")
        assert read(store, "taken").input == {"run": "taken"}
        assert store.count_runs(tag=quota_tag("k")) == 0
        with pytest.raises(ConcurrencyLimitError):  # the quotas are counted first
            start(store, new_run("taken"), quota("k", 0), check_existing=False)
        with store.atomic(), pytest.raises(DurableError, match="workflow 'wf', not 'b'"):
            start(store, new_run("taken", "b"), None, check_existing=False)
        outcomes = batch(
            store, (new_run("taken"), None), (new_run("new"), None), check_existing=False
        )
        assert outcomes == [
            StartOutcome(False, "wf", "default"),
            StartOutcome(True, "wf", "default"),
        ]

    def test_a_batch_admits_each_start_under_every_quota_with_its_weight(
        self, store: BaseStore
    ) -> None:
        # Two keys, weights: each element is admitted, in order, only when every one of
        # its quotas admits it; a refused element takes no unit of any key.
        a2, b3 = quota("a", 4, weight=2), quota("b", 3)
        heavy_b = quota("b", 3, weight=2)
        start(store, new_run("old"), [quota("b", 3)])  # b: 1 of 3
        outcomes = batch(
            store,
            (new_run("run-1"), [a2, b3]),  # a 2/4, b 2/3
            (new_run("run-2"), [a2, heavy_b]),  # b would be 4/3: refused by b, a unchanged
            (new_run("run-3"), [a2]),  # a 4/4
            (new_run("run-4"), [quota("a", 4), b3]),  # a would be 5/4: refused by a
            (new_run("run-5"), [b3, quota("c", 1, weight=1)]),  # b 3/3, c 1/1
            (new_run("run-6"), [quota("c", 2), b3]),  # c 2/2 fine, b full: refused by b
        )
        assert refused_at(outcomes) == [1, 3, 5]
        refusals = [outcomes[i] for i in (1, 3, 5)]
        assert all(isinstance(error, ConcurrencyLimitError) for error in refusals)
        assert [(e.key, e.limit, e.active) for e in refusals] == [  # type: ignore[union-attr]
            ("b", 3, 2),
            ("a", 4, 4),
            ("b", 3, 3),
        ]
        assert sorted(ids(store.list_runs())) == ["old", "run-1", "run-3", "run-5"]
        assert store.quota_units([quota("a", 4), quota("b", 3), quota("c", 1)], None) == [
            4,
            3,
            1,
        ]
        assert read(store, "run-1").weights == {quota_tag("a"): 2}
        assert read(store, "run-5").tags == [quota_tag("b"), quota_tag("c")]

    def test_a_batch_counts_in_the_namespace_read(self, store: BaseStore) -> None:
        shared = quota("shared", 1)
        start(store, new_run("green-1", namespace="green"), shared)
        outcomes = batch(
            store,
            (new_run("blue-1", namespace="blue"), shared),
            (new_run("blue-2", namespace="blue"), shared),
            read_namespace="blue",
        )
        assert refused_at(outcomes) == [1]
        assert store.count_runs(tag=shared.tag) == 2

    # a turn (claim_run, record_held_step, end_turn) ------------------------------------

    def test_a_claim_takes_a_pending_run_with_its_steps(self, store: BaseStore) -> None:
        now = timezone.now()
        make(store, "run-1", tags=["t"])
        store.record_step("run-1", StepRecord(0, "first", result=1))
        claim = {"lease_owner": "w", "lease_expires_at": now + HOUR, "started_at": now}
        claimed = store.claim_run("run-1", **claim, wake_at=None)
        assert claimed is not None
        run, steps = claimed
        assert (run.run_id, run.status, run.tags) == ("run-1", RunStatus.RUNNING, ["t"])
        assert (run.lease_owner, run.lease_expires_at, run.started_at) == ("w", now + HOUR, now)
        assert steps == [StepRecord(0, "first", result=1)]
        assert read(store, "run-1") == run
        # Running now: a second claim finds nothing to take, and changes nothing.
        assert store.claim_run("run-1", **{**claim, "lease_owner": "v"}, wake_at=None) is None
        assert read(store, "run-1").lease_owner == "w"
        assert store.claim_run("no-such-run", **claim, wake_at=None) is None

    def test_a_held_step_is_recorded_for_the_holder_only(self, store: BaseStore) -> None:
        held = make(store, "run-1", RunStatus.RUNNING, lease_owner="w")
        make(store, "pending", lease_owner="w")
        assert store.record_held_step("run-1", StepRecord(0, "a", result=1), "w")
        assert not store.record_held_step("run-1", StepRecord(1, "b", result=2), "v")
        assert not store.record_held_step("pending", StepRecord(0, "c", result=3), "w")
        assert store.get_steps("run-1") == [StepRecord(0, "a", result=1)]
        assert store.get_steps("pending") == []
        # A record leaves the run's row as it was, ``updated_at`` included.
        assert read(store, "run-1") == held
        retried = StepRecord(0, "a", result="again")
        assert store.record_held_step("run-1", retried, "w", replace=True)
        assert store.get_steps("run-1") == [retried]

    def test_a_transactional_steps_record_is_made_for_the_holder_only(
        self, store: BaseStore
    ) -> None:
        make(store, "run-1", RunStatus.RUNNING, lease_owner="w")
        first = StepRecord(0, "a", result=1)
        with store.atomic():
            assert store.commit_held_step("run-1", first, "w")
        assert store.get_steps("run-1") == [first]
        with store.atomic():
            assert not store.commit_held_step("run-1", StepRecord(1, "b", result=2), "v")
        assert store.get_steps("run-1") == [first]

    def test_a_turn_ends_with_its_last_record(self, store: BaseStore) -> None:
        now = timezone.now()
        tag = quota_tag("k")
        make(store, "run-1", RunStatus.RUNNING, tags=[tag], lease_owner="w")
        last = StepRecord(0, "last", result="r")
        ended = {"output": {"ok": True}, "finished_at": now, "lease_owner": ""}
        assert not store.end_turn("run-1", "v", RunStatus.COMPLETED, last, **ended)
        assert store.get_steps("run-1") == []
        assert read(store, "run-1").status == RunStatus.RUNNING
        assert store.end_turn("run-1", "w", RunStatus.COMPLETED, last, **ended)
        run = read(store, "run-1")
        assert (run.status, run.output, run.finished_at, run.lease_owner) == (
            RunStatus.COMPLETED,
            {"ok": True},
            now,
            "",
        )
        assert store.get_steps("run-1") == [last]
        assert store.count_runs(tag=tag, statuses=list(DEFAULT_CONCURRENCY_STATUSES)) == 0

    # quota usage --------------------------------------------------------------------

    def test_quota_keys_count_runs_by_key_and_workflow(self, store: BaseStore) -> None:
        make(store, "run-1", tags=[quota_tag("a"), "user"], workflow="x")
        make(store, "run-2", RunStatus.SUSPENDED, tags=[quota_tag("a")], workflow="x")
        make(store, "run-3", RunStatus.RUNNING, tags=[quota_tag("a")], workflow="y")
        make(store, "run-4", tags=[quota_tag("b")], workflow="x", namespace="blue")
        make(store, "run-5", RunStatus.COMPLETED, tags=[quota_tag("c")], workflow="x")
        make(store, "run-6", tags=["CONCURRENCY:d", "concurrency"], workflow="x")
        active = list(DEFAULT_CONCURRENCY_STATUSES)
        assert store.quota_keys(active, None) == {"a": {"x": 2, "y": 1}, "b": {"x": 1}}
        assert store.quota_keys(active, "blue") == {"b": {"x": 1}}
        assert store.quota_keys(["running"], None) == {"a": {"y": 1}}
        assert store.quota_keys(["completed"], None) == {"c": {"x": 1}}

    def test_quota_holders_are_the_keys_runs_oldest_first(self, store: BaseStore) -> None:
        now = timezone.now()
        tag = quota_tag("k")
        make(store, "run-b", RunStatus.RUNNING, tags=[tag], created_at=now - 2 * SECOND)
        make(store, "run-c", tags=[tag], created_at=now - SECOND)
        make(store, "run-a", RunStatus.SUSPENDED, tags=[tag], created_at=now - 3 * SECOND)
        make(store, "run-d", RunStatus.COMPLETED, tags=[tag], created_at=now - HOUR)
        make(store, "run-e", tags=[tag], namespace="blue", created_at=now - HOUR)
        make(store, "run-f", tags=[quota_tag("K"), "k"], created_at=now - HOUR)
        active = list(DEFAULT_CONCURRENCY_STATUSES)
        holders = store.quota_holders(tag, active, "default")
        assert [run.run_id for run in holders] == ["run-a", "run-b", "run-c"]
        assert holders[0].created_at == now - 3 * SECOND
        everywhere = store.quota_holders(tag, active, None)
        assert [run.run_id for run in everywhere] == ["run-e", "run-a", "run-b", "run-c"]
        assert [r.run_id for r in store.quota_holders(tag, ["running"], None)] == ["run-b"]

    def test_finished_spans_are_the_latest_within_the_window(self, store: BaseStore) -> None:
        now = timezone.now()
        tag = quota_tag("k")
        for n, status in enumerate(TERMINAL_STATUSES * 2):
            ended = now - (n + 1) * SECOND
            make(
                store,
                f"run-{n}",
                status,
                tags=[tag],
                created_at=ended - (n + 10) * SECOND,
                finished_at=ended,
            )
        make(store, "run-old", RunStatus.COMPLETED, tags=[tag], created_at=now - 3 * HOUR,
             finished_at=now - 2 * HOUR)  # fmt: skip
        make(store, "run-active", tags=[tag], created_at=now - HOUR)
        make(store, "run-blue", RunStatus.COMPLETED, tags=[tag], namespace="blue",
             created_at=now - 2 * SECOND, finished_at=now)  # fmt: skip
        make(store, "run-other", RunStatus.COMPLETED, tags=[quota_tag("j")],
             created_at=now - 2 * SECOND, finished_at=now)  # fmt: skip
        spans = store.finished_spans(tag, "default", now - HOUR, 4)
        assert [finished - created for created, finished in spans] == [
            (n + 10) * SECOND for n in range(4)
        ]
        assert [finished for _, finished in spans] == [now - (n + 1) * SECOND for n in range(4)]
        assert len(store.finished_spans(tag, "default", now - HOUR, 50)) == 6
        assert len(store.finished_spans(tag, "default", now - 3 * HOUR, 50)) == 7
        assert store.finished_spans(tag, None, now - HOUR, 1)[0][1] == now  # run-blue

    # deleting and purging ------------------------------------------------------------

    def test_deleting_a_run_takes_its_steps_and_tags(self, store: BaseStore) -> None:
        make(store, "run-1", RunStatus.COMPLETED, tags=[quota_tag("k")])
        make(store, "run-2", RunStatus.COMPLETED, tags=[quota_tag("k")])
        store.record_step("run-1", StepRecord(0, "s", result=1))
        store.delete_run("run-1")
        store.delete_run("no-such-run")
        assert store.get_run("run-1") is None
        assert store.get_steps("run-1") == []
        assert store.count_runs(tag=quota_tag("k")) == 1
        assert ids(store.list_runs()) == ["run-2"]

    def test_delete_runs_keeps_active_runs_and_those_below_them(self, store: BaseStore) -> None:
        make(store, "parent", RunStatus.SUSPENDED)
        make(store, "parent/child", RunStatus.COMPLETED, parent_id="parent")
        make(store, "parent/child/grandchild", RunStatus.FAILED, parent_id="parent/child")
        make(store, "done", RunStatus.COMPLETED)
        make(store, "done/child", RunStatus.CANCELLED, parent_id="done")
        make(store, "orphan", RunStatus.COMPLETED, parent_id="gone")
        make(store, "active")
        asked = [
            "parent/child",
            "parent/child/grandchild",
            "done/child",
            "orphan",
            "active",
            "no-such-run",
        ]
        assert sorted(store.delete_runs(asked)) == ["done/child", "orphan"]
        assert sorted(ids(store.list_runs())) == [
            "active",
            "done",
            "parent",
            "parent/child",
            "parent/child/grandchild",
        ]
        store.transition("parent", RunStatus.values, RunStatus.COMPLETED)
        assert sorted(store.delete_runs(asked)) == ["parent/child", "parent/child/grandchild"]

    def test_purge_runs_goes_by_id_in_batches(self, store: BaseStore) -> None:
        cutoff = timezone.now() - HOUR
        for n in range(1, 6):
            finished(store, f"old-{n}", 2 * HOUR)
        finished(store, "recent", SECOND)
        make(store, "failed", RunStatus.FAILED, finished_at=cutoff - HOUR)
        finished(store, "blue", 2 * HOUR, namespace="blue")
        make(store, "active")
        completed = [RunStatus.COMPLETED]
        assert store.purge_runs(cutoff, completed, "default", 2) == (2, "old-2")
        assert store.get_run("old-1") is None and store.get_run("old-3") is not None
        assert store.purge_runs(cutoff, completed, "default", 2, "old-2") == (2, "old-4")
        deleted, after = store.purge_runs(cutoff, completed, "default", 2, "old-4")
        assert (deleted, after) == (1, None)
        assert sorted(ids(store.list_runs())) == ["active", "blue", "failed", "recent"]
        assert store.purge_runs(cutoff, [*completed, RunStatus.FAILED], None, 10) == (2, None)
        assert sorted(ids(store.list_runs())) == ["active", "recent"]

    def test_purge_runs_keeps_runs_below_an_active_one(self, store: BaseStore) -> None:
        cutoff = timezone.now() - HOUR
        make(store, "parent", RunStatus.SUSPENDED)
        finished(store, "parent/child", 2 * HOUR, parent_id="parent")
        finished(store, "single", 2 * HOUR)
        assert store.purge_runs(cutoff, [RunStatus.COMPLETED], None, 10) == (1, None)
        assert store.get_run("parent/child") is not None

    def test_purging_signals_keeps_those_not_taken(self, store: BaseStore) -> None:
        make(store, "run-1")
        store.send_signal("taken", 1)
        store.take_signal("run-1", "taken", StepRecord(0, "signal"))
        store.send_signal("kept", 2)
        later = timezone.now() + HOUR
        assert store.purge_signals(later, 10) in (0, 1)  # a store may drop taken signals
        assert store.purge_signals(later, 10) == 0
        assert store.has_signal("kept") and not store.has_signal("taken")
        assert store.take_signal("run-1", "kept", StepRecord(1, "signal")) == (True, 2)

    # fair quotas' tickets -------------------------------------------------------------

    def test_kept_tickets_hold_slots_in_their_order(self, store: BaseStore) -> None:
        now = timezone.now()
        key = fresh_ticket_key(store)  # kept tickets may outlive the test's transaction
        fair = dataclasses.replace(quota(key, 1), fair_window=3.0)
        older = issue(key, 1, now - 2 * SECOND, now + HOUR)
        newer = issue(key, 1, now - SECOND, now + HOUR)
        for ticket in (newer, older):
            store.keep_ticket(
                KeptTicket(ticket.id, key, ticket.issued_at, 1, now + HOUR), most=10
            )  # joined then
        assert sorted(t.id for t in store.ticket_line(key)) == sorted([older.id, newer.id])
        assert store.ticket_line(key + ":other") == []
        with store.atomic(), pytest.raises(ConcurrencyLimitError) as caught:
            start(store, new_run("no-ticket"), fair)
        assert (caught.value.active, caught.value.held) == (0, 2)
        with store.atomic(), pytest.raises(ConcurrencyLimitError) as caught:
            store.start_run(
                new_run("newer"), [fair], check_existing=True, read_namespace=None, ticket=newer
            )
        assert caught.value.held == 1 and caught.value.line.holds  # held for the older
        assert store.start_run(
            new_run("older", tags=(fair.tag,)),
            [fair],
            check_existing=True,
            read_namespace=None,
            ticket=older,
        ).created
        assert [t.id for t in store.ticket_line(key)] == [newer.id]  # dropped on admission
        store.drop_ticket(newer.id)

    def test_an_unchecked_fair_start_on_a_taken_id_gets_the_existing_run(
        self, store: BaseStore
    ) -> None:
        # As without a fair quota: the quota counted first, then the run found, nothing
        # written (PostgreSQL's fair start takes a path of its own, two round trips).
        key = fresh_ticket_key(store)
        fair = dataclasses.replace(quota(key, 2), fair_window=3.0)
        start(store, new_run("taken"))
        with store.atomic():
            again = start(store, new_run("taken", input={"n": 2}), fair, check_existing=False)
        assert again == StartOutcome(False, "wf", "default")
        assert read(store, "taken").input == {"run": "taken"}
        assert store.count_runs(tag=fair.tag) == 0
        with store.atomic(), pytest.raises(ConcurrencyLimitError):
            start(
                store,
                new_run("taken"),
                dataclasses.replace(fair, limit=0),
                check_existing=False,
            )

    def test_tickets_are_kept_held_and_purged(self, store: BaseStore) -> None:
        now = timezone.now()
        key = fresh_ticket_key(store)
        a, b, c = (uuid.uuid4().hex for _ in range(3))
        store.keep_ticket(KeptTicket(a, key, now, 1, now + HOUR), most=2)
        store.keep_ticket(KeptTicket(a, key, now, 2, now + 2 * HOUR), most=2)  # moved
        store.keep_ticket(KeptTicket(b, key, now, 1, now + HOUR), most=2)
        store.keep_ticket(KeptTicket(c, key, now, 1, now + HOUR), most=2)  # a full line
        by_id = {t.id: t for t in store.ticket_line(key)}
        assert sorted(by_id) == sorted([a, b])
        assert by_id[a].weight == 2
        assert abs(by_id[a].expires_at - (now + 2 * HOUR)) < SECOND
        store.hold_tickets(key, None, now + SECOND)
        store.hold_tickets(key, None, now + HOUR)  # bound already: the first hold stands
        for ticket in store.ticket_line(key):
            assert ticket.held_until is not None
            assert abs(ticket.held_until - (now + SECOND)) < SECOND / 10
        store.end_hold(key, None, now + 2 * SECOND)  # ran out by then: stays bound
        assert all(not t.live(now + 2 * SECOND) for t in store.ticket_line(key))
        store.end_hold(key, None, now)  # running at now, and used: unbound
        assert [t.held_until for t in store.ticket_line(key)] == [None, None]
        assert store.purge_tickets(now + 3 * HOUR, 10000) >= 2
        assert store.ticket_line(key) == []

    def test_a_line_is_per_namespace(self, store: BaseStore) -> None:
        now = timezone.now()
        key = fresh_ticket_key(store)
        a, b = (uuid.uuid4().hex for _ in range(2))
        store.keep_ticket(KeptTicket(a, key, now, 1, now + HOUR, "blue"), most=1)
        store.keep_ticket(KeptTicket(b, key, now, 1, now + HOUR, "green"), most=1)
        assert [t.id for t in store.ticket_line(key, "blue")] == [a]
        assert [t.id for t in store.ticket_line(key, "green")] == [b]
        assert sorted(t.id for t in store.ticket_line(key)) == sorted([a, b])
        store.hold_tickets(key, "blue", now + HOUR)
        assert [t.held_until is None for t in store.ticket_line(key, "green")] == [True]
        store.end_hold(key, "green", now)  # another line's: blue's hold runs on
        assert [t.held_until is None for t in store.ticket_line(key, "blue")] == [False]
        store.drop_ticket(a)
        store.drop_ticket(b)

    # operators' overrides --------------------------------------------------------------

    def test_an_override_replaces_the_limit_of_its_key_for_its_scope(
        self, store: BaseStore
    ) -> None:
        now = timezone.now()
        stores_overrides(store)
        store.set_override(Override("k", "concurrency", 1, None, "", now))
        store.set_override(Override("k", "rate", 0, now + HOUR, "blue", now))
        assert store.override_limits([quota_tag("k"), rate_tag("k")], "", now) == {
            quota_tag("k"): 1
        }
        assert store.override_limits([rate_tag("k")], "blue", now) == {rate_tag("k"): 0}
        start(store, new_run("a"), quota("k", 5))
        with store.atomic(), pytest.raises(ConcurrencyLimitError) as caught:
            start(store, new_run("b"), quota("k", 5))
        assert (caught.value.limit, caught.value.active) == (1, 1)
        # Another scope's override is not this start's: blue's pause of the rate key.
        assert start(store, new_run("c"), rate("k", 5), read_namespace="default").created
        with store.atomic(), pytest.raises(RateLimitError) as rated:
            start(store, new_run("d", namespace="blue"), rate("k", 5), read_namespace="blue")
        assert rated.value.limit == 0
        assert [(o.tag, o.scope, o.limit) for o in store.list_overrides(None, now)] == [
            (quota_tag("k"), "", 1),
            (rate_tag("k"), "blue", 0),
        ]
        assert [o.tag for o in store.list_overrides("blue", now)] == [rate_tag("k")]

    def test_an_override_ends_at_its_until_and_when_cleared(self, store: BaseStore) -> None:
        now = timezone.now()
        stores_overrides(store)
        store.set_override(Override("k", "concurrency", 0, now + HOUR, "", now))
        store.set_override(Override("j", "concurrency", 0, now - SECOND, "", now))
        assert store.override_limits([quota_tag("k"), quota_tag("j")], "", now) == {
            quota_tag("k"): 0
        }
        assert store.override_limits([quota_tag("k")], "", now + HOUR) == {}
        assert [o.key for o in store.list_overrides("", now)] == ["k"]
        assert start(store, new_run("a"), quota("j", 1)).created  # j's has ended
        store.set_override(Override("k", "concurrency", 3, None, "", now))  # set again
        assert store.override_limits([quota_tag("k")], "", now + HOUR) == {quota_tag("k"): 3}
        assert store.clear_override(quota_tag("k"), "") is True
        assert store.clear_override(quota_tag("k"), "") is False
        assert store.override_limits([quota_tag("k")], "", now) == {}

    def test_a_batch_and_a_retry_obey_the_override(self, store: BaseStore) -> None:
        now = timezone.now()
        stores_overrides(store)
        store.set_override(Override("k", "concurrency", 2, None, "", now))
        outcomes = batch(store, *((new_run(f"r{i}"), quota("k", 9)) for i in range(3)))
        assert refused_at(outcomes) == [2]
        refusal = outcomes[2]
        assert isinstance(refusal, ConcurrencyLimitError) and refusal.limit == 2
        make(store, "failed", RunStatus.FAILED)
        failed = store.get_run("failed")
        assert failed is not None
        with store.atomic(), pytest.raises(ConcurrencyLimitError) as caught:
            store.retry_run(failed, quota("k", 9), read_namespace=None)
        assert caught.value.limit == 2

    # the store's environment ---------------------------------------------------------

    def test_the_store_says_whether_workers_share_it(self, store: BaseStore) -> None:
        assert isinstance(store.is_shared, bool)
        assert isinstance(store.check(), list)
        assert store.connection_lost(ValueError("not a database error")) is False

    def test_a_reconnected_store_goes_on_working(self, store: BaseStore) -> None:
        store.create_run(new_run("run-1"))
        if not store.in_transaction():  # a waiting start reconnects outside one only
            store.reconnect()
        run = store.get_run("run-1")
        assert run is not None and run.run_id == "run-1"
        if store.in_transaction():
            assert isinstance(store.waiting_in_transaction(["k"]), str | None)
