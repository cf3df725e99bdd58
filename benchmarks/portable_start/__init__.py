"""A quota start on MariaDB, SQLite and the portable path against PostgreSQL's:
``python -m benchmarks.portable_start``."""
