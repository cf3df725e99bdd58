"""Workflows the fault tests start; the test modules and the workers both import them.

Every step appends ``"<name> <pid>"`` to a log file of its run (named in its input) and
returns that line, so a test can tell which process ran each step, and how often.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from durable_django import workflow

from .recovery_workflows import BLOCK_LIMIT, append


def mark(log: str, name: str) -> str:
    """A step with a side effect: ``"<name> <pid>"`` in the log."""
    line = f"{name} {os.getpid()}"
    append(log, line)
    return line


def block(log: str, name: str, release: str) -> str:
    """A long step: logs its start, then waits until the file ``release`` exists."""
    line = mark(log, name)
    deadline = time.monotonic() + BLOCK_LIMIT
    while not Path(release).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} did not appear within {BLOCK_LIMIT}s")
        time.sleep(0.02)
    return line


@workflow(name="tests.faults.long_step")
def long_step(ctx, input):
    """Steps A, B and C; B lasts until its release file appears."""
    return {
        "steps": [
            ctx.step("A", mark, input["log"], "A"),
            ctx.step("B", block, input["log"], "B", input["release"]),
            ctx.step("C", mark, input["log"], "C"),
        ]
    }


@workflow(name="tests.faults.quick")
def quick(ctx, input):
    """One step."""
    return {"steps": [ctx.step("A", mark, input["log"], "A")]}
