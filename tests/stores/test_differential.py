"""Every start path of ``OrmStore`` against the reference, ``MemoryStore``.

The admission rule is written once in Python (``durable_django._rules.admission``) and again in
each SQL routine that starts runs in one round trip. A seeded generator makes random
scenarios of single starts, batches, retries, status changes and fair quotas' tickets;
each operation is applied to a ``MemoryStore`` and to ``OrmStore`` on one of its paths
(each inside ``transaction.atomic()``, a caller's transaction, which commits: the test is
transactional, as the kept tickets written on a connection of their own need), and every
outcome is compared, then the runs and their tag rows.

Quotas of both kinds are drawn, a rate limit and a concurrency quota sharing a key
at times, and operators' overrides of their limits are set (some already ended) and
cleared between the starts. The paths: on PostgreSQL ``durable_start_run_v2`` (a
connection that has started before), the first start's statements (``first_start``:
every start a connection's first), the set-based batch (``durable_start_runs_v2``, on
both) and the portable path; on MySQL and MariaDB the procedure and the portable path;
on SQLite the portable path.
"""

from __future__ import annotations

import datetime
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from durable_django._core.records import NewRun, StartOutcome
from durable_django._rules.concurrency import Quota
from durable_django._rules.overrides import Override
from durable_django._rules.tickets import KeptTicket, Ticket, issue
from durable_django.errors import ConcurrencyLimitError
from durable_django.models import RunTag
from durable_django.status import RunStatus
from durable_django.stores import BaseStore, MemoryStore, OrmStore
from durable_django.stores.base import StartRequest
from durable_django.stores.contract import new_run
from durable_django.stores.postgres import first_start

from ..helpers import every_start_a_first

TRIALS = 150
SEED = 23000
HOUR = datetime.timedelta(hours=1)

#: The paths each database has: the name of each and whether it takes the fast path.
PATHS = {
    "postgresql": ["function", "statements", "portable"],
    "mysql": ["procedure", "portable"],
    "sqlite": ["portable"],
}[connection.vendor]

STATUSES = [status.value for status in RunStatus]
#: Counted statuses a quota may name; one names a status twice, which counts once.
COUNTED = [
    ("pending", "running", "suspended", "blocked"),
    ("running",),
    ("pending", "running"),
    ("suspended", "blocked", "running"),
    ("running", "pending", "running"),
    ("pending", "running", "pending", "blocked"),
]

Op = tuple[Any, ...]
#: A start: its run id, workflow, namespace, quotas, and whether it checks for the id.
Element = tuple[str, str, str, list[Quota], bool]


@pytest.fixture(params=PATHS)
def store(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    kept_tickets_forgotten: None,
    transactional_db: None,
) -> Iterator[OrmStore]:
    if request.param == "statements":
        every_start_a_first(monkeypatch)
    elif request.param == "function":
        connection.ensure_connection()
        first_start._STARTED.add(connection.connection)
    yield OrmStore(fast_path=request.param != "portable")


