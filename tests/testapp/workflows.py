"""Workflows the test suite declares, discovered like a project's own."""

from durable_django import BaseWorkflow, Concurrency, workflow


def shout(text: str) -> str:
    return text.upper()


@workflow(
    name="tests.echo",
    version="1",
    concurrency=Concurrency(key=lambda input: input.get("key"), limit=3),
)
class EchoWorkflow(BaseWorkflow):
    def run(self, ctx, input):
        loud = ctx.step("shout", shout, input.get("text", ""))
        return {"echo": loud}


@workflow(name="tests.plain")
def plain(ctx, input):
    return {"got": input}
