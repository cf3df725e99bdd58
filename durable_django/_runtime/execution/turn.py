"""The turn driver: claim a pending run, replay its body, then end the turn (suspended or
finished), hand the run back, or leave it, and wake whoever its end concerns."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import (
    TYPE_CHECKING,
    Any,
)

from django.db import DatabaseError, connections
from django.utils import timezone

from ... import metrics
from ..._core.context import current_context
from ..._core.records import RunRecord, StepRecord
from ..._core.serialization import json_copy
from ..._core.user_code import user_failure
from ...db import close_connections, one_line
from ...errors import StepError
from ...observability import events as observing
from ...status import TERMINAL_STATUSES, RunStatus
from . import lease
from .context import Context
from .control import DatabaseLost, LeaseLost, Suspend, TimeUp
from .payloads import error_payload, unwritten_payload

if TYPE_CHECKING:
    from ..._core.runtime import Runtime
    from ...stores.base import BaseStore

logger = logging.getLogger("durable_django.execution")


def worker_id() -> str:
    """A name for this worker thread, unique enough to tell leases apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


#: What every end of a turn sets: the run is no longer held.
_RELEASED = {"lease_owner": "", "lease_expires_at": None, "blocked_reason": ""}


def execute_run(engine: Runtime, run_id: str) -> bool:
    """Claim a pending run, replay its body, and suspend or finish it.

    Returns False when the run was not waiting for a worker (another took it, or it
    ended). A run whose workflow version this process does not have is ``blocked``.
    """
    store = engine.store
    config = engine.config
    owner = worker_id()
    now = timezone.now()
    lease = datetime.timedelta(seconds=config.lease_seconds)
    claim = {"lease_owner": owner, "lease_expires_at": now + lease, "started_at": now}
    # The claim, the run and its steps at once (one round trip on PostgreSQL).
    claimed = store.claim_run(run_id, **claim, wake_at=None)
    if claimed is None:
        return False
    run, steps = claimed
    metrics.run_claimed(run, steps, now)
    with observing.turn(run, now) as turn:
        turn.outcome = _turn(engine, run, steps, owner, turn)
    return True


def _turn(
    engine: Runtime, run: RunRecord, steps: list[StepRecord], owner: str, turn: observing.TurnEvent
) -> str:
    """A claimed run's turn: its body replayed, then its end written; returns how the
    turn ended (:data:`~durable_django.observability.events.TURN_OUTCOMES`)."""
    store = engine.store
    config = engine.config
    now = turn.claimed_at
    run_id = run.run_id
    definition = engine.registry.get(run.workflow, run.version)
    if definition is None or definition.body is None:
        store.transition(
            run_id,
            [RunStatus.RUNNING],
            RunStatus.BLOCKED,
            owner=owner,
            lease_owner="",
            lease_expires_at=None,
            wake_at=now + datetime.timedelta(seconds=config.blocked_retry_seconds),
            blocked_reason=(
                f"workflow {run.workflow!r} version {run.version!r} is not registered "
                f"for execution in this process"
            ),
        )
        return "blocked"
    context = Context(engine, run, steps, owner)
    token = current_context.set(context)
    try:
        with lease.kept(engine, context, config.lease_seconds):
            status, fields = _run_body(observing.watched(turn, definition.body), context)
    except LeaseLost:
        return "lease_lost"
    except DatabaseLost as lost:
        _hand_back(engine, run, owner, str(lost))
        return "handed_back"
    except TimeUp as up:
        _hand_back(engine, run, owner, str(up), cause="its turn ran out of time")
        return "handed_back"
    finally:
        current_context.reset(token)
    try:
        status, fields, finished = _write_turn_end(
            store, run_id, owner, status, context.unwritten, {**fields, **_RELEASED}
        )
    except DatabaseLost as lost:
        _hand_back(engine, run, owner, str(lost))
        return "handed_back"
    if not finished:
        return "lease_lost"
    _after_turn(engine, run, status, fields.get("wait"))
    return status


def _write_turn_end(
    store: BaseStore, run_id: str, owner: str, status: str, step: StepRecord | None, fields: Any
) -> tuple[str, dict[str, Any], bool]:
    """End the turn as the body left it: ``(status, fields, whether the run was held)``.

    The values were checked before (what the store cannot hold failed the run or its
    step already), so a write the database still refuses is tried once more (a deadlock
    or a dropped connection passes). Refused again, the run ends ``failed`` with an
    error record every database holds instead: a run must never stay ``running``, to be
    handed on and replayed at each lease, holding its slot. A database that went away
    rather than refused (its connection no longer answers) raises :class:`DatabaseLost`:
    the run is handed back (:func:`_hand_back`), not failed. Only when the failed end's
    write fails too does the error propagate; the run's lease then lapses and the tick
    hands it on.
    """
    refusal: Exception | None = None
    for _ in range(2):
        try:
            with _refusable(store):
                return status, fields, _end_turn(store, run_id, owner, status, step, **fields)
        except Exception as error:
            logger.warning("run %r: the end of its turn was refused", run_id, exc_info=True)
            refusal = error
    assert refusal is not None
    if store.connection_lost(refusal):
        # Not refused: unreachable. Nothing of the run is at fault.
        raise DatabaseLost(one_line(refusal)) from refusal
    failed: dict[str, Any] = {
        **_RELEASED,
        "output": None,
        "error": unwritten_payload(status, refusal),
        "finished_at": timezone.now(),
        "wait": None,
        "wake_at": None,
    }
    with _refusable(store):
        held = store.transition(
            run_id, [RunStatus.RUNNING], RunStatus.FAILED, owner=owner, **failed
        )
    return RunStatus.FAILED, failed, held