class Scenario:
    """One random sequence of operations; ids and keys carry ``prefix``, so scenarios
    sharing a database never count each other's runs."""

    def __init__(self, draw: random.Random, prefix: str) -> None:
        self.draw, self.prefix = draw, prefix
        self.keys = [f"{prefix}{name}" for name in "abc"]
        self.fair_key = f"{prefix}fair"
        self.made: list[str] = []
        self.tickets: list[Ticket] = []
        self.issued_at = timezone.now() - HOUR

    def quotas(self) -> list[Quota]:
        draw = self.draw
        quotas = [
            Quota(k, draw.randint(0, 5), draw.choice(COUNTED), draw.randint(1, 3))
            for k in draw.sample(self.keys, draw.choice([0, 1, 1, 2, 3]))
        ]
        if draw.random() < 0.25:
            fair = Quota(self.fair_key, draw.randint(1, 3), COUNTED[0], draw.randint(1, 2), 3.0)
            quotas.insert(draw.randint(0, len(quotas)), fair)
        # Rate limits, on keys a concurrency quota of the start may share: their window
        # (an hour) holds every run of the scenario, whatever its status.
        for key in draw.sample(self.keys, draw.choice([0, 0, 0, 1, 2])):
            rate = Quota(key, draw.randint(0, 6), (), draw.randint(1, 3), per=3600.0)
            quotas.insert(draw.randint(0, len(quotas)), rate)
        return quotas

    def element(self) -> Element:
        draw = self.draw
        run_id = draw.choice([f"{self.prefix}r{len(self.made)}", *self.made[-3:]])
        self.made.append(run_id)
        namespace = draw.choice(["default", "default", "blue"])
        workflow = draw.choice(["wf", "wf", "other"])
        return run_id, workflow, namespace, self.quotas(), draw.random() < 0.7

    def op(self) -> Op:
        draw = self.draw
        kind = draw.choice(
            ["start"] * 4 + ["batch"] * 2 + ["move"] * 3 + ["retry", "ticket", "override"]
        )
        read = draw.choice([None, None, "default", "blue"])
        if kind in ("move", "retry") and self.made:
            run_id = draw.choice(self.made)
            if kind == "retry":
                return ("retry", run_id, self.quotas(), read)
            return ("move", run_id, draw.choice([*STATUSES, "failed", "completed"]))
        if kind == "ticket":
            return self.ticket_op()
        if kind == "override":
            return self.override_op()
        if kind == "batch":
            elements = [self.element()]
            for _ in range(draw.randint(0, 4)):
                again = draw.random() < 0.3  # the previous element's id, workflow, namespace
                element = self.element()
                elements.append((*elements[-1][:3], *element[3:]) if again else element)
            return ("batch", elements, read)
        ticket = draw.choice(self.tickets) if self.tickets and draw.random() < 0.5 else None
        return ("start", self.element(), read, ticket)

    def override_op(self) -> Op:
        """An operator's override set (in force, or one whose ``until`` has passed) or
        cleared, of a concurrency or a rate key, for the starts reading every namespace
        (scope ``""``) or one."""
        draw = self.draw
        tag = draw.choice(["concurrency:", "rate:"]) + draw.choice(self.keys)
        scope = draw.choice(["", "", "default", "blue"])
        if draw.random() < 0.3:
            return ("clear", tag, scope)
        until = draw.choice([None, None, HOUR, -HOUR])
        return ("override", tag, scope, draw.randint(0, 5), until)

    def ticket_op(self) -> Op:
        draw = self.draw
        choice = draw.random()
        namespace = draw.choice(["default", "blue"])
        if choice < 0.6 or not self.tickets:
            self.issued_at += datetime.timedelta(seconds=1)
            ticket = issue(self.fair_key, draw.randint(1, 2), self.issued_at, self.issued_at)
            self.tickets.append(ticket)
            return ("keep", ticket, namespace, draw.randint(1, 4))
        if choice < 0.8:
            return ("hold", self.fair_key, namespace if draw.random() < 0.7 else None)
        return ("end_hold", self.fair_key, namespace if draw.random() < 0.7 else None)


def seen(result: Any) -> Any:
    """What is compared of an outcome."""
    if isinstance(result, ConcurrencyLimitError):
        line = result.line
        return (
            "refused",
            result.key,
            result.limit,
            result.active,
            result.held,
            None if line is None else (line.kept, line.ahead, line.holds, line.length),
        )
    if isinstance(result, StartOutcome):
        return ("ok", result.created, result.workflow, result.namespace)
    return result


def outcome(call: Callable[[], Any]) -> Any:
    try:
        result = call()
    except ConcurrencyLimitError as error:
        return seen(error)
    except Exception as error:
        return (type(error).__name__, str(error))
    return [seen(r) for r in result] if isinstance(result, list) else seen(result)


