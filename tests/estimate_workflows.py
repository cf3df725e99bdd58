"""The workflow the real-worker test of ``retry_after`` starts; the test module and the
worker both import it."""

from __future__ import annotations

import time

from durable_django import Concurrency, workflow


def pause(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@workflow(
    name="tests.estimate.nap",
    concurrency=Concurrency(key=lambda input: input["key"], limit=1),
)
def nap(ctx, input):
    return ctx.step("pause", pause, input["seconds"])
