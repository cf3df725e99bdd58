"""The rules: quotas and the one admission decision, fair tickets, Django tasks'
options, schedule windows, the registry, retention.

Internal: import from ``durable_django``."""
