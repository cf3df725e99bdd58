"""What the benchmarks share: the base Django settings, a database made anew, and the
execution workload (settings, Celery app and work) that ``benchmarks.execution``,
``benchmarks.retry_after``, ``benchmarks/instrumentation.py`` and ``benchmarks/turn_wal.py``
run."""
