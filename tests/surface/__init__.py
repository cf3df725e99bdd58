"""Tests of what a project touches: admin, HTTP, commands, checks, Django tasks, observability."""
