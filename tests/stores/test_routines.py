"""The server-side routines' files, one per dialect, under one reader and one rule: only
versioned ``CREATE OR REPLACE`` statements and comments, each routine installed once by
the migrations, an operation refusing a name its file does not define."""

from __future__ import annotations

import pytest

from durable_django.stores.mariadb import PROCEDURES
from durable_django.stores.mariadb.operations import InstallProcedures
from durable_django.stores.postgres import FUNCTIONS
from durable_django.stores.postgres.operations import InstallFunctions
from durable_django.stores.routines import InstallRoutines, RoutineFile

from ..helpers import routines_installed

#: Each dialect's file, its operation, and a statement's head and body in its form.
DIALECTS = [
    pytest.param(FUNCTIONS, InstallFunctions, "FUNCTION", "() RETURNS void AS $$\n$$;", id="pg"),
    pytest.param(PROCEDURES, InstallProcedures, "PROCEDURE", "()\nBEGIN\nEND;", id="mariadb"),
]


@pytest.mark.parametrize(("file", "operation", "kind", "body"), DIALECTS)
def test_the_migrations_install_every_routine_of_the_file_once(
    file: RoutineFile, operation: type[InstallRoutines], kind: str, body: str
):
    assert routines_installed(operation) == list(file.definitions())


@pytest.mark.parametrize(("file", "operation", "kind", "body"), DIALECTS)
def test_a_routine_installed_again_was_installed_by_an_earlier_migration(
    file: RoutineFile, operation: type[InstallRoutines], kind: str, body: str
):
    again = routines_installed(operation, replaced=True)
    assert again  # the start routines, which read the operators' overrides since 0003
    assert set(again) <= set(routines_installed(operation))


@pytest.mark.parametrize(("file", "operation", "kind", "body"), DIALECTS)
def test_an_operation_naming_a_routine_the_file_does_not_define_is_refused(
    file: RoutineFile, operation: type[InstallRoutines], kind: str, body: str
):
    with pytest.raises(ValueError, match="durable_nothing_v1"):
        operation([*file.definitions(), "durable_nothing_v1"])


@pytest.mark.parametrize(("file", "operation", "kind", "body"), DIALECTS)
@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("CREATE OR REPLACE {kind} durable_start{body}", "versioned"),
        ("CREATE OR REPLACE {kind} durable_x_v1{body}\n" * 2, "defined twice"),
        ("-- one\nCREATE OR REPLACE {kind} durable_x_v1{body}\nDROP TABLE t;", "DROP"),
        ("CREATE {kind} durable_x_v1{body}", "not a CREATE OR REPLACE"),
    ],
)
def test_the_file_holds_versioned_routines_and_nothing_else(
    file: RoutineFile,
    operation: type[InstallRoutines],
    kind: str,
    body: str,
    text: str,
    error: str,
):
    with pytest.raises(ValueError, match=error):
        file.parse(text.format(kind=kind, body=body))
