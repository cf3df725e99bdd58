"""Benchmark scripts; each prints a table. Run them from the repository root."""
