"""Workflows the recovery tests start; the test module and the workers both import them.

Every step appends its name to a side-effect log (a file of the run's own, named in
its input), so a test can count how many times each step really ran, whatever the
store recorded. A blocking step waits for a release file to appear.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from durable_django import workflow

#: How long a blocking step waits for its release file before it gives up.
BLOCK_LIMIT = 120.0


def log_lines(path: str | Path) -> list[str]:
    """The names the steps appended to the log at ``path``, in order."""
    try:
        return Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []


def append(log: str, line: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def mark(log: str, name: str) -> str:
    """A step with a side effect: one line in the log."""
    append(log, name)
    return name


def hold_file(release: str | Path, pid: int) -> str:
    """While this file exists, the process ``pid`` stays in a released blocking step."""
    return f"{release}.hold.{pid}"


def _wait(until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BLOCK_LIMIT
    while not until():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {BLOCK_LIMIT}s")
        time.sleep(0.02)


def block(log: str, name: str, release: str) -> str:
    """A step that logs its start, then waits until the file ``release`` exists (and,
    in a process a test holds back, until its hold file is gone)."""
    append(log, name)
    _wait(lambda: os.path.exists(release), f"{release} did not appear")
    hold = hold_file(release, os.getpid())
    _wait(lambda: not os.path.exists(hold), f"{hold} was not removed")
    return name


@workflow(name="tests.recovery.abc")
def abc(ctx, input):
    """Steps A, B and C; B blocks until its release file appears."""
    a = ctx.step("A", mark, input["log"], "A")
    b = ctx.step("B", block, input["log"], "B", input["release"])
    c = ctx.step("C", mark, input["log"], "C")
    return {"steps": [a, b, c]}


@workflow(name="tests.recovery.once")
def once(ctx, input):
    """Two plain steps."""
    return {
        "steps": [ctx.step("A", mark, input["log"], "A"), ctx.step("B", mark, input["log"], "B")]
    }


@workflow(name="tests.recovery.sleeper")
def sleeper(ctx, input):
    """A step, a durable sleep, a step."""
    ctx.step("A", mark, input["log"], "A")
    ctx.sleep(input["seconds"])
    ctx.step("B", mark, input["log"], "B")
    return {"slept": input["seconds"]}


@workflow(name="tests.recovery.waiter")
def waiter(ctx, input):
    """Waits for the signal ``input["token"]`` and returns its payload."""
    ctx.step("A", mark, input["log"], "A")
    payload = ctx.wait_for_signal(input["token"])
    ctx.step("B", mark, input["log"], "B")
    return {"got": payload}


@workflow(name="tests.recovery.child")
def child(ctx, input):
    """A child that blocks until its release file appears."""
    ctx.step("child", block, input["log"], "child", input["release"])
    return {"child_of": ctx.run.parent_id, "value": input["value"]}


@workflow(name="tests.recovery.parent")
def parent(ctx, input):
    """Runs a child and returns what it returned."""
    ctx.step("before", mark, input["log"], "before")
    output = ctx.child(child, {"log": input["log"], "release": input["release"], "value": 7})
    ctx.step("after", mark, input["log"], "after")
    return {"from_child": output}


def write_and_mark(log: str, name: str) -> str:
    """A step that writes a row of the store's database (a ``Signal`` under the log's
    path) and logs its name: the row commits with the step's transaction, or not at all;
    the log line is written whatever happens."""
    from durable_django.models import Signal

    Signal.objects.create(token=f"written:{log}", payload=name)
    return mark(log, name)


def _write_then_block(ctx, input, call):
    call("W", write_and_mark, input["log"], "W")
    # The body's own code, between two durable calls: a worker may die here.
    block(input["log"], "body", input["release"])
    ctx.step("C", mark, input["log"], "C")
    return {"done": True}


@workflow(name="tests.recovery.transaction_then_block")
def transaction_then_block(ctx, input):
    """A transactional step writing a row, then the body blocks until released."""
    return _write_then_block(ctx, input, ctx.transaction)


@workflow(name="tests.recovery.step_then_block")
def step_then_block(ctx, input):
    """The same with a plain step: its record waits for the next durable call."""
    return _write_then_block(ctx, input, ctx.step)
