"""Durable runs against plain Celery tasks and Procrastinate jobs doing the same work:
``python -m benchmarks.execution``."""
