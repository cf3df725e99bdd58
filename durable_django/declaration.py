"""Declaring workflows: the ``@workflow`` decorator and ``BaseWorkflow``.

A declared workflow is typed from its body: ``@workflow`` on ``def body(ctx, input: In)
-> Out`` gives a ``Workflow[In, Out]``, whose ``dispatch`` takes an ``In`` and returns a
``RunHandle[Out]``, and whose ``start`` returns an ``Out``. A ``BaseWorkflow[In, Out]``
subclass types its ``run`` and its ``durable``; its class start methods take any input.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar, overload

from ._rules.concurrency import ConcurrencyOption, RateLimitOption
from ._rules.registry import WorkflowDefinition, make_definition
from ._runtime import starting
from ._runtime.execution import Context, running_context
from ._runtime.handles import BatchStart, Input, Output, RunHandle
from ._runtime.starting import StartOptions
from ._runtime.waiting import Wait, refuse_in_body
from .engines import Engine, default_engine
from .errors import DurableError

#: The input of a start that gives none: the body receives ``None``. Typed ``Any``, so
#: that ``Wf.dispatch()`` type-checks whatever the workflow's input type.
NO_INPUT: Any = None


class StartMethods(Generic[Input, Output]):
    """The start methods of a declared workflow, written once: a :class:`Workflow` has
    them, and so has a ``BaseWorkflow`` subclass (through its class, :class:`WorkflowClass`).
    Their keyword arguments make the start's
    :class:`~durable_django._runtime.starting.StartOptions`.
    """

    def _declared(self) -> Workflow[Input, Output]:
        raise NotImplementedError

    def dispatch(
        self,
        input: Input = NO_INPUT,
        *,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        rate_limit: RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> RunHandle[Output]:
        """Create a run and enqueue it on commit; returns its handle at once.

        ``wait`` (seconds or a ``timedelta``): if a quota is full, wait up to that long for
        a slot, woken when one frees, before raising :class:`ConcurrencyLimitError`.
        ``ticket``: the ``error.ticket`` of an earlier refusal by a fair quota, keeping
        its place in the key's line (:mod:`durable_django._rules.tickets`).

        Inside a running workflow body this starts a child run instead (see
        ``ctx.start_child``): ``run_id`` is then the child id, and ``wait`` and ``ticket``
        are refused.
        """
        options = StartOptions(concurrency, tags, namespace, wait, ticket, rate_limit=rate_limit)
        return self._declared()._dispatch(input, run_id, options)

    async def adispatch(
        self,
        input: Input = NO_INPUT,
        *,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        rate_limit: RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> RunHandle[Output]:
        """``dispatch`` for async views; ``wait`` waits without blocking the loop."""
        declared = self._declared()
        options = StartOptions(concurrency, tags, namespace, wait, ticket, rate_limit=rate_limit)
        return await starting.astart(declared.engine, declared.definition, input, run_id, options)

    def dispatch_many(
        self,
        inputs: Iterable[Input],
        *,
        run_ids: Iterable[str | None] | None = None,
        concurrency: ConcurrencyOption = None,
        rate_limit: RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> BatchStart[Output]:
        """Start one run per input in one transaction, each under its own quota, in
        order; see :meth:`Engine.start_many <durable_django.Engine.start_many>`.

        Not inside a running workflow body: start children with ``ctx.start_child``.
        """
        declared = self._declared()
        _outside_body(declared, "dispatch_many")
        options = StartOptions(concurrency, tags, namespace, rate_limit=rate_limit)
        return starting.start_many(declared.engine, declared.definition, inputs, run_ids, options)

    async def adispatch_many(
        self,
        inputs: Iterable[Input],
        *,
        run_ids: Iterable[str | None] | None = None,
        concurrency: ConcurrencyOption = None,
        rate_limit: RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> BatchStart[Output]:
        """``dispatch_many`` for async views."""
        declared = self._declared()
        options = StartOptions(concurrency, tags, namespace, rate_limit=rate_limit)
        return await starting.astart_many(
            declared.engine, declared.definition, inputs, run_ids, options
        )

    def start(
        self,
        input: Input = NO_INPUT,
        *,
        timeout: float | None = None,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        rate_limit: RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> Output:
        """Dispatch, wait for the run to settle, and return its output (or raise).

        Inside a running workflow body this is ``ctx.child``: the parent is suspended
        (no worker held) until the child settles; ``timeout`` does not apply.
        """
        declared = self._declared()
        options = StartOptions(concurrency, tags, namespace, wait, ticket, rate_limit=rate_limit)
        context = _running_body(declared, options)
        if context is not None:
            output: Output = context.child(
                declared.definition, input, run_id, concurrency=concurrency, tags=tags
            )
            return output
        return declared._dispatch(input, run_id, options).result(timeout=timeout)

    async def astart(
        self,
        input: Input = NO_INPUT,
        *,
        timeout: float | None = None,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        rate_limit: RateLimitOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> Output:
        """``start`` for async code."""
        declared = self._declared()
        options = StartOptions(concurrency, tags, namespace, wait, ticket, rate_limit=rate_limit)
        handle: RunHandle[Output]
        handle = await starting.astart(declared.engine, declared.definition, input, run_id, options)
        return await handle.aresult(timeout=timeout)


class Workflow(StartMethods[Input, Output]):
    """A declared workflow. Start it with ``dispatch`` / ``start`` or their async twins.

    Typed from its body: ``Workflow[In, Out]`` for ``def body(ctx, input: In) -> Out``.
    """

    def __init__(self, definition: WorkflowDefinition, engine: Engine | None = None) -> None:
        self.definition = definition
        self._engine = engine

    def __repr__(self) -> str:
        return f"<Workflow {self.name} v{self.version}>"

    @property
    def name(self) -> str:
        """The registered name."""
        return self.definition.name

    @property
    def version(self) -> str:
        """The version new runs are started with."""
        return self.definition.version

    @property
    def engine(self) -> Engine:
        """The engine this workflow starts on (the default engine unless one was given)."""
        return self._engine if self._engine is not None else default_engine

    def _declared(self) -> Workflow[Input, Output]:
        return self

    def _dispatch(self, input: Any, run_id: str | None, options: StartOptions) -> RunHandle[Output]:
        """``dispatch`` with its options made: a start, or a child start inside a body."""
        context = _running_body(self, options)
        if context is not None:
            return context.start_child_handle(
                self.definition, input, run_id, concurrency=options.concurrency, tags=options.tags
            )
        return starting.start(self.engine, self.definition, input, run_id, options)


def _running_body(declared: Workflow[Any, Any], options: StartOptions) -> Context | None:
    """The context of the workflow body running here, if this start happens inside one;
    there a start is a child start, in its parent's namespace, which neither waits for a
    slot nor presents a ticket."""
    context = running_context()
    if context is None:
        return None
    if options.namespace is not None:
        raise ValueError("a child run is started in its parent's namespace; omit namespace=")
    if options.wait:
        refuse_in_body()
    if options.ticket is not None:
        raise DurableError(
            "ticket= is not available inside a workflow body: a child start is refused at "
            "once, and the body may retry it durably"
        )
    return context


def _outside_body(declared: Workflow[Any, Any], method: str) -> None:
    if running_context() is not None:
        raise DurableError(
            f"{declared.name}.{method}() cannot be called inside a workflow body: "
            "start children with ctx.start_child"
        )


class WorkflowClass(StartMethods[Any, Any], abc.ABCMeta):
    """The class of a ``BaseWorkflow`` subclass: what gives the class, once decorated with
    ``@workflow``, the start methods of its :class:`Workflow` (``durable``). An
    ``ABCMeta``, so that a workflow class may also be an ``abc.ABC``."""

    def _declared(cls) -> Workflow[Any, Any]:
        declared: Workflow[Any, Any] | None = cls.__dict__.get("durable")
        if declared is None:
            raise TypeError(f"{cls.__name__} is not declared; decorate it with @workflow(...)")
        return declared


_In = TypeVar("_In")
_Out = TypeVar("_Out")


class _Durable:
    """``BaseWorkflow.durable``: a declared class's :class:`Workflow`, typed from the
    class's ``BaseWorkflow[In, Out]``."""

    def __get__(
        self, instance: object, owner: type[BaseWorkflow[_In, _Out]]
    ) -> Workflow[_In, _Out]:
        try:
            declared: Workflow[_In, _Out] = owner._declared()
        except TypeError as error:  # no attribute, as getattr(cls, "durable", ...) expects
            raise AttributeError(str(error)) from None
        return declared


