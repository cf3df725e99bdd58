"""System checks."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import override_settings

from durable_django.checks import check_databases, check_settings, database_warnings
from durable_django.engines import default_engine


def ids(messages):
    return [m.id for m in messages]


def sqlite(**options):
    return {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x", "OPTIONS": options}}


def test_sqlite_without_a_write_locking_mode_is_warned():
    messages = database_warnings(sqlite())
    assert ids(messages) == ["durable_django.W001"]
    assert "transaction_mode" in messages[0].hint
    assert database_warnings(sqlite(transaction_mode="IMMEDIATE")) == []


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_a_stricter_isolation_level_is_warned(level):
    databases = {
        "default": {"ENGINE": "django.db.backends.mysql", "OPTIONS": {"isolation_level": level}}
    }
    assert ids(database_warnings(databases)) == ["durable_django.E002"]


def test_read_committed_is_fine():
    databases = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "OPTIONS": {"isolation_level": "read committed"},
        },
        "other": {"ENGINE": "django.db.backends.mysql"},
    }
    assert database_warnings(databases) == []


def test_the_suite_databases_pass():
    assert check_databases() == []


def test_unknown_durable_settings_are_errors():
    try:
        with override_settings(DURABLE={"STOER": "x"}):
            messages = check_settings()
        assert ids(messages) == ["durable_django.E001"]
        assert "STOER" in messages[0].msg
        with override_settings(DURABLE={"STORE": "no.such.Store"}):
            assert "cannot import 'no.such.Store'" in check_settings()[0].msg
    finally:
        default_engine.reload()


def test_the_suite_settings_pass_every_check(db):
    call_command("check", "--fail-level", "WARNING")
