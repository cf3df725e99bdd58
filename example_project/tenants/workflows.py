"""The chat turn workflow, discovered by durable_django at startup.

Every turn of a tenant is started under the concurrency key ``tenant:<slug>``, and the
limit is read from the tenant's plan when the turn starts: a tenant on a plan with
``max_active_turns=8`` can have 8 turns pending or running; the ninth start is refused at
once with ``ConcurrencyLimitError`` (the view answers 429) and creates nothing.
"""

import time

from django.conf import settings

from durable_django import BaseWorkflow, Concurrency, workflow

from .models import QUOTA_KEY_PREFIX, Message, Plan, Tenant, quota_key


def max_active_turns(key: str) -> int:
    """The limit for quota key ``tenant:<slug>``: the tenant's plan's ``max_active_turns``."""
    slug = key.removeprefix(QUOTA_KEY_PREFIX)
    return Plan.objects.values_list("max_active_turns", flat=True).get(tenants__slug=slug)


def generate_reply(message: str) -> str:
    """Stand-in for a language model: deterministic, and slow enough to hold a slot."""
    time.sleep(settings.CHAT_REPLY_SECONDS)
    words = message.split()
    return f"You said {len(words)} word(s); backwards: {' '.join(reversed(words))}"


def store_reply(run_id: str, slug: str, prompt: str, reply: str) -> int:
    """Save the exchange; keyed on the run, so doing it twice stores it once."""
    message, _ = Message.objects.update_or_create(
        run_id=run_id,
        defaults={"tenant": Tenant.objects.get(slug=slug), "prompt": prompt, "reply": reply},
    )
    return message.pk


@workflow(
    name="chat.turn",
    version="1",
    concurrency=Concurrency(key=lambda input: quota_key(input["tenant"]), limit=max_active_turns),
)
class ChatTurnWorkflow(BaseWorkflow):
    """One chat turn: generate the reply, then store it."""

    def run(self, ctx, input):
        reply = ctx.step("generate", generate_reply, input["message"])
        message_id = ctx.step(
            "store", store_reply, ctx.run_id, input["tenant"], input["message"], reply
        )
        return {"reply": reply, "message_id": message_id}
