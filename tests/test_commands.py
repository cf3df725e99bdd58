"""The durable_tick management command."""

from __future__ import annotations

import datetime
import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from durable_django import engine as default_engine
from durable_django.testing import run_until_idle


def tick(*args: str) -> str:
    out = io.StringIO()
    call_command("durable_tick", *args, stdout=out)
    return out.getvalue()


def test_tick_once_reports_what_it_handed_on(db):
    handle = default_engine.start("tests.plain", {})
    default_engine.store.transition(
        handle.run_id,
        ["pending"],
        "running",
        lease_owner="dead",
        lease_expires_at=timezone.now() - datetime.timedelta(seconds=1),
    )
    assert tick() == "woken 0, recovered 1, unblocked 0, resent 0\n"
    run_until_idle()
    assert handle.result() == {"got": {}}
    assert json.loads(tick("--json")) == {"woken": 0, "recovered": 0, "unblocked": 0, "resent": 0}


def test_tick_in_a_loop(db):
    lines = tick("--interval", "0.01", "--iterations", "3", "--json").splitlines()
    assert len(lines) == 3


@pytest.mark.parametrize("args", [["--interval", "0"], ["--interval", "1", "--iterations", "0"]])
def test_bad_arguments(db, args):
    with pytest.raises(CommandError):
        tick(*args)
