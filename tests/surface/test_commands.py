"""``manage.py durable tick``: the engine's tick, once or in a loop."""

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
    call_command("durable", "tick", *args, stdout=out)
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
    assert tick().startswith("woken 0, recovered 1, unblocked 0, resent 0")
    run_until_idle()
    assert handle.result() == {"got": {}}
    counts = json.loads(tick("--json"))
    assert counts["recovered"] == 0
    assert set(counts) >= {"woken", "recovered", "unblocked", "resent"}
    assert not any(counts.values())


def test_tick_in_a_loop(db):
    lines = tick("--interval", "0.01", "--iterations", "3", "--json").splitlines()
    assert len(lines) == 3
    # For people, a loop prints only the ticks that did something.
    assert tick("--interval", "0.01", "--iterations", "2") == ""


@pytest.mark.parametrize(
    "args",
    [["--interval", "0"], ["--interval", "1", "--iterations", "0"], ["--iterations", "2"]],
)
def test_bad_arguments(db, args):
    with pytest.raises(CommandError):
        tick(*args)


def test_the_old_command_is_gone(db):
    with pytest.raises(CommandError, match="Unknown command: 'durable_tick'"):
        call_command("durable_tick")
