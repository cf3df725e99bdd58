"""``manage.py durable quota`` and operators' overrides: each key's override shown beside
its limit (for people and in ``--json``), and ``--set KEY=LIMIT`` / ``--pause KEY`` /
``--clear KEY`` (``--rate`` for a rate limit key, ``--until`` a duration or an ISO 8601
time) writing them; bad input refused with a CommandError naming it, nothing stored."""

from __future__ import annotations

import datetime

import pytest
from django.core.management import CommandError
from django.utils import timezone

from durable_django import engine as default_engine
from durable_django.management.cli.base import when

from ..helpers import durable, durable_json


def start_echo(key: str = "tenant:acme") -> str:
    return default_engine.start("tests.echo", {"key": key, "text": "hi"}).run_id


def test_set_limits_a_key_and_the_table_shows_the_override(db):
    for _ in range(2):
        start_echo("tenant:acme")
    start_echo("tenant:globex")
    assert durable("quota", "--set", "tenant:acme=2") == (
        "Limited concurrency key tenant:acme to 2.\n"
    )
    (override,) = default_engine.overrides()
    assert (override.key, override.kind, override.limit, override.until) == (
        "tenant:acme",
        "concurrency",
        2,
        None,
    )
    assert durable("quota") == (
        "KEY            ACTIVE  LIMIT  OVERRIDE  USE                WORKFLOWS\n"
        "tenant:acme         2      3  2         [##########] full  tests.echo\n"
        "tenant:globex       1      3  -         [###-------]  33%  tests.echo\n"
    )
    (acme,) = durable_json("quota", "tenant:acme")
    assert (acme["limit"], acme["limit_in_force"], acme["full"]) == (3, 2, True)
    assert acme["override"]["limit"] == 2
    assert (acme["override"]["until"], acme["override"]["paused"]) == (None, False)
    assert acme["override"]["changed_at"]


def test_pause_until_a_duration_and_an_idle_key_is_shown(db):
    before = timezone.now()
    out = durable("quota", "--pause", "tenant:quiet", "--until", "1h30m")
    (override,) = default_engine.overrides()
    assert override.paused and override.until is not None
    expected = datetime.timedelta(hours=1, minutes=30)
    assert before + expected <= override.until <= timezone.now() + expected
    assert out == f"Paused concurrency key tenant:quiet until {when(override.until)}.\n"
    header, row = durable("quota").splitlines()
    assert header.split() == ["KEY", "ACTIVE", "LIMIT", "OVERRIDE", "USE", "WORKFLOWS"]
    cells = [cell.strip() for cell in row.split("  ") if cell.strip()]
    assert cells == [
        "tenant:quiet",
        "0",
        "-",
        f"paused until {when(override.until)}",
        "[##########] full",
        "-",
    ]
    (quiet,) = durable_json("quota")
    assert (quiet["key"], quiet["limit_in_force"], quiet["full"]) == ("tenant:quiet", 0, True)
    assert quiet["override"]["paused"] is True
    assert quiet["override"]["until"] == override.until.isoformat()


def test_an_iso_until_and_the_json_of_a_write(db):
    until = "2999-01-02T03:04:05+02:00"
    written = durable_json("quota", "--set", "tenant:acme=7", "--until", until)
    assert written["action"] == "set"
    assert (written["kind"], written["key"]) == ("concurrency", "tenant:acme")
    assert written["override"]["limit"] == 7
    assert datetime.datetime.fromisoformat(written["override"]["until"]) == (
        datetime.datetime.fromisoformat(until)
    )
    assert durable_json("quota", "--clear", "tenant:acme") == {
        "action": "clear",
        "kind": "concurrency",
        "key": "tenant:acme",
        "cleared": True,
    }
    assert default_engine.overrides() == []


def test_rate_acts_on_the_rate_key(db):
    out = durable("quota", "--rate", "--set", "calls:acme=5", "--until", "2d")
    assert out.startswith("Limited rate key calls:acme to 5 until ")
    (override,) = default_engine.overrides()
    assert (override.kind, override.limit) == ("rate", 5)
    lines = durable("quota").splitlines()
    assert lines[0] == "No quota key holds active runs."
    assert lines[2].split() == [
        "RATE",
        "KEY",
        "USED",
        "LIMIT",
        "OVERRIDE",
        "PER",
        "USE",
        "NEXT",
        "UNIT",
        "WORKFLOWS",
    ]
    assert lines[3].split()[:4] == ["calls:acme", "0", "-", "5"]
    (rate,) = durable_json("quota")
    assert (rate["kind"], rate["limit_in_force"], rate["override"]["limit"]) == ("rate", 5, 5)
    # A concurrency key's clear does not touch the rate key's override.
    assert durable("quota", "--clear", "calls:acme") == (
        "Concurrency key calls:acme had no override: nothing cleared.\n"
    )
    assert durable("quota", "--clear", "calls:acme", "--rate") == (
        "Cleared the override of rate key calls:acme: its declared limit applies.\n"
    )
    assert default_engine.overrides() == []


def test_pause_of_a_rate_key_shows_paused(db):
    durable("quota", "--pause", "calls:acme", "--rate")
    (rate,) = durable_json("quota")
    assert (rate["limit_in_force"], rate["full"], rate["override"]["paused"]) == (0, True, True)
    row = durable("quota").splitlines()[3].split()
    assert (row[0], row[3], row[-2]) == ("calls:acme", "paused", "paused")  # OVERRIDE, NEXT UNIT


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "tenant:acme"], "--set takes KEY=LIMIT (tenant:acme=20), not 'tenant:acme'"),
        (["--set", "=3"], "--set takes KEY=LIMIT (tenant:acme=20), not '=3'"),
        (["--set", "tenant:acme=many"], "the limit must be a whole number, not 'many'"),
        (["--set", "tenant:acme=-1"], "an override's limit must be between 0 and"),
        (["--set", "tenant:acme=3", "--until", "soon"], "--until takes a duration"),
        (["--set", "tenant:acme=3", "--until", "2999-01-01T00:00"], "has no UTC offset"),
        (["--pause", "tenant:acme", "--until", "2000-01-01T00:00+00:00"], "is not in the future"),
        (["--pause", "tenant:acme", "--until", "0m"], "is not in the future"),
        (["--pause", ""], "concurrency key"),
        (["--clear", "tenant:acme", "--until", "2h"], "--until goes with --set or --pause"),
        (["--rate"], "--rate goes with --set, --pause or --clear"),
        (["--until", "2h"], "--until goes with --set, --pause or --clear"),
        (["tenant:acme", "--pause", "tenant:acme"], "KEY does not go with --pause"),
        (["--estimate", "--clear", "tenant:acme"], "--estimate does not go with --clear"),
        (["--set", "tenant:acme=3", "--pause", "tenant:acme"], "not allowed with argument"),
    ],
)
def test_bad_input_is_refused_and_nothing_stored(db, args, message):
    with pytest.raises(CommandError, match=None) as raised:
        durable("quota", *args)
    assert message in str(raised.value)
    assert default_engine.overrides() == []
