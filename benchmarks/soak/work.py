"""The workflow ``benchmarks.soak`` starts: a few short steps, and by its input a durable
sleep, a wait for a signal, a child run or a failing step.

Its quota key is ``input["key"]``, which ends with the key's limit (``soak:a:2`` admits
two runs at once), so that every process computes the same limit with no shared state.
"""

from __future__ import annotations

import contextlib
import random
import time

from durable_django import Concurrency, workflow
from durable_django._runtime.execution import SignalTimeout

KINDS = ("plain", "sleep", "signal", "child", "fail")


def key_limit(key: str) -> int:
    """The limit a soak key declares: its last field."""
    return int(key.rsplit(":", 1)[1])


def work(milliseconds: int) -> int:
    """A step's body: busy for about ``milliseconds``."""
    time.sleep(milliseconds / 1000 * random.uniform(0.5, 1.5))
    return milliseconds


def broken() -> None:
    raise RuntimeError("the soak's failing step")


@workflow(name="soak.child", version="1")
def child(ctx, input):
    return ctx.step("child work", work, input["ms"])


@workflow(
    name="soak.turn",
    version="1",
    concurrency=Concurrency(key=lambda input: input["key"], limit=key_limit),
)
def turn(ctx, input):
    ctx.step("first", work, input["ms"])
    kind = input["kind"]
    if kind == "sleep":
        ctx.sleep(0.3)
    elif kind == "signal":
        with contextlib.suppress(SignalTimeout):
            ctx.wait_for_signal(f"soak:{ctx.run_id}", timeout=1.0)
    elif kind == "child":
        ctx.child("soak.child", {"ms": input["ms"]})
    elif kind == "fail":
        ctx.step("broken", broken)
    ctx.step("second", work, input["ms"])
    return {"kind": kind}
