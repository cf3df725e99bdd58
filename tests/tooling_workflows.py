"""Workflows of the Celery tooling tests; the test module and its worker import them."""

from __future__ import annotations

import os
import time

from durable_django import workflow


def wait_for(path: str) -> str:
    """Block until the file at ``path`` exists (the test creates it to let the step end)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "released"


@workflow(name="tests.tooling.held")
def held(ctx, input):
    return ctx.step("wait", wait_for, input["release"])


@workflow(name="tests.tooling.urgent", priority=3)
def urgent(ctx, input):
    return input


def pause(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@workflow(name="tests.tooling.four_steps")
def four_steps(ctx, input):
    return sum(ctx.step(f"pause {n}", pause, input["seconds"]) for n in range(4))
