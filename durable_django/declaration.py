"""Declaring workflows: the ``@workflow`` decorator and ``BaseWorkflow``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Protocol, TypeVar, overload

from .concurrency import ConcurrencyOption
from .context import current_context
from .engines import Engine, default_engine
from .errors import DurableError
from .execution import Context
from .registry import WorkflowDefinition, make_definition
from .starting import BatchStart, RunHandle
from .waiting import Wait, refuse_in_body


class Workflow:
    """A declared workflow. Start it with ``dispatch`` / ``start`` or their async twins."""

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

    def dispatch(
        self,
        input: Any = None,
        *,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> RunHandle:
        """Create a run and enqueue it on commit; returns its handle at once.

        ``wait`` (seconds or a ``timedelta``): if a quota is full, wait up to that long for
        a slot, woken when one frees, before raising :class:`ConcurrencyLimitError`.
        ``ticket``: the ``error.ticket`` of an earlier refusal by a fair quota, keeping
        its place in the key's line (:mod:`durable_django.tickets`).

        Inside a running workflow body this starts a child run instead (see
        ``ctx.start_child``): ``run_id`` is then the child id, and ``wait`` and ``ticket``
        are refused.
        """
        context = _running_body(self, namespace)
        if context is not None:
            _refuse_waiting_in_body(wait, ticket)
            return context.start_child_handle(
                self.definition, input, run_id, concurrency=concurrency, tags=tags
            )
        return self.engine.start(
            self.definition,
            input,
            run_id,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
            wait=wait,
            ticket=ticket,
        )

    async def adispatch(
        self,
        input: Any = None,
        *,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> RunHandle:
        """``dispatch`` for async views; ``wait`` waits without blocking the loop."""
        return await self.engine.astart(
            self.definition,
            input,
            run_id,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
            wait=wait,
            ticket=ticket,
        )

    def dispatch_many(
        self,
        inputs: Iterable[Any],
        *,
        run_ids: Iterable[str | None] | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> BatchStart:
        """Start one run per input in one transaction, each under its own quota, in
        order; see :meth:`Engine.start_many <durable_django.Engine.start_many>`.

        Not inside a running workflow body: start children with ``ctx.start_child``.
        """
        _outside_body(self, "dispatch_many")
        return self.engine.start_many(
            self.definition,
            inputs,
            run_ids=run_ids,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
        )

    async def adispatch_many(
        self,
        inputs: Iterable[Any],
        *,
        run_ids: Iterable[str | None] | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> BatchStart:
        """``dispatch_many`` for async views."""
        return await self.engine.astart_many(
            self.definition,
            inputs,
            run_ids=run_ids,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
        )

    def start(
        self,
        input: Any = None,
        *,
        timeout: float | None = None,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> Any:
        """Dispatch, wait for the run to settle, and return its output (or raise).

        Inside a running workflow body this is ``ctx.child``: the parent is suspended
        (no worker held) until the child settles; ``timeout`` does not apply.
        """
        context = _running_body(self, namespace)
        if context is not None:
            _refuse_waiting_in_body(wait, ticket)
            return context.child(self.definition, input, run_id, concurrency=concurrency, tags=tags)
        handle = self.dispatch(
            input,
            run_id=run_id,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
            wait=wait,
            ticket=ticket,
        )
        return handle.result(timeout=timeout)

    async def astart(
        self,
        input: Any = None,
        *,
        timeout: float | None = None,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> Any:
        """``start`` for async code."""
        handle = await self.adispatch(
            input,
            run_id=run_id,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
            wait=wait,
            ticket=ticket,
        )
        return await handle.aresult(timeout=timeout)


def _running_body(declared: Workflow, namespace: str | None) -> Context | None:
    """The context of the workflow body running here, if this start happens inside one."""
    context = current_context.get()
    if context is None:
        return None
    if namespace is not None:
        raise ValueError("a child run is started in its parent's namespace; omit namespace=")
    return context


def _refuse_waiting_in_body(wait: Wait, ticket: str | None) -> None:
    """A child start neither waits for a slot nor presents a ticket."""
    if wait:
        refuse_in_body()
    if ticket is not None:
        raise DurableError(
            "ticket= is not available inside a workflow body: a child start is refused at "
            "once, and the body may retry it durably"
        )


def _outside_body(declared: Workflow, method: str) -> None:
    if current_context.get() is not None:
        raise DurableError(
            f"{declared.name}.{method}() cannot be called inside a workflow body: "
            "start children with ctx.start_child"
        )


class BaseWorkflow:
    """Base class for class-form workflows: implement ``run(self, ctx, input)``.

    Once decorated with ``@workflow``, the class has ``dispatch``, ``start``, ``adispatch``
    and ``astart`` class methods, and ``durable`` holds its :class:`Workflow`.
    """

    durable: ClassVar[Workflow]

    def run(self, ctx: Context, input: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement run(self, ctx, input)")

    @classmethod
    def _declared(cls) -> Workflow:
        declared: Workflow | None = cls.__dict__.get("durable")
        if declared is None:
            raise TypeError(f"{cls.__name__} is not declared; decorate it with @workflow(...)")
        return declared

    @classmethod
    def dispatch(
        cls,
        input: Any = None,
        *,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> RunHandle:
        """See :meth:`Workflow.dispatch`."""
        return cls._declared().dispatch(
            input,
            run_id=run_id,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
            wait=wait,
            ticket=ticket,
        )

    @classmethod
    async def adispatch(
        cls,
        input: Any = None,
        *,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> RunHandle:
        """See :meth:`Workflow.adispatch`."""
        return await cls._declared().adispatch(
            input,
            run_id=run_id,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
            wait=wait,
            ticket=ticket,
        )

    @classmethod
    def dispatch_many(
        cls,
        inputs: Iterable[Any],
        *,
        run_ids: Iterable[str | None] | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> BatchStart:
        """See :meth:`Workflow.dispatch_many`."""
        return cls._declared().dispatch_many(
            inputs, run_ids=run_ids, concurrency=concurrency, tags=tags, namespace=namespace
        )

    @classmethod
    async def adispatch_many(
        cls,
        inputs: Iterable[Any],
        *,
        run_ids: Iterable[str | None] | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
    ) -> BatchStart:
        """See :meth:`Workflow.adispatch_many`."""
        return await cls._declared().adispatch_many(
            inputs, run_ids=run_ids, concurrency=concurrency, tags=tags, namespace=namespace
        )

    @classmethod
    def start(
        cls,
        input: Any = None,
        *,
        timeout: float | None = None,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> Any:
        """See :meth:`Workflow.start`."""
        return cls._declared().start(
            input,
            timeout=timeout,
            run_id=run_id,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
            wait=wait,
            ticket=ticket,
        )

    @classmethod
    async def astart(
        cls,
        input: Any = None,
        *,
        timeout: float | None = None,
        run_id: str | None = None,
        concurrency: ConcurrencyOption = None,
        tags: Iterable[str] = (),
        namespace: str | None = None,
        wait: Wait = None,
        ticket: str | None = None,
    ) -> Any:
        """See :meth:`Workflow.astart`."""
        return await cls._declared().astart(
            input,
            timeout=timeout,
            run_id=run_id,
            concurrency=concurrency,
            tags=tags,
            namespace=namespace,
            wait=wait,
            ticket=ticket,
        )


def _class_body(cls: type[BaseWorkflow]) -> Callable[[Context, Any], Any]:
    def body(ctx: Context, input: Any) -> Any:
        return cls().run(ctx, input)

    # Named after the class: the registry tells a re-import from another body by name.
    body.__module__, body.__qualname__ = cls.__module__, cls.__qualname__
    return body


_WorkflowClass = TypeVar("_WorkflowClass", bound=type[BaseWorkflow])


class WorkflowDecorator(Protocol):
    """What :func:`workflow` returns: it returns a ``BaseWorkflow`` subclass as it is (with
    its start methods) and a body function ``fn(ctx, input)`` as a :class:`Workflow`."""

    @overload
    def __call__(self, target: _WorkflowClass, /) -> _WorkflowClass: ...

    @overload
    def __call__(self, target: Callable[[Context, Any], Any], /) -> Workflow: ...


def workflow(
    name: str | None = None,
    version: str = "1",
    *,
    concurrency: ConcurrencyOption = None,
    tags: Iterable[str] = (),
    on_event: Iterable[str] = (),
    schedule: Any = None,
    priority: int | None = None,
    engine: Engine | None = None,
) -> WorkflowDecorator:
    """Declare a workflow: a ``BaseWorkflow`` subclass or a function ``fn(ctx, input)``.

    ``name`` defaults to the target's dotted path; ``concurrency`` takes a
    :class:`~durable_django.Concurrency` or a dict with the same keys, or a list of them (a
    start must pass every one); ``on_event`` names
    the events that start it; ``schedule`` declares its persisted schedule(s) (see
    :class:`~durable_django.schedules.ScheduleSpec`); ``priority`` (0-9) is its run
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
