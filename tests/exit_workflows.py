"""Workflows whose user code leaves (``sys.exit()``) or blocks, for the tests of a worker
facing them (tests/processes/test_base_exceptions_worker.py); the test module and the worker both
import them."""

from __future__ import annotations

import sys
import time

from durable_django import Concurrency, workflow

#: One run at a time: a run that ended frees the slot for the next.
ONE_AT_A_TIME = Concurrency(key=lambda input: "tests.exit", limit=1)


def leave(code: int) -> None:
    sys.exit(code)


def mark() -> str:
    return "started"


@workflow(name="tests.exit.leaves", concurrency=ONE_AT_A_TIME)
def leaves(ctx, input):
    """Exits in a step when ``input["exit"]``, else completes."""
    if input["exit"]:
        ctx.step("leave", leave, 3)
    return ctx.step("mark", mark)


@workflow(name="tests.exit.blocks")
def blocks(ctx, input):
    """Records a step, then blocks in the next one for ``input["seconds"]``."""
    ctx.step("mark", mark)
    ctx.step("block", time.sleep, input["seconds"])
    return "woke"
