"""The example site's settings for ``benchmarks.http_load``: its own URLs (the API's
turns plus a plain view), its queue, and its database from the environment."""

from chatsite.settings import *  # noqa: F403

ROOT_URLCONF = "benchmarks.http_load.urls"
CELERY_TASK_DEFAULT_QUEUE = "durable_bench_http"
DURABLE = {**DURABLE, "QUEUE": "durable_bench_http"}  # noqa: F405
