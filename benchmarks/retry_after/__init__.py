"""How close a refusal's ``retry_after`` is to when a slot truly frees:
``python -m benchmarks.retry_after``."""
