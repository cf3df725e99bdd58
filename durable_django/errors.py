"""The errors durable_django raises; all derive from :class:`DurableError`."""

from __future__ import annotations

from typing import Any

#: The fewest seconds ``ConcurrencyLimitError.retry_after`` says, and what it says when no
#: estimate could be made.
DEFAULT_RETRY_AFTER = 1.0


class DurableError(Exception):
    """Base class of every error durable_django raises on purpose."""


class ConcurrencyLimitError(DurableError):
    """A start was refused because its quota key already holds ``limit`` active runs.

    Nothing was created: no run row, no tag row, no message.

    ``retry_after`` is the seconds (a float, at least 1) until a slot of the key is likely
    to free, estimated from the key's recent history once the refused start's transaction
    has ended; ``estimate`` says how it was reached (a
    :class:`durable_django._runtime.estimates.Estimate`, ``None`` when the error was made without
    one, and ``retry_after`` is then :data:`DEFAULT_RETRY_AFTER`). ``holders()`` lists
    the runs holding the key now.

    Under a fair quota (:mod:`durable_django._rules.tickets`), ``ticket`` is the refused start's
    place in the key's line, to present on its retry (``None`` otherwise, and for
    starts that cannot retry with one: children, events, schedules, batches); ``held``
    is the units of the limit held for older tickets (0 when none), which the start
    did not fit beside.
    """

    def __init__(
        self,
        workflow: str,
        key: str,
        limit: int,
        active: int,
        retry_after: float = 0,
        estimate: Any = None,
        held: int = 0,
        ticket: str | None = None,
    ) -> None:
        self.workflow = workflow
        self.key = key
        self.limit = limit
        self.active = active
        self.retry_after = max(float(retry_after), DEFAULT_RETRY_AFTER)
        self.estimate = estimate
        self.held = held
        self.ticket = ticket
        self.engine: Any = None  # the engine that refused the start, for holders()
        self.line: Any = None  # a fair quota's line as the refusal saw it (tickets.Line)
        for_tickets = f", {held} held for older tickets" if held else ""
        super().__init__(
            f"workflow {workflow!r} refused: concurrency key {key!r} has "
            f"{active} active run(s), limit is {limit}{for_tickets}"
        )

    def holders(self) -> list[Any]:
        """The runs holding the key now, oldest first: ``engine.quota_holders(key)`` of
        the engine that refused the start. An error that never went through a start (one
        unpickled, or made by hand) knows no engine: ask one with
        ``engine.quota_holders(error.key)``."""
        if self.engine is None:
            raise DurableError(
                f"this refusal of key {self.key!r} knows no engine (it was unpickled or made "
                f"by hand): call engine.quota_holders({self.key!r}) on the engine to ask"
            )
        return list(self.engine.quota_holders(self.key))

    def __reduce__(self) -> Any:
        return (
            type(self),
            (
                self.workflow,
                self.key,
                self.limit,
                self.active,
                self.retry_after,
                self.estimate,
                self.held,
                self.ticket,
            ),
        )


class RateLimitError(ConcurrencyLimitError):
    """A start was refused because its rate limit key already holds ``limit`` units
    started in the last ``per`` seconds (``active`` of them).

    Nothing was created. ``retry_after`` is exact, read from the runs in the window: the
    seconds until enough of the window's oldest units leave it for this start to fit (a
    start made then is admitted, unless others came first; one made earlier is
    refused). A limit no start can fit (``limit <= 0``, or below the start's weight)
    says ``per``. Catching :class:`ConcurrencyLimitError` catches this too.
    """

    def __init__(
        self,
        workflow: str,
        key: str,
        limit: int,
        active: int,
        per: float,
        retry_after: float,
    ) -> None:
        super().__init__(workflow, key, limit, active)
        self.per = float(per)
        self.retry_after = float(retry_after)
        self.args = (
            f"workflow {workflow!r} refused: rate limit key {key!r} has {active} unit(s) "
            f"started in the last {self.per:g} s, limit is {limit}; retry after "
            f"{self.retry_after:g} s",
        )

    def __reduce__(self) -> Any:
        return (
            type(self),
            (self.workflow, self.key, self.limit, self.active, self.per, self.retry_after),
        )


class UnstorableValueError(DurableError, TypeError, ValueError):
    """A value the store cannot hold: not JSON, or text with a NUL character or a lone
    surrogate, or JSON nested too deep or too large (see :mod:`durable_django._core.limits`).

    ``what`` names the value (``"the input of workflow 'x'"``), ``path`` where in it the
    problem is (``"$.a[3].b"``; ``"$"`` for the whole value), ``rule`` the rule it breaks.
    Raised before anything is written. Also a ``TypeError`` (what a value that is not
    JSON raised before) and a ``ValueError``.
    """

    def __init__(self, what: str, path: str, rule: str) -> None:
        self.what = what
        self.path = path
        self.rule = rule
        where = "" if path == "$" else f" at {path}"
        super().__init__(f"{what} cannot be stored{where}: {rule}")

    def __reduce__(self) -> Any:
        return (type(self), (self.what, self.path, self.rule))


class ChildWorkflowError(DurableError):
    """A child run failed, or its start was refused; ``cause`` holds the reason."""

    def __init__(self, message: str, *, child_id: str | None = None, cause: Any = None) -> None:
        self.child_id = child_id
        self.cause = cause
        super().__init__(message)


class RunNotFound(DurableError, LookupError):
    """No run has the given id (in the namespace this engine may read)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run with id {run_id!r}")


class WorkflowNotFound(DurableError, LookupError):
    """No workflow is registered under the given name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no workflow registered under the name {name!r}")


class RunFailed(DurableError):
    """Raised by ``RunHandle.result()`` when the run ended failed or cancelled."""

    def __init__(self, run_id: str, status: str, error: Any) -> None:
        self.run_id = run_id
        self.status = status
        self.error = error
        detail = error.get("message") if isinstance(error, dict) else error
        super().__init__(f"run {run_id!r} ended {status}: {detail}")


class RunTimeout(DurableError, TimeoutError):
    """A wait for a run to settle ran out of time; the run goes on."""


class StepError(DurableError):
    """A step failed (after its retries); ``error`` holds the recorded type and message."""

    def __init__(self, name: str, error: dict[str, Any]) -> None:
        self.name = name
        self.error = error
        super().__init__(f"step {name!r} failed: {error.get('type')}: {error.get('message')}")


class SignalTimeout(DurableError, TimeoutError):
    """``ctx.wait_for_signal`` ran out of time before a signal came."""


class NonDeterminismError(DurableError):
    """A replay reached a different durable call than the one recorded at that position."""