def _hand_back(
    engine: Runtime,
    run: RunRecord,
    owner: str,
    why: str,
    cause: str = "the database went away during its turn",
) -> None:
    """After the database went away during a turn (or its time ran out): make the run
    pending again, and send it, if the database is back; if not, the run keeps its lease
    until it lapses and the tick hands it on. Either way the turn recorded nothing more,
    and its last step runs again on the next turn (steps run at least once)."""
    close_connections()
    try:
        handed = engine.store.transition(
            run.run_id,
            [RunStatus.RUNNING],
            RunStatus.PENDING,
            owner=owner,
            lease_owner="",
            lease_expires_at=None,
        )
    except DatabaseError as error:
        close_connections()
        logger.warning(
            "run %r: %s (%s); the database cannot be reached (%s), "
            "the run is handed on once its lease lapses",
            run.run_id,
            cause,
            why,
            one_line(error),
        )
        return
    logger.warning(
        "run %r: %s (%s); %s",
        run.run_id,
        cause,
        why,
        "handed back, to be replayed" if handed else "another worker or the tick has it",
    )
    if handed:
        engine.send_each((run,))


@contextlib.contextmanager
def _refusable(store: BaseStore) -> Iterator[None]:
    """A write the database may refuse. Inside a transaction of the caller's (a test's),
    in a savepoint, so that the transaction stays usable after a refusal; outside one, a
    connection the refusal broke is closed (MariaDB closes its end on a statement larger
    than ``max_allowed_packet``), so the next write opens a new one."""
    using = store.using
    if using is None:  # not a database of Django's
        yield
        return
    connection = connections[using]
    if connection.in_atomic_block:
        with store.atomic():
            yield
        return
    try:
        yield
    except Exception:
        if connection.connection is not None and not connection.is_usable():
            connection.close()
        raise


def _end_turn(
    store: BaseStore, run_id: str, owner: str, status: str, step: StepRecord | None, **fields: Any
) -> bool:
    """The holder's transition ending the turn, with the turn's unwritten record if any."""
    if step is None:
        return store.transition(run_id, [RunStatus.RUNNING], status, owner=owner, **fields)
    # One statement on PostgreSQL.
    return store.end_turn(run_id, owner, status, step, **fields)


def _run_body(body: Callable[[Any, Any], Any], context: Context) -> tuple[str, dict[str, Any]]:
    try:
        output = json_copy(
            body(context, context.input), f"the output of workflow {context.run.workflow!r}"
        )
    except Suspend as suspend:
        return RunStatus.SUSPENDED, {"wait": suspend.wait, "wake_at": suspend.wake_at}
    except StepError as error:
        # The run fails with what failed in the step, and says which step it was.
        failure = {**error.error, "step": error.name}
        failure.pop("retry_at", None)
        return RunStatus.FAILED, {"error": failure, "finished_at": timezone.now(), "wait": None}
    except BaseException as error:
        context._stop_if_time_up(error, "between steps")
        if not user_failure(error):
            raise
        return RunStatus.FAILED, {
            "error": error_payload(error),
            "finished_at": timezone.now(),
            "wait": None,
        }
    return RunStatus.COMPLETED, {
        "output": output,
        "error": None,
        "finished_at": timezone.now(),
        "wait": None,
    }


def _after_turn(engine: Runtime, run: RunRecord, status: str, wait: Any) -> None:
    """Wake whoever this turn's end concerns, closing the races with signals and children.

    A run that ended is announced (its parent woken). A run that just suspended on a
    signal already sent, or on a child already ended, wakes itself: the sender or the
    child may have looked for it a moment before it was suspended.
    """
    if status in TERMINAL_STATUSES:
        engine.finished(run, status)
        return
    if status != RunStatus.SUSPENDED or not wait:
        return
    if "signal" in wait and engine.store.has_signal(wait["signal"]):
        engine.wake(run.run_id)
    elif "child" in wait:
        child = engine.store.get_run(wait["child"])
        if child is not None and child.status in TERMINAL_STATUSES:
            engine.wake(run.run_id)


__all__ = ["execute_run", "worker_id"]
