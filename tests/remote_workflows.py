"""The body of a remote workflow, for a worker that serves the remote workflow's queue.

A worker that imports this module registers the workflow named in
``DURABLE_TEST_REMOTE_WORKFLOW`` (version "1") as a local body; the process that starts
it has only a remote registration.
"""

from __future__ import annotations

import os

from durable_django import engine


def serve(ctx, input):
    return {"served_by": "remote", "input": input}


NAME = os.environ.get("DURABLE_TEST_REMOTE_WORKFLOW", "")

if NAME:
    engine.register(NAME, "1", serve)
