"""The public API as a project's type checker sees it. Never run: mypy checks it with the
package (``files`` in ``[tool.mypy]``), so ``scripts/test`` and the pre-commit hook fail
when a public name stops being typed as documented.

Each misuse below is marked with the error mypy must report: with ``warn_unused_ignores``
(part of ``strict``), a signature that stopped catching it leaves an unused ``ignore``,
which fails the check.
"""

# The imports of documented names are the check: unused here, on purpose.
# ruff: noqa: F401

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, assert_type

import durable_django
from durable_django import (
    BaseWorkflow,
    BatchStart,
    Concurrency,
    ConcurrencyLimitError,
    Context,
    Engine,
    RunHandle,
    RunInfo,
    RunStatus,
    Workflow,
    current_run,
    workflow,
)
from durable_django._core.lifecycle import ACTIVE_STATUSES, ALL_STATUSES, TERMINAL_STATUSES
from durable_django._core.limits import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_LIMIT,
    MIN_LIMIT,
    TextLengths,
    text_lengths,
)
from durable_django._rules.concurrency import Quota
from durable_django._rules.retention import PurgeResult, active_ancestors
from durable_django._rules.task_quotas import TaskQuota, task_quota, task_quotas
from durable_django._runtime.events import PublishResult, event_run_id, publish
from durable_django._runtime.execution import NonDeterminismError, SignalTimeout, StepError, Suspend
from durable_django._runtime.schedules import (
    Firing,
    ScheduleSpec,
    belongs_to_one_schedule,
    fire,
    fire_due,
    fire_now,
    latest_window,
    next_window,
    sync_declared,
    validate_timing,
    window_run_id,
)
from durable_django._runtime.usage import QuotaUsage, quota_usage

# Every name the reference documents, imported from where it says: each must be exported
# explicitly there (mypy --strict refuses a name a module merely imports).
from durable_django.django_tasks import DurableTask as DjangoTasksDurableTask
from durable_django.django_tasks import DurableTaskBackend as DjangoTasksDurableTaskBackend
from durable_django.engines import RunHandle as EnginesRunHandle
from durable_django.engines import TickResult
from durable_django.http import (
    ConcurrencyLimitMiddleware,
    concurrency_limit_response,
    run_status,
    run_status_response,
    run_status_view,
    too_many_requests,
)
from durable_django.metrics import (
    METRICS,
    QUOTA_KEYS,
    Metric,
    MetricsObserver,
    Sink,
    busiest_keys,
    install,
    reset,
)
from durable_django.metrics.opentelemetry import OpenTelemetryMetrics
from durable_django.metrics.prometheus import (
    PrometheusMetrics,
    QuotaCollector,
    default_metrics,
    metrics_view,
    multiprocess_mode,
    scrape_registry,
)
from durable_django.models import Schedule, ScheduleQuerySet, column_errors
from durable_django.observability import RunFilter, ask_again
from durable_django.observability.events import (
    READY_CHECK_SECONDS,
    TURN_OUTCOMES,
    Observer,
    StartEvent,
    StepEvent,
    TurnEvent,
    forget,
    observe,
    observers,
)
from durable_django.status import ACTIVE_STATUSES as STATUS_ACTIVE_STATUSES
from durable_django.stores import (
    BaseStore,
    MemoryStore,
    NewRun,
    OrmStore,
    RunRecord,
    StartOutcome,
    StartRequest,
    StepRecord,
    Store,
)
from durable_django.stores.base import RunRecord as BaseRunRecord
from durable_django.tasks import beat_schedule, execute_run, tick
from durable_django.tasks_backend import DurableTask, DurableTaskBackend
from durable_django.testing import StoreContract, run_until_idle
from durable_django.ticker import Ticker


def priced(amount: int, *, currency: str = "EUR") -> str:
    return f"{amount} {currency}"


@workflow(name="typing.total", concurrency={"key": lambda input: "k", "limit": 2})
def total(ctx: Context, input: dict[str, int]) -> int:
    assert_type(ctx.run_id, str)
    # ctx.step and ctx.transaction are typed from the function they call, in every form.
    counted = ctx.transaction("count", len, input, retries=1, backoff=lambda attempt: 2.0)
    assert_type(counted, int)
    assert_type(ctx.step("sum", sum, input.values(), retries=2), int)
    assert_type(ctx.step("price", priced, 3, currency="USD"), str)
    assert_type(ctx.transaction("price", priced, 3), str)
    assert_type(ctx.step("now", lambda: ctx.run_id, backoff=0), str)
    ctx.step("price", priced, "3")  # type: ignore[arg-type]
    ctx.step("price", priced, 3, curency="USD")  # type: ignore[call-arg]
    ctx.transaction("price", priced, 3, retries="2")  # type: ignore[call-arg]
    assert_type(ctx.settle("tokens:acme", counted), None)
    ctx.settle("tokens:acme", "3")  # type: ignore[arg-type]
    return ctx.step("sum", sum, input.values()) + counted