class BaseWorkflow(Generic[Input, Output], metaclass=WorkflowClass):
    """Base class for class-form workflows: implement ``run(self, ctx, input)``.

    Once decorated with ``@workflow``, the class has ``dispatch``, ``start``, ``adispatch``
    and ``astart`` (and the ``_many`` twins) as :class:`Workflow` has them, and
    ``durable`` holds its :class:`Workflow`. ``BaseWorkflow[In, Out]`` types ``run`` and
    ``durable``.
    """

    durable = _Durable()

    def run(self, ctx: Context, input: Input) -> Output:
        raise NotImplementedError(f"{type(self).__name__} must implement run(self, ctx, input)")


def _class_body(cls: type[BaseWorkflow]) -> Callable[[Context, Any], Any]:
    def body(ctx: Context, input: Any) -> Any:
        return cls().run(ctx, input)

    # Named after the class: the registry tells a re-import from another body by name.
    body.__module__, body.__qualname__ = cls.__module__, cls.__qualname__
    return body


_Class = TypeVar("_Class", bound=type[BaseWorkflow])


class WorkflowDecorator(Protocol):
    """What :func:`workflow` returns: it returns a ``BaseWorkflow`` subclass as it is (with
    its start methods) and a body function ``fn(ctx, input)`` as a :class:`Workflow`."""

    # A class is callable too, but a BaseWorkflow's constructor takes no (ctx, input).
    @overload
    def __call__(self, target: Callable[[Context, _In], _Out], /) -> Workflow[_In, _Out]: ...

    @overload
    def __call__(self, target: _Class, /) -> _Class: ...


