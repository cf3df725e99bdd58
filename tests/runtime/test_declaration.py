"""Declaring workflows: both forms, registration rules, discovery."""

from __future__ import annotations

import abc

import pytest

from durable_django import BaseWorkflow, Concurrency, Engine, Workflow, workflow
from durable_django._rules.registry import Registry, default_registry
from durable_django.testing import run_until_idle

from ..helpers import echo


def test_class_form_gets_start_methods(memory_engine: Engine):
    @workflow(name="greet", version="2", engine=memory_engine, tags=["greeting"])
    class Greet(BaseWorkflow):
        def run(self, ctx, input):
            return {"hello": ctx.step("name", str.title, input["name"])}

    assert isinstance(Greet.durable, Workflow)
    assert (Greet.durable.name, Greet.durable.version) == ("greet", "2")
    handle = Greet.dispatch({"name": "ada"})
    assert memory_engine.get_run(handle.run_id).tags == ["greeting"]
    run_until_idle(memory_engine)
    assert handle.result(timeout=1) == {"hello": "Ada"}
    # The engine starts it by class, declared object or name alike.
    for target in (Greet, Greet.durable, "greet"):
        assert memory_engine.start(target, {"name": "x"}).workflow == "greet"


def test_function_form_returns_a_workflow(memory_engine: Engine):
    @workflow(name="double", engine=memory_engine)
    def double(ctx, input):
        return input * 2

    assert isinstance(double, Workflow) and double.__name__ == "double"
    handle = double.dispatch(21, run_id="d1")
    run_until_idle(memory_engine)
    assert handle.result() == 42
    assert memory_engine.get_run("d1").version == "1"


def test_the_name_defaults_to_the_dotted_path(memory_engine: Engine):
    @workflow(engine=memory_engine)
    def nameless(ctx, input):
        return None

    assert (
        nameless.name == f"{__name__}.test_the_name_defaults_to_the_dotted_path.<locals>.nameless"
    )


def test_a_dict_quota_on_the_decorator(memory_engine: Engine):
    @workflow(name="q", engine=memory_engine, concurrency={"key": lambda i: "k", "limit": 1})
    def q(ctx, input):
        return None

    (declared,) = q.definition.concurrency
    assert declared == Concurrency(declared.key, 1)


def test_only_base_workflow_subclasses_or_functions():
    with pytest.raises(TypeError, match="BaseWorkflow subclass"):

        @workflow(name="x")
        class NotAWorkflow:
            pass

    with pytest.raises(TypeError, match="decorates a class or a function"):
        workflow(name="x")(42)


def test_a_class_typed_by_input_and_output_may_be_abstract(memory_engine: Engine):
    # BaseWorkflow[In, Out] is subscripted at runtime, and mixes with abc.ABC.
    class Counting(BaseWorkflow[str, int], abc.ABC):
        @abc.abstractmethod
        def unit(self) -> int: ...

    @workflow(name="count", engine=memory_engine)
    class Count(Counting):
        def unit(self) -> int:
            return 2

        def run(self, ctx, input: str) -> int:
            return ctx.step("count", len, input) * self.unit()

    handle = Count.dispatch("abc")
    assert handle.workflow == "count"
    run_until_idle(memory_engine)
    assert handle.result(timeout=1) == 6
    with pytest.raises(TypeError, match="Counting is not declared"):
        Counting.dispatch("abc")
    assert not hasattr(Counting, "durable")


def test_an_undeclared_subclass_cannot_start():
    class Loose(BaseWorkflow):
        pass

    with pytest.raises(TypeError, match="decorate it with @workflow"):
        Loose.dispatch({})


def test_same_name_and_version_with_another_body_is_refused(registry: Registry):
    engine = Engine(registry=registry, enqueue=False)
    engine.register("wf", "1", echo)
    engine.register("wf", "1", echo)  # the same registration again is a no-op
    with pytest.raises(ValueError, match="already registered with a different body"):
        engine.register("wf", "1", lambda ctx, input: None)
    with pytest.raises(ValueError, match="already registered"):
        engine.register("wf", "1", echo, concurrency={"key": lambda i: "k", "limit": 1})
    engine.register("wf", "2", lambda ctx, input: None)
    assert registry.latest("wf").version == "2"
    assert registry.get("wf", "1").body is echo


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("", "1", echo), ValueError, "workflow name must not be empty"),
        (("wf", "", echo), ValueError, "workflow version must not be empty"),
        (("wf", 1, echo), TypeError, "workflow version must be a str"),
        (("wf", "1", "not callable"), TypeError, "must be callable"),
    ],
)
def test_bad_registrations(registry: Registry, args, error, message):
    engine = Engine(registry=registry, enqueue=False)
    with pytest.raises(error, match=message):
        engine.register(*args)
    assert registry.all() == []


def test_register_remote_needs_a_queue_and_is_never_executed_here(memory_engine: Engine):
    with pytest.raises(ValueError, match="queue must not be empty"):
        memory_engine.register_remote("billing.charge", "1", queue="")
    memory_engine.register_remote(
        "billing.charge", "1", queue="billing", concurrency={"key": lambda i: "b", "limit": 1}
    )
    handle = memory_engine.start("billing.charge", {"amount": 5})
    run = memory_engine.get_run(handle.run_id)
    assert run.queue == "billing" and run.tags == ["concurrency:b"]
    assert run_until_idle(memory_engine) == 0
    assert handle.status == "pending"


def test_workflows_modules_are_discovered_at_startup():
    from tests.testapp.workflows import EchoWorkflow, plain

    assert default_registry.latest("tests.echo") is EchoWorkflow.durable.definition
    assert default_registry.latest("tests.plain") is plain.definition