@workflow(name="typing.report", concurrency=Concurrency(key=lambda input: None, limit=1))
class Report(BaseWorkflow):
    def run(self, ctx: Context, input: Any) -> Any:
        return ctx.child(total, {"a": 1}, concurrency={"key": "child", "limit": 1})


@workflow(
    name="typing.turn",
    concurrency=[
        Concurrency(key=lambda i: f"tenant:{i['tenant']}", limit=lambda key: 8),
        Concurrency(key=lambda i: "gpu", limit=10, weight=lambda i: int(i["gpus"])),
        {"key": lambda i: f"user:{i['user']}", "limit": 2},
    ],
)
def turn(ctx: Context, input: Any) -> Any:
    return None


def in_a_step() -> str | None:
    run = current_run()
    assert_type(run, RunInfo | None)
    return None if run is None else run.step


@workflow(name="typing.greet")
class Greet(BaseWorkflow[str, dict[str, str]]):
    def run(self, ctx: Context, input: str) -> dict[str, str]:
        return {"greeting": ctx.step("greet", str.upper, input)}


class Misdeclared(BaseWorkflow[str, int]):
    def run(self, ctx: Context, input: str) -> str:  # type: ignore[override]
        return input


def declared() -> None:
    # A function becomes a Workflow typed from its body; a class stays itself, with its
    # start methods, and its durable Workflow typed from BaseWorkflow[In, Out].
    assert_type(total, Workflow[dict[str, int], int])
    assert_type(Report, type[Report])
    assert_type(Report.durable, Workflow)
    assert_type(Report.durable, Workflow[Any, Any])
    assert_type(Greet.durable, Workflow[str, dict[str, str]])
    assert_type(Greet.durable.dispatch("ada").result(), dict[str, str])
    assert_type(Greet.dispatch("ada"), RunHandle)
    Greet.durable.dispatch(3)  # type: ignore[arg-type]


def typed_starts() -> None:
    # A start takes the workflow's input type; its handle and start return its output.
    assert_type(total.dispatch({"a": 1}), RunHandle[int])
    assert_type(total.dispatch({"a": 1}).result(timeout=1), int)
    assert_type(total.start({"a": 1}), int)
    assert_type(total.dispatch_many([{"a": 1}]).started, list[RunHandle[int]])
    total.dispatch({"a": "1"})  # type: ignore[dict-item]
    total.dispatch_many([1])  # type: ignore[list-item]
    total.start(["a"])  # type: ignore[arg-type]
    _wrong: str = total.start({"a": 1})  # type: ignore[assignment]


async def async_typed_starts() -> None:
    assert_type(await total.astart({"a": 1}), int)
    assert_type(await (await total.adispatch({"a": 1})).aresult(), int)
    assert_type((await total.adispatch_many([{"a": 1}])).handles, list[RunHandle[int] | None])


def starts(engine: Engine) -> None:
    assert_type(total.dispatch({"a": 1}, run_id="r1", tags=["t"]), RunHandle[int])
    assert_type(Report.dispatch(None, concurrency=Concurrency("k", 3)), RunHandle)
    assert_type(
        turn.dispatch(None, concurrency=[Concurrency("k", 3, weight=2), {"key": "u", "limit": 1}]),
        RunHandle,
    )
    assert_type(engine.start("typing.total", {"a": 1}, namespace="n"), RunHandle)
    assert_type(total.dispatch({"a": 1}, wait=5), RunHandle[int])
    assert_type(engine.start("typing.total", {"a": 1}, wait=timedelta(seconds=2)), RunHandle)
    assert_type(durable_django.engine, Engine)
    assert_type(engine.retry("r1"), RunHandle)
    handle = total.dispatch()
    assert_type(handle.status, str)
    assert_type(handle.created, bool)
    assert_type(RunStatus.PENDING in ACTIVE_STATUSES, bool)
    batch = total.dispatch_many([{"a": 1}, {"a": 2}], run_ids=["r1", None], tags=["t"])
    assert_type(batch, BatchStart[int])
    assert_type(batch.started, list[RunHandle[int]])
    assert_type(batch.refused, list[tuple[int, ConcurrencyLimitError]])
    assert_type(batch.handles, list[RunHandle[int] | None])
    assert_type(Report.dispatch_many([None], concurrency={"key": "k", "limit": 2}), BatchStart)
    assert_type(engine.start_many("typing.total", [{"a": 1}], namespace="n"), BatchStart)
    several = [{"key": "k", "limit": 4, "weight": 2}, {"key": "j", "limit": 3}]
    assert_type(Report.dispatch_many([None, None], concurrency=several), BatchStart)
    new = NewRun("r", "typing.total", "1", "default", {"a": 1}, (), "")
    two = [Quota("k", 2, ("pending",), weight=2), Quota("j", 1, ("pending",))]
    for outcome in engine.store.start_runs(
        [StartRequest(new, two, check_existing=False)], read_namespace=None
    ):
        assert_type(outcome, StartOutcome | ConcurrencyLimitError)
    try:
        total.start({"a": 1}, timeout=5.0)
    except ConcurrencyLimitError as error:
        assert_type(error.limit, int)