def workflow(
    name: str | None = None,
    version: str = "1",
    *,
    concurrency: ConcurrencyOption = None,
    rate_limit: RateLimitOption = None,
    tags: Iterable[str] = (),
    on_event: Iterable[str] = (),
    schedule: Any = None,
    priority: int | None = None,
    engine: Engine | None = None,
) -> WorkflowDecorator:
    """Declare a workflow: a ``BaseWorkflow`` subclass or a function ``fn(ctx, input)``.

    ``name`` defaults to the target's dotted path; ``concurrency`` takes a
    :class:`~durable_django.Concurrency` or a dict with the same keys, or a list of them (a
    start must pass every one); ``rate_limit`` takes a
    :class:`~durable_django.RateLimit` or a dict with the same keys, or a list of them (a
    start must pass them too, all or nothing with the quotas); ``on_event`` names
    the events that start it; ``schedule`` declares its persisted schedule(s) (see
    :class:`~durable_django._runtime.schedules.ScheduleSpec`); ``priority`` (0-9) is its run
    messages' Celery priority, over the route's and ``task_default_priority``. A class
    is returned
    with its start methods; a function is returned as a :class:`Workflow`.
    """

    def decorate(target: Any) -> Any:
        is_class = isinstance(target, type)
        if is_class and not issubclass(target, BaseWorkflow):
            raise TypeError(
                f"@workflow on a class needs a BaseWorkflow subclass; {target.__name__} is not"
            )
        if not is_class and not callable(target):
            raise TypeError(f"@workflow decorates a class or a function, not {target!r}")
        body = _class_body(target) if is_class else target
        definition = make_definition(
            name or f"{target.__module__}.{target.__qualname__}",
            version,
            body,
            concurrency=concurrency,
            rate_limit=rate_limit,
            tags=tags,
            on_event=on_event,
            schedule=schedule,
            priority=priority,
        )
        target_engine = engine if engine is not None else default_engine
        declared = Workflow(target_engine.registry.add(definition), engine)
        if is_class:
            target.durable = declared
            return target
        # typeshed has update_wrapper take callables only; it copies the function's name,
        # docstring and module onto any object with a __dict__.
        functools.update_wrapper(declared, target)  # type: ignore[arg-type]
        return declared

    return decorate
