"""The values everything else is built on: what user code raises, the statuses, the
limits, the JSON rules, the records, the current context and the ``Runtime`` protocol.

Internal: import from ``durable_django``."""
