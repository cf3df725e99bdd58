"""System checks."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from celery import Celery
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

from durable_django._rules.registry import make_definition
from durable_django.checks import (
    CELERY_DEFAULT_BROKER,
    broker_errors,
    celery_warnings,
    check_celery,
    check_settings,
    check_store,
    check_workflows,
    quota_warnings,
)
from durable_django.engines import default_engine
from durable_django.stores import MemoryStore, OrmStore
from durable_django.stores.database_checks import database_warnings

from ..helpers import echo


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
    assert check_store() == []


@pytest.mark.django_db
def test_the_suite_database_has_the_collations_of_ids_and_keys():
    """On MySQL/MariaDB the migrations gave them; elsewhere there is nothing to check.
    (``test_exact_comparison`` shows the error.)"""
    assert check_store(databases=["default"]) == []
    assert OrmStore().check(databases=["default"]) == []


def test_the_orm_store_checks_its_own_database_only():
    loose = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding setting DATABASES ...": read only here
        with override_settings(DATABASES={**settings.DATABASES, "loose": loose}):
            assert check_store() == []  # the default engine's store is on "default"
            messages = OrmStore(using="loose").check()
    assert ids(messages) == ["durable_django.W001"]
    assert "database 'loose' is SQLite" in messages[0].msg


class CheckedStore(MemoryStore):
    """A store with a check of its own."""

    def check(self, **kwargs):
        databases = kwargs.get("databases")
        return [checks.Warning(f"checked with databases={databases}", id="tests.W001")]


def test_the_check_asks_the_configured_store():
    try:
        with override_settings(
            DURABLE={"STORE": "tests.surface.test_checks.CheckedStore", "ENQUEUE": False}
        ):
            default_engine.reload()
            assert [m.msg for m in check_store()] == ["checked with databases=None"]
            [message] = check_store(databases=["default"])
            assert message.msg == "checked with databases=['default']"
            default_engine.reload()
            with override_settings(DURABLE={"STORE": "durable_django.stores.MemoryStore"}):
                assert check_store() == []  # a store without checks of its own
    finally:
        default_engine.reload()


def test_a_store_that_is_not_a_base_store_is_refused():
    try:
        with override_settings(DURABLE={"STORE": "collections.OrderedDict"}):
            [message] = check_settings()
        assert message.id == "durable_django.E001"
        assert "must be an instance of durable_django.stores.BaseStore" in message.msg
    finally:
        default_engine.reload()


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


# Celery ---------------------------------------------------------------------------------


@pytest.fixture
def no_broker_in_the_environment(monkeypatch):
    # Celery reads the broker from the environment before its configuration.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)


def test_no_celery_app_loaded_is_warned(no_broker_in_the_environment):
    # What Celery makes when no app was created in the process.
    fallback = Celery("default", fixups=[], set_as_current=False)
    messages = celery_warnings(fallback)
    assert ids(messages) == ["durable_django.W002"]
    assert "config_from_object" in messages[0].hint


def test_no_broker_configured_is_warned(no_broker_in_the_environment):
    app = Celery("project", set_as_current=False)
    with override_settings():
        del settings.CELERY_BROKER_URL
        messages = celery_warnings(app)
    assert ids(messages) == ["durable_django.W003"]
    assert "no Celery broker is configured" in messages[0].msg


def test_an_app_ignoring_the_broker_setting_is_warned(no_broker_in_the_environment):
    app = Celery("project", set_as_current=False)  # not configured from the settings
    with override_settings(CELERY_BROKER_URL="redis://127.0.0.1:6379/0"):
        messages = celery_warnings(app)
    assert ids(messages) == ["durable_django.W008"]
    assert "does not use settings.CELERY_BROKER_URL" in messages[0].msg


def test_a_celery_configuration_that_does_not_load_is_warned(no_broker_in_the_environment):
    app = Celery("project", set_as_current=False)
    app.config_from_object("tests.no_such_celery_settings_module")
    messages = celery_warnings(app)
    assert ids(messages) == ["durable_django.W009"]
    assert "cannot read the broker of Celery app 'project'" in messages[0].msg


def test_a_configured_broker_passes(no_broker_in_the_environment):
    assert celery_warnings(Celery("project", broker="redis://x:6379/0", set_as_current=False)) == []
    from_settings = Celery("project", set_as_current=False)
    from_settings.config_from_object("django.conf:settings", namespace="CELERY")
    assert celery_warnings(from_settings) == []
    # RabbitMQ on localhost, named on purpose.
    local = Celery("project", broker=CELERY_DEFAULT_BROKER, set_as_current=False)
    with override_settings(CELERY_BROKER_URL=CELERY_DEFAULT_BROKER):
        assert celery_warnings(local) == []


def test_the_celery_check_is_silent_when_nothing_is_sent(db):
    with override_settings(DURABLE={"ENQUEUE": False}):
        assert check_celery() == []
    try:
        with override_settings(
            DURABLE={"ENQUEUE": True, "STORE": "durable_django.stores.MemoryStore"}
        ):
            assert check_celery() == []
    finally:
        default_engine.reload()


def test_a_process_without_a_celery_app_gets_the_warning(tmp_path):
    """``manage.py check`` in a process whose project never created a Celery app."""
    script = textwrap.dedent(
        """
        import os, django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "durable_django"],
            DATABASES={"default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.environ["CHECK_DB"],
                "OPTIONS": {"transaction_mode": "IMMEDIATE"},
            }},
            DURABLE={"ENQUEUE": True},
        )
        django.setup()
        from django.core.management import call_command
        call_command("check")
        """
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL")
    }
    env["CHECK_DB"] = str(tmp_path / "db.sqlite3")
    completed = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    assert "durable_django.W002" in completed.stderr
    assert "no Celery app is loaded in this process" in completed.stderr


# the broker's transport -----------------------------------------------------------------


def test_a_broker_whose_client_library_is_missing_is_an_error(no_broker_in_the_environment):
    # Neither is installed with the dev extra: the transports fail as they would in a worker.
    assert importlib.util.find_spec("pymongo") is None
    assert importlib.util.find_spec("botocore") is None
    mongo = Celery("project", broker="mongodb://app:s3cret@127.0.0.1:27017/q", set_as_current=False)
    sqs = Celery("project", broker="sqs://", set_as_current=False)

    [mongo_error] = broker_errors(mongo)
    [sqs_error] = broker_errors(sqs)

    assert (mongo_error.id, mongo_error.level) == ("durable_django.E003", checks.ERROR)
    assert "kombu's 'mongodb' transport does not load" in mongo_error.msg
    assert "No module named 'pymongo'" in mongo_error.msg
    assert "Install the missing module 'pymongo'" in mongo_error.hint
    assert "s3cret" not in mongo_error.msg  # the password is masked
    assert "Install the missing module 'botocore'" in sqs_error.hint


def test_brokers_whose_transport_loads_pass(no_broker_in_the_environment):
    for url in ("redis://:pw@127.0.0.1:6379/0", "amqp://guest@127.0.0.1//", "memory://"):
        assert broker_errors(Celery("project", broker=url, set_as_current=False)) == [], url
    # A failover list: the first URL's transport is the one loaded first.
    listed = Celery("project", broker="redis://a:6379/0;redis://b:6379/0", set_as_current=False)
    assert broker_errors(listed) == []


def test_an_unknown_transport_is_an_error(no_broker_in_the_environment):
    [error] = broker_errors(Celery("project", broker="nosuch://x", set_as_current=False))
    assert error.id == "durable_django.E003"
    assert "No such transport: nosuch" in error.msg


def test_manage_py_check_fails_on_a_broker_that_does_not_load():
    """What a user sees: ``manage.py check`` fails, naming the missing module."""
    # The suite's settings, with its Celery app loaded as a project's __init__.py does.
    script = (
        "import django; django.setup(); import tests.celery_app; "
        "from django.core.management import execute_from_command_line; "
        "execute_from_command_line(['manage.py', 'check'])"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    # Celery reads the broker from the environment before the settings.
    env.update(
        CELERY_BROKER_URL="mongodb://127.0.0.1:27017/q", DURABLE_TEST_DURABLE='{"ENQUEUE": true}'
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert completed.returncode == 1, completed.stderr
    assert "durable_django.E003" in completed.stderr
    assert "No module named 'pymongo'" in completed.stderr


# declared quotas ------------------------------------------------------------------------


def test_a_limit_that_refuses_every_start_is_warned(registry):
    registry.add(make_definition("ok", "1", echo, concurrency={"key": lambda i: "k", "limit": 2}))
    registry.add(
        make_definition("closed", "1", echo, concurrency={"key": lambda i: "k", "limit": 0})
    )
    registry.add(
        make_definition("negative", "2", echo, concurrency={"key": lambda i: "k", "limit": -1})
    )
    registry.add(
        make_definition("by-plan", "1", echo, concurrency={"key": lambda i: "k", "limit": len})
    )
    messages = quota_warnings(registry.all())
    assert ids(messages) == ["durable_django.W004", "durable_django.W004"]
    assert messages[0].msg == (
        "workflow 'closed' version '1' declares concurrency limit 0: every start is refused"
    )
    assert messages[1].obj == "negative"


def test_the_workflow_check_reads_the_declared_workflows(db):
    definition = default_engine.register(
        "tests.checks.closed", "1", echo, concurrency={"key": lambda i: "k", "limit": 0}
    )
    try:
        assert ids(check_workflows()) == ["durable_django.W004"]
    finally:
        default_engine.registry.remove(definition.name)
    assert check_workflows() == []


def test_a_schedule_of_an_unregistered_workflow_is_warned(db):
    from durable_django.checks import check_schedules
    from durable_django.models import Schedule

    Schedule.objects.create(key="orphan", workflow="gone", interval_seconds=60)
    Schedule.objects.create(key="fine", workflow="tests.plain", interval_seconds=60)
    messages = check_schedules(databases=["default"])
    assert [(m.id, "orphan" in m.msg) for m in messages] == [("durable_django.W006", True)]
    assert check_schedules() == []  # only with --database
