"""The public API: every error and ``Context`` exported, start options a checker can see."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import durable_django
from durable_django import BaseWorkflow, Context, Engine, Workflow, engines, errors, workflow
from durable_django._rules import windows
from durable_django._rules.registry import Registry
from durable_django._runtime import execution, handles, starting
from durable_django.stores import MemoryStore


def test_every_error_lives_in_errors_and_is_exported():
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, Exception)
        and value.__module__ == errors.__name__
    }
    assert defined >= {"StepError", "SignalTimeout", "NonDeterminismError", "DurableError"}
    assert defined <= set(durable_django.__all__)
    for name in defined:
        assert getattr(durable_django, name) is getattr(errors, name)


def test_no_error_is_defined_outside_errors():
    """The package's exceptions (those a caller may catch) are all in ``errors``; what
    execution raises to end a turn derives from ``BaseException`` and is no error."""
    packages = (execution, starting)
    submodules = [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for package in packages
        for info in pkgutil.iter_modules(package.__path__)
    ]
    for module in (*packages, *submodules, engines, handles):
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, Exception):
                assert not value.__module__.startswith("durable_django.") or (
                    value.__module__ == errors.__name__
                ), name


def test_the_run_for_user_code_is_exported():
    from durable_django import observability

    assert {"current_run", "RunInfo"} <= set(durable_django.__all__)
    assert durable_django.current_run is observability.current_run
    assert durable_django.RunInfo is observability.RunInfo
    assert durable_django.current_run() is None


def test_the_old_import_paths_still_work():
    assert execution.StepError is durable_django.StepError
    assert execution.SignalTimeout is durable_django.SignalTimeout
    assert execution.NonDeterminismError is durable_django.NonDeterminismError
    assert durable_django.Context is execution.Context
    assert engines.RunHandle is durable_django.RunHandle
    from durable_django._runtime.schedules import ScheduleSpec, latest_window, next_window

    assert (ScheduleSpec, latest_window, next_window) == (
        windows.ScheduleSpec,
        windows.latest_window,
        windows.next_window,
    )


START_METHODS = [
    Engine.start,
    Engine.astart,
    Engine.start_child,
    Engine.retry,
    Workflow.dispatch,
    Workflow.adispatch,
    Workflow.start,
    Workflow.astart,
    BaseWorkflow.dispatch,
    BaseWorkflow.adispatch,
    BaseWorkflow.start,
    BaseWorkflow.astart,
    Context.child,
    Context.start_child,
    Context.start_child_handle,
]


@pytest.mark.parametrize("method", START_METHODS, ids=lambda m: m.__qualname__)
def test_start_options_are_named_keyword_arguments(method):
    parameters = inspect.signature(method).parameters.values()
    assert all(p.kind is not p.VAR_KEYWORD for p in parameters)
    options = {p.name for p in parameters if p.kind is p.KEYWORD_ONLY}
    assert "concurrency" in options


@pytest.mark.parametrize("name", ["dispatch", "adispatch", "start", "astart"])
def test_a_class_starts_with_the_options_of_a_function_workflow(name):
    def parameters(method):
        return [
            (p.name, p.kind, p.default)
            for p in inspect.signature(method).parameters.values()
            if p.name != "self"
        ]

    assert parameters(getattr(BaseWorkflow, name)) == parameters(getattr(Workflow, name))


def test_a_misspelt_option_is_refused_and_starts_nothing():
    engine = Engine(store=MemoryStore(), enqueue=False, registry=Registry())

    @workflow(name="typo", engine=engine)
    class Typo(BaseWorkflow):
        def run(self, ctx, input):
            return input

    with pytest.raises(TypeError, match="concurency"):
        Typo.dispatch({}, concurency={"key": "k", "limit": 1})  # type: ignore[call-arg]
    assert engine.list_runs() == []
    handle = Typo.dispatch({}, run_id="r1", tags=["t"], concurrency={"key": "k", "limit": 1})
    assert engine.get_run(handle.run_id).tags == ["concurrency:k", "t"]