async def async_starts() -> None:
    assert_type(await total.adispatch({"a": 1}, tags=["t"]), RunHandle[int])
    assert_type(await Report.adispatch(None), RunHandle)
    assert_type(await total.adispatch_many([{"a": 1}]), BatchStart[int])
    assert_type(await Report.adispatch_many([None], tags=["t"]), BatchStart)
    assert_type(await Report.adispatch(None, wait=0.5), RunHandle)


def misuses(engine: Engine) -> None:
    total.dispatch({"a": 1}, concurency={"key": "k", "limit": 1})  # type: ignore[call-arg]
    Report.start(None, timout=5)  # type: ignore[call-arg]
    engine.start("typing.total", {"a": 1}, queue="fast")  # type: ignore[call-arg]
    total.dispatch({"a": 1}, wait="5")  # type: ignore[arg-type]
    total.dispatch({"a": 1}, run_id=1)  # type: ignore[arg-type]
    total.dispatch_many([{"a": 1}], run_id="r1")  # type: ignore[call-arg]
    Concurrency("k", limit="8")  # type: ignore[arg-type]
    Concurrency("k", limit=8, weight="2")  # type: ignore[arg-type]
    workflow(name="typing.none")(42)  # type: ignore[call-overload]


# Django's tasks framework on durable runs: the backend is a BaseTaskBackend, its enqueue
# typed as Django's.
def _tasks_backend(backend: DurableTaskBackend) -> None:
    from django.tasks import TaskResult, task
    from django.tasks.backends.base import BaseTaskBackend

    assert_type(backend.supports_defer, bool)
    assert isinstance(backend, BaseTaskBackend)

    @task
    def add(a: int, b: int) -> int:
        return a + b

    assert_type(add.enqueue(1, b=2).return_value, int)
    assert_type(backend.get_result("id"), TaskResult[..., Any])
    add.enqueue("one", 2)  # type: ignore[arg-type]
    assert_type(backend.quota(add), TaskQuota | None)
    assert_type(task_quota("app.tasks.add", {"key": "k", "limit": 1}), TaskQuota)


# The metrics: sinks installed by hand, the quota gauge's reading, the /metrics view.
def _metrics(engine: Engine) -> None:
    from django.http import HttpRequest, HttpResponse
    from prometheus_client import CollectorRegistry

    sinks: tuple[Sink, ...] = (
        OpenTelemetryMetrics(quota_keys=0),
        PrometheusMetrics(CollectorRegistry(), engine=engine, quota_keys=QUOTA_KEYS),
        default_metrics(),
    )
    reset(install(*sinks))
    assert_type(busiest_keys(engine, 5), list[tuple[str, int]])
    assert_type(metrics_view(HttpRequest()), HttpResponse)
    assert_type(scrape_registry(), CollectorRegistry)
    assert_type(multiprocess_mode(), bool)
    assert all(isinstance(metric, Metric) for metric in METRICS)
    assert isinstance(MetricsObserver(), object)
    CollectorRegistry().register(QuotaCollector(engine, limit=3))
    busiest_keys(engine, "5")  # type: ignore[arg-type]


# The 429 decorator keeps the view's type: its parameters, and its response or the 429's.
def _http_views() -> None:
    from django.http import HttpRequest, HttpResponse, JsonResponse

    @concurrency_limit_response
    def start_turn(request: HttpRequest, tenant: int) -> HttpResponse:
        return HttpResponse()

    @concurrency_limit_response
    async def astart_turn(request: HttpRequest, tenant: int) -> HttpResponse:
        return HttpResponse()

    request = HttpRequest()
    assert_type(start_turn(request, 1), HttpResponse | JsonResponse)
    assert_type(astart_turn(request, 1), Coroutine[Any, Any, HttpResponse | JsonResponse]).close()
    _view: Callable[[HttpRequest, int], HttpResponse] = start_turn  # still a view
    start_turn(request, "acme")  # type: ignore[arg-type]
    astart_turn(request).close()  # type: ignore[call-arg]

    def no_request() -> HttpResponse:
        return HttpResponse()

    concurrency_limit_response(no_request)  # type: ignore[arg-type]
