"""The database instrumentations a team runs see every statement of a start and a turn on
PostgreSQL, the kept cursors' (``stores/postgres/bound.py``) included: sentry-sdk's
Django integration (DB spans), OpenTelemetry's psycopg instrumentation (DB spans) and
django-prometheus' database backend (its counters), each used for real."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
from django.db import connection, connections
from django.db.utils import load_backend

from durable_django import Concurrency, Engine, RunStatus
from durable_django.models import Signal

from ..helpers import statements_sent

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's kept cursors"),
]

#: The functions a start after the first on a connection and a turn of a plain step, a
#: transactional one and a last plain one call: the start, the claim, the transactional
#: step's record with its COMMIT (the first step's record goes in its transaction), the
#: end of the turn with the last step's record.
CALLED = [
    "durable_start_run_v2",
    "durable_claim_run_v1",
    "durable_record_held_step_v2",
    "durable_transition_v1",
]


def first_start(engine: Engine) -> str:
    """Register a workflow under a quota, of a plain step, a transactional one writing a
    row under a token, and a last plain one; make the first start on the connection
    (the quota's lock and the start, sent as statements); the token."""
    token = f"spans:{uuid.uuid4().hex}"

    def body(ctx: Any, input: Any) -> int:
        ctx.step("one", lambda: 1)
        ctx.transaction("two", lambda: Signal.objects.create(token=token).pk)
        return int(ctx.step("three", lambda: 3))

    engine.register(
        "spans.wf", "1", body, concurrency=Concurrency(key=lambda input: token, limit=5)
    )
    engine.start("spans.wf", {})
    return token


def start_and_turn(engine: Engine, token: str, around: AbstractContextManager[Any]) -> list[str]:
    """A start after :func:`first_start` and its whole turn, inside ``around``; the
    statements the execute wrappers saw, each of :data:`CALLED` among them."""
    with around, statements_sent() as statements:
        handle = engine.start("spans.wf", {})
        assert engine.execute(handle.run_id)
    assert engine.get_run(handle.run_id).status == RunStatus.COMPLETED
    assert Signal.objects.filter(token=token).count() == 1
    called = [name for name in CALLED if any(name in sql for sql in statements)]
    assert called == CALLED, statements
    assert any("durable_record_held_step_v2" in sql and "COMMIT" in sql for sql in statements)
    return statements


# Sentry ----------------------------------------------------------------------------------


class KeptEnvelopes:
    """A sentry-sdk transport keeping the envelopes it is given."""

    def __init__(self) -> None:
        from sentry_sdk.transport import Transport

        class _Transport(Transport):
            def capture_envelope(inner, envelope: Any) -> None:
                self.envelopes.append(envelope)

        self.envelopes: list[Any] = []
        self.transport = _Transport()

    def transactions(self) -> list[dict[str, Any]]:
        events = (envelope.get_transaction_event() for envelope in self.envelopes)
        return [event for event in events if event is not None]


@pytest.fixture
def sentry() -> Iterator[KeptEnvelopes]:
    """sentry-sdk on, with its Django integration, every transaction sampled, its
    envelopes kept in memory; off again afterwards."""
    import sentry_sdk
    from sentry_sdk.integrations.django import DjangoIntegration

    kept = KeptEnvelopes()
    sentry_sdk.init(
        dsn="https://key@sentry.invalid/1",
        transport=kept.transport,
        integrations=[DjangoIntegration()],
        default_integrations=False,
        auto_enabling_integrations=False,
        traces_sample_rate=1.0,
    )
    try:
        yield kept
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)


def test_sentry_has_a_db_span_for_every_statement(orm_engine: Engine, sentry: KeptEnvelopes):
    import sentry_sdk

    token = first_start(orm_engine)
    around = sentry_sdk.start_transaction(name="start and turn", op="test")
    statements = start_and_turn(orm_engine, token, around)
    sentry_sdk.flush()
    (transaction,) = sentry.transactions()
    spans = sorted(transaction["spans"], key=lambda span: span["start_timestamp"])
    assert [span["description"] for span in spans if span["op"] == "db"] == statements


# OpenTelemetry ---------------------------------------------------------------------------


@pytest.fixture
def otel_spans() -> Iterator[Any]:
    """OpenTelemetry's psycopg instrumentation on, its spans kept by the SDK's in-memory
    exporter, on a connection opened once it is on (it instruments ``psycopg.connect``);
    off again afterwards, and that connection closed."""
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = PsycopgInstrumentor()
    connection.close()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        instrumentor.uninstrument()
        connection.close()


def test_opentelemetry_has_a_db_span_for_every_statement(orm_engine: Engine, otel_spans: Any):
    token = first_start(orm_engine)
    spans: list[Any] = []

    @contextmanager
    def around() -> Iterator[None]:
        otel_spans.clear()
        yield
        spans.extend(sorted(otel_spans.get_finished_spans(), key=lambda span: span.start_time))

    statements = start_and_turn(orm_engine, token, around())
    texts = [
        span.attributes.get("db.statement") or span.attributes.get("db.query.text")
        for span in spans
    ]
    # psycopg's instrumentation sees each query string as sent: the transactional step's
    # first statement carries its transaction's BEGIN (stores/postgres/beginning.py).
    (first,) = [i for i, sql in enumerate(statements) if 'INSERT INTO "durable_signal"' in sql]
    sent = [f"BEGIN; {sql}" if i == first else sql for i, sql in enumerate(statements)]
    assert texts == sent
    assert all(span.attributes.get("db.system") == "postgresql" for span in spans)


# django-prometheus -----------------------------------------------------------------------


@pytest.fixture
def prometheus_backend() -> Iterator[None]:
    """The default database on django-prometheus' PostgreSQL backend (as ``ENGINE =
    "django_prometheus.db.backends.postgresql"`` makes it), the test database's settings
    otherwise; Django's own again afterwards."""
    own = connections["default"]
    backend = load_backend("django_prometheus.db.backends.postgresql")
    exporting = backend.DatabaseWrapper(dict(own.settings_dict), "default")
    connections["default"] = exporting
    try:
        yield
    finally:
        connections["default"] = own
        exporting.close()


def executed() -> float:
    """django-prometheus' count of statements on the default PostgreSQL connection, read
    from its counter alone (collecting the whole registry would run the other
    collectors registered there, which may query the database themselves)."""
    from django_prometheus.db.metrics import execute_total

    for family in execute_total.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == {
                "alias": "default",
                "vendor": "postgresql",
            }:
                return sample.value
    return 0.0


def test_django_prometheus_counts_every_statement(orm_engine: Engine, prometheus_backend: None):
    token = first_start(orm_engine)
    counted = []

    @contextmanager
    def around() -> Iterator[None]:
        before = executed()
        yield
        counted.append(executed() - before)

    statements = start_and_turn(orm_engine, token, around())
    assert counted == [len(statements)]


def test_a_connection_instrumented_alone_starts_and_turns(orm_engine: Engine):
    """``PsycopgInstrumentor.instrument_connection`` gives the connection psycopg's
    server-binding ``Cursor`` (traced) as its factory, in place of Django's client-side
    one: the first start and the record with its COMMIT, each a query string of several
    statements, must not be sent as one then."""
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    connection.close()
    connection.ensure_connection()
    PsycopgInstrumentor.instrument_connection(connection.connection)
    try:
        token = first_start(orm_engine)
        handle = orm_engine.start("spans.wf", {})
        assert orm_engine.execute(handle.run_id)
        assert orm_engine.get_run(handle.run_id).status == RunStatus.COMPLETED
        assert Signal.objects.filter(token=token).count() == 1
    finally:
        connection.close()
