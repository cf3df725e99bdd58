"""Workflows the worker tests start; the test module and the worker both import them."""

from __future__ import annotations

from durable_django import workflow


class PaymentDeclined(Exception):
    """The error the failing workflow raises."""


def add(a: int, b: int) -> int:
    return a + b


def decline(amount: int) -> None:
    raise PaymentDeclined(f"card declined for {amount}")


@workflow(name="tests.worker.total")
def total(ctx, input):
    return {"total": ctx.step("add", add, input["a"], input["b"])}


@workflow(name="tests.worker.charge")
def charge(ctx, input):
    amount = ctx.step("add", add, input["amount"], 0)
    ctx.step("decline", decline, amount)
    return {"charged": amount}
