"""The limits of what the store holds, in one place.

Text lengths are the lengths of the columns that hold the text: the models take them from
here (``CharField(max_length=limits.RUN_ID)``), and the migrations say the same. A name
that gets a prefix before it is stored (a quota key in its tag ``concurrency:<key>``, a
signal token or a child's workflow in a step name ``durable.signal:<token>``,
``durable.child:<workflow>``) is also held to what the column leaves for it, so a legal
name never makes a stored one too long; the prefixes are defined here for that reason.

JSON values and quota limits have limits of their own, the same on every database:
``docs/databases.md`` says what each database refuses and why these numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

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

# The columns' lengths (characters). A run id is also kept as a child's parent, a signal's
# taker and a schedule's last run; a namespace also on each tag and kept ticket; a quota
# key as a quota lock's and a kept ticket's key.
RUN_ID = 255
WORKFLOW = 200
VERSION = 64
NAMESPACE = 100
QUEUE = 200
TAG = 255
QUOTA_KEY = 255
STEP_NAME = 200
SIGNAL_TOKEN = 255
SCHEDULE_KEY = 200
#: A schedule's cron expression, its timezone's name, and the quota key of its own.
SCHEDULE_CRON = 200
TIMEZONE = 64
SCHEDULE_QUOTA_KEY = 200
#: The highest schedule interval (seconds): the top of a ``PositiveIntegerField``.
MAX_INTERVAL = 2**31 - 1

#: A run started under quota key ``K`` carries the tag ``concurrency:K``.
TAG_PREFIX = "concurrency:"

#: A run started under rate limit key ``K`` carries the tag ``rate:K``.
RATE_TAG_PREFIX = "rate:"

#: The names of the steps recording a signal and a child start: the prefix, then the
#: signal's token or the child's workflow name.
SIGNAL_STEP_PREFIX = "durable.signal:"
CHILD_STEP_PREFIX = "durable.child:"


@dataclass(frozen=True, slots=True)
class TextLengths:
    """The most characters each kind of text may have."""

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
    """The lengths: each column's, less the prefix a name gets where it is stored."""
    return TextLengths(
        run_id=RUN_ID,
        workflow=min(WORKFLOW, STEP_NAME - len(CHILD_STEP_PREFIX)),
        version=VERSION,
        namespace=NAMESPACE,
        queue=QUEUE,
        tag=TAG,
        quota_key=min(TAG - len(TAG_PREFIX), QUOTA_KEY),
        step_name=STEP_NAME,
        signal_token=min(SIGNAL_TOKEN, STEP_NAME - len(SIGNAL_STEP_PREFIX)),
        schedule_key=SCHEDULE_KEY,
    )
