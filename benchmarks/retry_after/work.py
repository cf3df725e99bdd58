"""The runs of ``benchmarks.retry_after``: each sleeps for the seconds its input gives,
in one step, under a quota keyed by its input (limit ``LIMIT``)."""

from __future__ import annotations

import time
from typing import Any

from durable_django import Concurrency, workflow

#: The quota's limit; the script's worker executes this many runs at once.
LIMIT = 2


def work(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@workflow(
    name="bench.sleep",
    version="1",
    concurrency=Concurrency(key=lambda input: input["key"], limit=LIMIT),
)
def sleep(ctx: Any, input: dict[str, Any]) -> float:
    return float(ctx.step("work", work, input["seconds"]))