def tagged(element: Element) -> NewRun:
    """The element's run as the engine makes it: carrying its quotas' tags and weights."""
    run_id, workflow, namespace, quotas, _ = element
    return new_run(
        run_id,
        workflow,
        namespace=namespace,
        tags=tuple(dict.fromkeys(q.tag for q in quotas)),
        weights={q.tag: q.weight for q in quotas if q.weight != 1},
    )


def apply(store: BaseStore, op: Op) -> Any:
    """Apply ``op`` to ``store``; its outcome, comparable across stores."""
    kind = op[0]
    now = timezone.now()
    if kind == "start":
        element, read, ticket = op[1:]
        quotas = element[3]
        return outcome(
            lambda: store.start_run(
                tagged(element),
                quotas,
                check_existing=element[4],
                read_namespace=read,
                ticket=ticket,
            )
        )
    if kind == "batch":
        elements, read = op[1:]
        requests = [StartRequest(tagged(e), e[3], e[4]) for e in elements]
        return outcome(lambda: store.start_runs(requests, read_namespace=read))
    if kind == "retry":
        run_id, quotas, read = op[1:]
        run = store.get_run(run_id)
        if run is None:
            return None
        return outcome(lambda: store.retry_run(run, quotas, read_namespace=read))
    if kind == "move":
        run = store.get_run(op[1])
        return None if run is None else store.transition(op[1], [run.status], op[2])
    if kind == "override":
        tag, scope, limit, until = op[1:]
        ends = None if until is None else now + until
        return store.set_override(Override.from_tag(tag, limit, ends, scope, now))
    if kind == "clear":
        return store.clear_override(*op[1:])
    if kind == "keep":
        ticket, namespace, most = op[1:]
        kept = KeptTicket(
            ticket.id, ticket.key, ticket.issued_at, ticket.weight, now + HOUR, namespace
        )
        return store.keep_ticket(kept, most=most)
    key, namespace = op[1:]
    if kind == "hold":
        return store.hold_tickets(key, namespace, now + HOUR)
    return store.end_hold(key, namespace, now)


def state(store: BaseStore, prefix: str) -> tuple[Any, Any]:
    """The scenario's runs (by id, with what a start or a retry sets) and their tag rows,
    without timestamps."""
    runs = sorted(
        (
            run.run_id,
            run.workflow,
            run.namespace,
            run.status,
            run.attempt,
            tuple(sorted(run.tags)),
            tuple(sorted(run.weights.items())),
        )
        for run in store.list_runs()
        if run.run_id.startswith(prefix)
    )
    rows = sorted(
        (run_id, tag, status, namespace, dict(weights).get(tag, 1))
        for run_id, _, namespace, status, _, tags, weights in runs
        for tag in tags
    )
    return runs, rows


def test_every_path_decides_as_the_reference(store: OrmStore) -> None:
    run = uuid.uuid4().hex[:6]  # kept tickets may outlive the test's transaction
    differing = []
    for trial in range(TRIALS):
        draw, prefix = random.Random(SEED + trial), f"{run}-{trial}-"
        scenario = Scenario(draw, prefix)
        reference = MemoryStore()
        for step in range(draw.randint(5, 25)):
            op = scenario.op()
            expected = apply(reference, op)
            with transaction.atomic():
                got = apply(store, op)
            if got != expected:
                differing.append((trial, step, op, expected, got))
                break
        else:
            expected_state = state(reference, prefix)
            got_state = state(store, prefix)
            tag_rows = sorted(
                RunTag.objects.filter(run__id__startswith=prefix).values_list(
                    "run_id", "tag", "status", "namespace", "weight"
                )
            )
            if got_state != expected_state or tag_rows != expected_state[1]:
                got = (got_state, tag_rows)
                differing.append((trial, "end", "runs, tag rows", expected_state, got))
    if differing:
        pytest.fail(
            f"{len(differing)} of {TRIALS} scenarios differ from the reference; the first:\n"
            + "\n".join(
                f"trial {trial} (seed {SEED + trial}), step {step}: {op}\n"
                f"  reference: {expected}\n  this path: {got}"
                for trial, step, op, expected, got in differing[:3]
            )
        )
