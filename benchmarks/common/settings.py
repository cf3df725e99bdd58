"""Minimal Django settings for the benchmarks (a PostgreSQL database of their own)."""

import os

SECRET_KEY = "benchmarks-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["durable_django"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("DURABLE_BENCH_DB", "durable_bench"),
        "USER": os.environ.get("DURABLE_BENCH_USER", "postgres"),
        "HOST": os.environ.get("DURABLE_BENCH_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DURABLE_BENCH_PORT", "5432"),
    }
}

CELERY_BROKER_URL = os.environ.get("DURABLE_BENCH_BROKER", "redis://127.0.0.1:6379/14")
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

DURABLE = {"QUEUE": "durable_bench", "ENQUEUE": True}
