"""The messages that make workers execute runs: Celery task messages (protocol 2, JSON)
for ``durable_django.execute_run``, sent through kombu without Celery's per-call work.

``Task.apply_async`` spends most of a send on work that is the same for every message of
a run: routing the task, building its options, copying the retry policy, firing the
publish signals, checking the queue was declared, and acquiring a producer from a pool
with locks. :func:`publish_runs` does that once per process and queue: the route (the
queue, exchange and routing key Celery's router gives the task) is resolved once and
kept, the queue is declared once per broker connection, and each message is only its
headers and its body, written from the run id, handed to kombu's ``Producer.publish``
on a connection kept in a small pool of this module.

What a worker receives is what ``execute_run.apply_async((run_id,), queue=queue)``
sends, as small as Celery's protocol 2 allows: the same task, task id, root id, workflow
name, arguments and their ``argsrepr``, priority and route, with the app's delivery mode,
compression and publish retry policy; the headers that only repeat what a worker assumes
when they are absent (:data:`LEFT_OUT_HEADERS`) and the empty embedded callbacks are left
out (on Redis 0.6 KB a message where ``apply_async`` writes 1 KB). The producers follow the
Celery app: when its connection pool is replaced (new broker settings, a fork), the old
producers are dropped and new ones connect. With Celery's ``task_always_eager`` (a test
setting), runs go through ``apply_async`` and execute at once, as Celery does.

When something watches Celery's publishing (:func:`watched`: a receiver of
``before_task_publish`` or ``after_task_publish``, sentry-sdk's Celery integration, or
``task_send_sent_event``), the messages go through ``apply_async`` too, so that the
tracing integrations put the caller's trace in their headers and events are sent, as for
any task.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from celery import Celery
from celery import signals as celery_signals
from celery.app import app_or_default
from celery.utils.nodenames import anon_nodename
from kombu import Connection, Producer, Queue
from kombu.common import Broadcast, maybe_declare
from kombu.exceptions import OperationalError

from .._rules.task_meta import message_priority

#: The Celery task every message asks a worker to run, with the run id as its argument.
TASK_NAME = "durable_django.execute_run"

# The body of protocol 2: (args, kwargs, embed); args is [run_id], the embed empty (a
# worker reads its callbacks, errbacks, chain and chord with ``embed.get``).
_BODY_HEAD = "[["
_BODY_TAIL = "],{},{}]"

#: The headers ``apply_async`` writes that a lean message leaves out. Each is optional in
#: Celery's protocol 2, and a worker (Celery 5.4 and later) reads its absence as the value
#: ``apply_async`` gives it in an ``execute_run`` message: no ETA, no expiry, no group
#: index, no retries yet, no time limits, no stamps, no replaced task; ``origin``, the
#: sending node's name, is shown nowhere.
LEFT_OUT_HEADERS = frozenset(
    {
        "eta",
        "expires",
        "group_index",
        "retries",
        "timelimit",
        "origin",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
    }
)


class RunMessage(NamedTuple):
    """One run's message: its run id, its queue ("" for the task's default routing), the
    workflow's name (shown as the task's name by Celery's tools: the ``shadow`` header),
    its priority (``None``: the route's, or ``task_default_priority``), and for a
    ``django.tasks`` run its task's Django priority (-100 to 100), which, unless
    ``priority`` is given, sets the message's for the broker in use
    (:meth:`Publisher.priority`)."""

    run_id: str
    queue: str = ""
    workflow: str = ""
    priority: int | None = None
    task_priority: int | None = None


#: A run to send: a :class:`RunMessage`, or a tuple of its fields (at least the first two).
Run = (
    RunMessage
    | tuple[str, str]
    | tuple[str, str, str, int | None]
    | tuple[str, str, str, int | None, int | None]
)
Runs = Sequence[Run]


def messages(runs: Iterable[Run]) -> list[RunMessage]:
    """``runs`` as :class:`RunMessage` s."""
    return [run if isinstance(run, RunMessage) else RunMessage(*run) for run in runs]


@dataclass(frozen=True, slots=True)
class Route:
    """Where the messages of one queue go, as Celery's router and ``send_task_message``
    decide for the task: the queue to declare, the exchange and routing key, the
    delivery mode, and the priority (the route's, or ``task_default_priority``)."""

    queue: Queue
    exchange: str
    routing_key: str
    delivery_mode: Any
    declare: bool
    priority: int | None = None


class _Pooled:
    """A producer on a connection of its own, and the queues declared on it."""

    __slots__ = ("connection", "declared", "producer", "ready", "redis", "redis_connection")

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.producer = Producer(connection)
        self.declared: set[str] = set()
        self.ready = False
        self.redis: Any = None  # kombu's Redis channel, when messages can be written to it
        self.redis_connection: Any = None  # one connection of its pool, kept for the pushes

    def prepare(self) -> None:
        """Open the channel; on Redis, have it keep one client for its connection pool."""
        channel = self.producer.channel
        _keep_redis_client(channel)
        if _writable_redis(channel):
            self.redis = channel
        self.ready = True

    def push(self, by_key: dict[str, list[bytes]]) -> None:
        """``LPUSH key *values`` for each key, pipelined in one round trip, on a Redis
        connection this producer keeps (redis-py's client and pool add over 100 µs of
        their own to every command). Call only when :attr:`redis` is set."""
        connection = self.redis_connection
        if connection is None:
            pool = self.redis.client.connection_pool
            try:
                connection = pool.get_connection()
            except TypeError:  # redis-py before 5.3 names the command
                connection = pool.get_connection("LPUSH")
            self.redis_connection = connection
        connection.send_packed_command(
            [b"".join(_lpush_command(key, values) for key, values in by_key.items())]
        )
        for _ in by_key:
            connection.read_response()

    def close(self) -> None:
        # a connection that broke may fail to close; it is dropped anyway
        if self.redis_connection is not None:
            with contextlib.suppress(Exception):
                self.redis_connection.disconnect()
        with contextlib.suppress(Exception):
            self.connection.close()


def _keep_redis_client(channel: Any) -> None:
    """kombu's Redis channel builds a ``redis.Redis`` client (and its table of 169
    response callbacks) for every message it puts on a queue, about a third of a send's
    CPU. The channels of this module's producers keep one per connection pool instead:
    a client is only a view of its pool, and it reconnects through it."""
    factory = getattr(channel, "Client", None)
    if factory is None or type(channel).__module__ != "kombu.transport.redis":
        return
    kept: dict[int, Any] = {}

    def client(**kwargs: Any) -> Any:
        pool = kwargs.get("connection_pool")
        if pool is None or len(kwargs) != 1:  # a credential provider: as kombu does
            return factory(**kwargs)
        made = kept.get(id(pool))
        if made is None or made.connection_pool is not pool:
            made = kept[id(pool)] = factory(**kwargs)
        return made

    channel.Client = client


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _lpush_command(key: str, values: list[bytes]) -> bytes:
    """``LPUSH key *values`` in Redis's protocol (RESP)."""
    return b"*%d\r\n$5\r\nLPUSH\r\n%s%s" % (
        len(values) + 2,
        _bulk(key.encode()),
        b"".join(_bulk(value) for value in values),
    )


# Placeholders for what differs from one message to the next, in an envelope's template.
_BODY, _TASK_ID, _ARGSREPR = "\x00body", "\x00task", "\x00args"
_SLOT = re.compile(r'"\\u0000(body|task|args)"')

#: A run id that JSON and ``repr`` write as it is, between quotes.
_PLAIN_ID = re.compile(r"[\w.:@+=/-]*", re.ASCII)


def task_ids(count: int) -> list[str]:
    """``count`` new task ids, random UUIDs (version 4) written as Celery's ``uuid()``
    writes them, from one read of the system's randomness."""
    raw = bytearray(os.urandom(16 * count))
    raw[6::16] = bytes((byte & 0x0F) | 0x40 for byte in raw[6::16])  # the version, 4
    raw[8::16] = bytes((byte & 0x3F) | 0x80 for byte in raw[8::16])  # the variant, RFC 4122
    h = raw.hex()
    return [
        f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-{h[i + 12 : i + 16]}-{h[i + 16 : i + 20]}-"
        f"{h[i + 20 : i + 32]}"
        for i in range(0, 32 * count, 32)
    ]


class Envelope:
    """The JSON that kombu's Redis transport stores for a message of one route, workflow
    and priority, as small as Celery's protocol 2 and kombu's transport allow: rendered
    once with placeholders, then for each message only its run id and task id are put in.

    The body is its JSON text as it is, not in base64: without a ``body_encoding``
    property kombu hands it over unchanged, as with its ``body_encoding`` transport option
    set to ``utf-8``. Of the properties, it keeps the ones a worker and kombu read: the
    correlation id, the route (``delivery_info``, for a message restored to its queue),
    the priority and the delivery tag, which is the task id (unique to the message, as
    kombu's own tag is). ``reply_to`` (empty) and ``delivery_mode`` (which no Redis
    channel reads) are left out, as are the :data:`LEFT_OUT_HEADERS`."""

    __slots__ = ("template",)

    def __init__(self, route: Route, headers: dict[str, Any], priority: int) -> None:
        headers = {**headers, "id": _TASK_ID, "root_id": _TASK_ID, "argsrepr": _ARGSREPR}
        text = json.dumps(
            {
                "body": _BODY,
                "content-encoding": "utf-8",
                "content-type": "application/json",
                "headers": headers,
                "properties": {
                    "correlation_id": _TASK_ID,
                    "delivery_info": {"exchange": "", "routing_key": route.routing_key},
                    "priority": priority,
                    "delivery_tag": _TASK_ID,
                },
            },
            separators=(",", ":"),
        )
        pieces = _SLOT.split(text)
        literals = [piece.encode().replace(b"%", b"%%") for piece in pieces[0::2]]
        parts = [literals[0]]
        for slot, literal in zip(pieces[1::2], literals[1:], strict=True):
            parts += (b"%(" + slot.encode() + b")s", literal)
        self.template = b"".join(parts)

    def render(self, run_id: str, task_id: str) -> bytes:
        """The envelope of ``run_id``'s message, with the task id ``task_id``."""
        if _PLAIN_ID.fullmatch(run_id):  # JSON and repr write it as it is
            plain = run_id.encode()
            body = b'"[[\\"%s\\"],{},{}]"' % plain
            argsrepr = b"\"('%s',)\"" % plain
        else:
            body = json.dumps(_BODY_HEAD + json.dumps(run_id) + _BODY_TAIL).encode()
            argsrepr = json.dumps(f"({run_id!r},)").encode()
        return self.template % {
            b"body": body,
            b"task": b'"%s"' % task_id.encode(),
            b"args": argsrepr,
        }


def _writable_redis(channel: Any) -> bool:
    """Whether messages for ``channel`` can be pushed onto its Redis lists as kombu's Redis
    transport stores them: its plain channel (not Sentinel's), no key prefix."""
    try:
        from kombu.transport.redis import Channel as RedisChannel
    except ImportError:  # redis-py is not installed: no Redis broker either
        return False
    return type(channel) is RedisChannel and not getattr(channel, "global_keyprefix", "")


class Publisher:
    """Sends ``execute_run`` messages for one Celery app: routes kept per queue,
    producers kept in a pool (at most ``broker_pool_limit`` idle)."""

    def __init__(self, app: Celery) -> None:
        conf = app.conf
        self.app = app
        self.source = app.pool  # replaced by Celery on a fork or new broker settings
        self.pid = os.getpid()
        self.origin = anon_nodename()
        self.compression: str | None = conf.task_compression
        self.retry = bool(conf.task_publish_retry)
        self.policy: dict[str, Any] = dict(conf.task_publish_retry_policy or {})
        limit = conf.broker_pool_limit
        self.limit = 10 if limit is None else int(limit)
        self.routes: dict[str, Route] = {}
        # by routing key, workflow and priority: a few per workflow
        self.envelopes: dict[tuple[str, str, int], Envelope] = {}
        self.idle: deque[_Pooled] = deque()
        self._eager = bool(conf.task_always_eager)
        self.sent_events = bool(conf.task_send_sent_event)
        self.default_priority: int | None = conf.task_default_priority
        # kombu's Redis transport serves priority 0 first; AMQP brokers serve 9 first
        with app.connection_for_write() as connection:
            self.lowest_first: bool = connection.transport.driver_type == "redis"

    @property
    def eager(self) -> bool:
        """Celery's ``task_always_eager``: as set on the app at run time
        (``app.conf.task_always_eager = True``), or else as configured when this publisher
        was made (a read through the Django settings costs tens of µs; a change of the
        ``CELERY_*`` settings makes a new publisher)."""
        changes = self.app.conf.changes or {}
        if "task_always_eager" in changes:
            return bool(changes["task_always_eager"])
        return self._eager

    def is_current(self, app: Celery) -> bool:
        """Whether this publisher still serves ``app`` as it is configured now."""
        return app is self.app and app.pool is self.source and os.getpid() == self.pid

    def route(self, queue: str) -> Route:
        """The route of ``queue`` ("" for the task's default routing), resolved once."""
        route = self.routes.get(queue)
        if route is None:
            route = self.routes[queue] = self._resolve(queue)
        return route

    def _resolve(self, queue: str) -> Route:
        app = self.app
        amqp = app.amqp
        asked: dict[str, Any] = {"queue": queue} if queue else {}
        if self.default_priority is not None:  # as Task.apply_async: over the route's
            asked["priority"] = self.default_priority
        options = amqp.router.route(asked, TASK_NAME, (), {})
        target = options.get("queue")
        if target is None:
            target = amqp.default_queue
        elif isinstance(target, str):
            target = amqp.queues[target]
        exchange = options.get("exchange")
        routing_key = options.get("routing_key")
        exchange_type = getattr(target.exchange, "type", "direct")
        # as Celery's send_task_message: a direct exchange is sent through the default one
        if (not exchange or not routing_key) and exchange_type == "direct":
            exchange, routing_key = "", target.name
        else:
            exchange = getattr(exchange, "name", exchange) or target.exchange.name
            exchange = exchange or amqp.default_exchange.name
            routing_key = routing_key or target.routing_key or app.conf.task_default_routing_key
        delivery_mode = (
            getattr(target.exchange, "delivery_mode", None) or app.conf.task_default_delivery_mode
        )
        return Route(
            queue=target,
            exchange=exchange,
            routing_key=routing_key,
            delivery_mode=delivery_mode,
            declare=not isinstance(target, Broadcast),
            priority=options.get("priority"),
        )

    # the pool ---------------------------------------------------------------------

    def _acquire(self) -> _Pooled:
        try:
            return self.idle.pop()
        except IndexError:
            return _Pooled(self.app.connection_for_write())

    def _release(self, pooled: _Pooled) -> None:
        if len(self.idle) < self.limit:
            self.idle.append(pooled)
        else:
            pooled.close()

    def close(self) -> None:
        """Close the idle producers' connections."""
        while self.idle:
            self.idle.pop().close()

    # sending ----------------------------------------------------------------------

    def watched(self) -> bool:
        """Whether the messages must go through ``apply_async``: Celery's publish signals
        have a receiver, sentry-sdk's Celery integration is active, or the app sends
        ``task-sent`` events."""
        return self.sent_events or _publishing_watched()

    def send(self, runs: Runs) -> None:
        """:meth:`publish` the runs' messages; under Celery's ``task_always_eager``, or
        when the publishing is :meth:`watched`, send them through ``apply_async`` instead,
        as Celery does for any task."""
        if not (self.eager or self.watched()):
            self._publish(messages(runs))
            return
        task = self.app.tasks[TASK_NAME]
        for message in messages(runs):
            options: dict[str, Any] = {"shadow": message.workflow or None}
            if message.queue:  # else the task's default routing
                options["queue"] = message.queue
            priority = self.own_priority(message)
            if priority is not None:
                options["priority"] = priority
            task.apply_async((message.run_id,), **options)

    def own_priority(self, message: RunMessage) -> int | None:
        """The priority ``message`` asks for: its own, else its task's as a Celery
        priority in the direction of this publisher's broker
        (:func:`~durable_django._rules.task_meta.message_priority`), else ``None``."""
        if message.priority is not None or message.task_priority is None:
            return message.priority
        return message_priority(message.task_priority, lowest_first=self.lowest_first)

    def priority(self, message: RunMessage, route: Route) -> int:
        """The priority ``message`` goes out with: its own (:meth:`own_priority`), the
        route's, or 0, within Celery's 0-9."""
        priority = self.own_priority(message)
        if priority is None:
            priority = route.priority or 0
        return priority if 0 <= priority <= 9 else min(max(priority, 0), 9)

    def publish(self, runs: Runs) -> None:
        """Send one message per run; retry on a broker error as the app's
        publish retry policy says (an unbounded ``max_retries`` is taken as 3), on a new
        connection each time; raise the last error."""
        self._publish(messages(runs))

    def _publish(self, batch: Sequence[RunMessage]) -> None:
        most_retries = self.policy.get("max_retries", 3)
        retries = (3 if most_retries is None else int(most_retries)) if self.retry else 0
        interval = float(self.policy.get("interval_start", 0) or 0)
        step = float(self.policy.get("interval_step", 0.2) or 0)
        most = float(self.policy.get("interval_max", 0.2) or 0)
        attempt = 0
        while True:
            pooled = self._acquire()
            try:
                self._send(pooled, batch)
            except BaseException as error:
                pooled.close()  # a connection that failed is never reused
                connection = pooled.connection
                recoverable = (
                    *connection.connection_errors,
                    *connection.channel_errors,
                    OperationalError,  # kombu's, for a connection it could not make
                    OSError,
                )
                if not isinstance(error, recoverable) or attempt >= retries:
                    raise
                attempt += 1
                if interval:
                    time.sleep(interval)
                interval = min(interval + step, most)
            else:
                self._release(pooled)
                return

    def _send(self, pooled: _Pooled, runs: Sequence[RunMessage]) -> None:
        if not pooled.ready:
            pooled.prepare()
        if pooled.redis is not None and self.compression is None:
            self._push(pooled, runs)
            return
        producer = pooled.producer
        batch = getattr(producer, "batch", None)  # kombu 5.7 and later
        if (
            len(runs) > 1
            and batch is not None
            and getattr(producer, "supports_batch_publish", False)
        ):
            with batch():  # one round trip on Redis
                for message in runs:
                    self._send_one(pooled, message)
        else:
            for message in runs:
                self._send_one(pooled, message)

    def _push(self, pooled: _Pooled, runs: Sequence[RunMessage]) -> None:
        """On Redis: each queue's messages written with one ``LPUSH`` of their envelopes,
        the JSON that kombu's Redis transport stores for a message (the body as it is, the
        task id as its delivery tag), in the order given, on a connection of the
        channel's pool: every queue's command in one round trip. The route, priority and
        envelope are looked up once for the runs of one queue, workflow and priority.
        Queues with an expiry, and routes through a named exchange, go through kombu."""
        by_key: dict[str, list[bytes]] = {}
        # per (queue, workflow, priority, task priority): its list and envelope, or None
        kinds: dict[tuple[str, str, int | None, int | None], tuple[list[bytes], Envelope] | None]
        kinds = {}
        ids = task_ids(len(runs))
        for message, task_id in zip(runs, ids, strict=True):
            kind = (message.queue, message.workflow, message.priority, message.task_priority)
            if kind in kinds:
                found = kinds[kind]
            else:
                found = kinds[kind] = self._kind(pooled, message, by_key)
            if found is None:
                self._send_one(pooled, message)
            else:
                found[0].append(found[1].render(message.run_id, task_id))
        if by_key:
            pooled.push(by_key)

    def _kind(
        self, pooled: _Pooled, message: RunMessage, by_key: dict[str, list[bytes]]
    ) -> tuple[list[bytes], Envelope] | None:
        """Where the messages like ``message`` go on Redis (its queue, workflow and
        priority): the list of ``by_key`` they join and their envelope; ``None`` when they
        go through kombu."""
        channel = pooled.redis
        route = self.route(message.queue)
        self._declare(pooled, route, message.queue)
        if route.exchange or route.routing_key in channel._expires:
            return None
        priority = self.priority(message, route)
        key = channel._q_for_pri(route.routing_key, priority)  # kombu's, per priority
        return by_key.setdefault(key, []), self._envelope(message, route, priority)

    def _envelope(self, message: RunMessage, route: Route, priority: int) -> Envelope:
        kept = (route.routing_key, message.workflow, priority)
        template = self.envelopes.get(kept)
        if template is None:
            headers = self._headers(RunMessage("", workflow=message.workflow), "")
            template = self.envelopes[kept] = Envelope(route, headers, priority)
        return template

    def _declare(self, pooled: _Pooled, route: Route, queue: str) -> None:
        if route.declare and queue not in pooled.declared:
            channel: Any = pooled.producer.channel  # a channel once the producer is bound
            maybe_declare(route.queue, channel, retry=False)
            pooled.declared.add(queue)

    def _headers(self, message: RunMessage, task_id: str) -> dict[str, Any]:
        """The headers of ``message``: those protocol 2 requires, the workflow's name
        (``shadow``), the arguments as Celery's tools show them and ``ignore_result``;
        none of the :data:`LEFT_OUT_HEADERS`."""
        headers: dict[str, Any] = {
            "lang": "py",
            "task": TASK_NAME,
            "id": task_id,
            "root_id": task_id,
            "parent_id": None,
            "group": None,
            "argsrepr": f"({message.run_id!r},)",
            "kwargsrepr": "{}",
            "ignore_result": True,  # the task's: Celery before 5.7 reads an absent one as False
        }
        if message.workflow:
            headers["shadow"] = message.workflow
        return headers

    def _send_one(self, pooled: _Pooled, message: RunMessage) -> None:
        route = self.route(message.queue)
        self._declare(pooled, route, message.queue)
        task_id = str(uuid.uuid4())
        pooled.producer.publish(
            (_BODY_HEAD + json.dumps(message.run_id) + _BODY_TAIL).encode(),
            exchange=route.exchange,
            routing_key=route.routing_key,
            headers=self._headers(message, task_id),
            priority=self.priority(message, route),
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=route.delivery_mode,
            compression=self.compression,
            correlation_id=task_id,
            retry=False,
        )


def _publishing_watched() -> bool:
    """Whether Celery's publish signals have a receiver (the OpenTelemetry Celery
    instrumentation, django-structlog ...) or sentry-sdk's Celery integration, which wraps
    ``Task.apply_async``, is active."""
    if celery_signals.before_task_publish.receivers or celery_signals.after_task_publish.receivers:
        return True
    sentry_celery = sys.modules.get("sentry_sdk.integrations.celery")
    if sentry_celery is None:
        return False
    import sentry_sdk

    return sentry_sdk.get_client().get_integration(sentry_celery.CeleryIntegration) is not None


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def publisher() -> Publisher:
    """The publisher of the current Celery app, made anew when the app's broker
    connections were replaced (other settings, or a fork)."""
    global _publisher
    app = app_or_default(None)
    current = _publisher
    if current is not None and current.is_current(app):
        return current
    with _publisher_lock:
        current = _publisher
        if current is None or not current.is_current(app):
            if current is not None and current.pid == os.getpid():
                current.close()  # a forked child leaves its parent's connections alone
            current = _publisher = Publisher(app)
    return current


def publish_runs(runs: Iterable[Run]) -> None:
    """Send the ``execute_run`` message of each run (a :class:`RunMessage`, or
    ``(run_id, queue)`` with queue "" for the task's default routing), on one broker
    connection, in one round trip on Redis.

    Raises the broker's error once the app's publish retry policy is spent; the runs
    are then sent again by the tick.
    """
    batch = runs if isinstance(runs, Sequence) else list(runs)
    if batch:
        publisher().send(batch)


def publish_run(run_id: str, queue: str) -> None:
    """Send the ``execute_run`` message of one run; see :func:`publish_runs`."""
    publisher().send((RunMessage(run_id, queue),))


def forget_publisher() -> None:
    """Make a new publisher on the next send (the Celery settings changed)."""
    global _publisher
    with _publisher_lock:
        current, _publisher = _publisher, None
    if current is not None and current.pid == os.getpid():
        current.close()


__all__ = [
    "TASK_NAME",
    "Publisher",
    "Route",
    "Run",
    "RunMessage",
    "Runs",
    "forget_publisher",
    "messages",
    "publish_run",
    "publish_runs",
    "publisher",
]
