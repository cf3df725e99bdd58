"""The limits of what the store holds, in one place.

Text lengths are read from the model fields that hold the text, on first use (reading
them needs Django's app registry). A name that gets a prefix before it is stored (a quota
key in its tag ``concurrency:<key>``, a signal token or a child's workflow in a step name
``durable.signal:<token>``, ``durable.child:<workflow>``) is also held to what the column
leaves for it, so a legal name never makes a stored one too long; the prefixes are defined
here for that reason.

JSON values and quota limits have limits of their own, the same on every database:
``docs/databases.md`` says what each database refuses and why these numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.db.models import Model

MAX_JSON_DEPTH = 20
"""The deepest a JSON value may nest (a list in a list is two levels). MariaDB refuses
JSON nested 32 levels deep; the margin leaves room for a value wrapped in a record."""

MAX_JSON_BYTES = 2 * 1024 * 1024
"""The largest a JSON value may be: bytes of its JSON text as written to the database
(characters outside ASCII count as their ``\\uXXXX`` escapes). Well below MariaDB's
default ``max_allowed_packet`` of 16 MiB, which bounds a whole statement."""

MIN_LIMIT = -(2**31)
"""The lowest quota limit (any limit ``<= 0`` refuses every start)."""

MAX_LIMIT = 2**31 - 1
"""The highest quota limit. With :data:`MIN_LIMIT`, the range of Django's
``IntegerField`` (``Schedule.concurrency_limit``) and of the limit PostgreSQL's start
function takes: the same range on every database."""

#: The longest message and traceback a failed run's error keeps (characters).
MAX_ERROR_MESSAGE = 10_000
MAX_ERROR_TRACEBACK = 50_000

#: A run started under quota key ``K`` carries the tag ``concurrency:K``.
TAG_PREFIX = "concurrency:"

#: The names of the steps recording a signal and a child start: the prefix, then the
#: signal's token or the child's workflow name.
SIGNAL_STEP_PREFIX = "durable.signal:"
CHILD_STEP_PREFIX = "durable.child:"


@dataclass(frozen=True, slots=True)
class TextLengths:
    """The most characters each kind of text may have, read from its columns."""

    run_id: int
    workflow: int
    version: int
    namespace: int
    queue: int
    tag: int
    quota_key: int
    step_name: int
    signal_token: int
    schedule_key: int


@functools.cache
def text_lengths() -> TextLengths:
    """The lengths, read from the models once (the app registry must be ready)."""
    from django.db.models import CharField

    from .models import QuotaLock, Run, RunTag, Schedule, Signal, Step, model_field

    def length(model: type[Model], name: str) -> int:
        max_length = model_field(model, name, CharField).max_length
        assert max_length is not None, f"{model.__name__}.{name} has no max_length"
        return max_length

    def column(model: type[Model], *names: str) -> int:
        return min(length(model, name) for name in names)

    step_name = column(Step, "name")
    return TextLengths(
        # A run id is also kept as a child's parent, a signal's taker, a schedule's last run.
        run_id=min(
            column(Run, "id", "parent_id"),
            column(Signal, "consumed_by"),
            column(Schedule, "last_run_id"),
        ),
        workflow=min(
            column(Run, "workflow"),
            column(Schedule, "workflow"),
            step_name - len(CHILD_STEP_PREFIX),
        ),
        version=column(Run, "version"),
        namespace=min(column(Run, "namespace"), column(RunTag, "namespace")),
        queue=column(Run, "queue"),
        tag=column(RunTag, "tag"),
        quota_key=min(column(RunTag, "tag") - len(TAG_PREFIX), column(QuotaLock, "key")),
        step_name=step_name,
        signal_token=min(column(Signal, "token"), step_name - len(SIGNAL_STEP_PREFIX)),
        schedule_key=column(Schedule, "key"),
    )
