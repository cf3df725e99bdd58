"""The brokers the worker tests run on, Redis and RabbitMQ, read and changed directly.

A :class:`Broker` becomes the broker of the test process and of the workers it starts,
with the Celery settings docs/workers.md recommends for it (:meth:`Broker.in_use`), and
does to a queue, behind the workers' backs and through the broker's own client
(redis-py; py-amqp), what the tests need: count the messages waiting, read them without
taking them, add a copy of one (a duplicate), drop them all (a loss), delete the queue.
Every test queue has a name of its own (``tests.worker.unique_queue``), so runs of the
suite in parallel share the servers but never a queue.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import amqp
import kombu
import kombu.pools
import redis
from django.conf import settings
from django.test import override_settings

from . import worker
from .celery_app import app, broker_settings


@dataclass(frozen=True)
class QueuedMessage:
    """A message waiting on a queue, as the broker holds it."""

    content_type: str
    content_encoding: str
    headers: dict[str, Any]
    routing_key: str
    body: Any  # decoded from its JSON
    #: The priority the broker keeps it at: on Redis, that of the list it waits in.
    priority: int | None = None

    def run_ids(self) -> list[str]:
        """The run ids an ``execute_run`` message asks to execute."""
        assert self.headers["task"] == "durable_django.execute_run"
        args, _kwargs, _embed = self.body
        return list(args)


class Broker(abc.ABC):
    """A broker the tests send to, and what they do to its queues directly."""

    name: ClassVar[str]
    url: str

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    @abc.abstractmethod
    def check(self) -> None:
        """Raise if the broker does not answer."""

    @abc.abstractmethod
    def queued_count(self, queue: str) -> int:
        """How many messages wait on ``queue`` (0 for a queue that does not exist)."""

    @abc.abstractmethod
    def messages(self, queue: str) -> list[QueuedMessage]:
        """The messages waiting on ``queue``, oldest first; they stay there."""

    def all_messages(self, queue: str) -> list[QueuedMessage]:
        """The messages waiting on ``queue`` at every priority, with their priority."""
        return self.messages(queue)

    @abc.abstractmethod
    def duplicate_oldest(self, queue: str) -> None:
        """Add a copy of the oldest message waiting on ``queue`` at its end, as a broker
        that delivers a message twice would."""

    @abc.abstractmethod
    def drop_messages(self, queue: str) -> None:
        """Drop every message waiting on ``queue``: they are lost."""

    @abc.abstractmethod
    def delete_queue(self, queue: str) -> None:
        """Remove ``queue``, its messages and what routes to it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the client's connection."""

    def queued_run_ids(self, queue: str) -> list[str]:
        """The run ids the messages waiting on ``queue`` ask to execute, oldest first."""
        return [run_id for message in self.messages(queue) for run_id in message.run_ids()]

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Make this the broker of the test process's Celery app and of the workers the
        tests start (``settings.CELERY_BROKER_URL``), with the settings recommended for it."""
        options = {"broker_url": self.url, **broker_settings(self.url)}
        previous = {key: app.conf[key] for key in options}
        with override_settings(CELERY_BROKER_URL=self.url):
            _reconnect(options)
            try:
                yield
            finally:
                _reconnect(previous)


def _reconnect(options: dict[str, Any]) -> None:
    """Configure the app with ``options`` and drop its broker connections, which were
    opened for the broker it had: the next message or ping connects anew."""
    app.conf.update(options)
    kombu.pools.reset()
    # The app keeps its pools once made; Celery drops them the same way after a fork.
    app._pool = None
    app.amqp._producer_pool = None
    # the task-sent events' dispatcher, whose exchange type is the broker's (fanout on Redis)
    app.amqp.__dict__.pop("_event_dispatcher", None)


class RedisBroker(Broker):
    """kombu's Redis transport, read with the helpers of ``tests.worker``."""

    name = "redis"

    def __init__(self) -> None:
        # The suite's configured broker (``DURABLE_TEST_BROKER``).
        self.url = settings.CELERY_BROKER_URL
        self.client = redis.Redis.from_url(self.url)

    def check(self) -> None:
        self.client.ping()

    def queued_count(self, queue: str) -> int:
        return worker.queued_count(self.client, queue)

    def messages(self, queue: str) -> list[QueuedMessage]:
        return [_from_envelope(raw) for raw in worker.raw_messages(self.client, queue)]

    def all_messages(self, queue: str) -> list[QueuedMessage]:
        worker.sent()
        found = []
        for priority, key in zip((0, *worker.PRIORITIES), worker.queue_keys(queue), strict=False):
            for raw in reversed(self.client.lrange(key, 0, -1)):
                found.append(dataclasses.replace(_from_envelope(raw), priority=priority))
        return found

    def duplicate_oldest(self, queue: str) -> None:
        raw = worker.raw_messages(self.client, queue)
        assert raw, f"no message waits on {queue}"
        # Sent with LPUSH, received with BRPOP: the list's head is its newest end.
        self.client.lpush(queue, raw[0])

    def drop_messages(self, queue: str) -> None:
        worker.sent()
        self.client.delete(*worker.queue_keys(queue)[: 1 + len(worker.PRIORITIES)])

    def delete_queue(self, queue: str) -> None:
        worker.delete_queue(self.client, queue)

    def close(self) -> None:
        self.client.close()


def _from_envelope(raw: bytes) -> QueuedMessage:
    """A message as kombu's Redis transport stores it: a JSON envelope."""
    envelope, body = worker.decode_message(raw)
    return QueuedMessage(
        content_type=envelope["content-type"],
        content_encoding=envelope["content-encoding"],
        headers=envelope["headers"],
        routing_key=envelope["properties"]["delivery_info"]["routing_key"],
        body=body,
    )


class RabbitMQBroker(Broker):
    """RabbitMQ through py-amqp: Celery declares a durable queue, and a direct exchange of
    the same name routing to it, when it first sends to a queue."""

    name = "rabbitmq"

    def __init__(self) -> None:
        self.url = os.environ.get("DURABLE_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
        self.connection = kombu.Connection(self.url)

    def check(self) -> None:
        self.connection.ensure_connection(max_retries=1)

    @contextlib.contextmanager
    def channel(self) -> Iterator[amqp.Channel]:
        """A channel of its own: a refused method closes the channel it was sent on, and
        closing a channel puts the messages it took without acknowledging them back."""
        worker.sent()
        channel = self.connection.channel()
        try:
            yield channel
        finally:
            with contextlib.suppress(amqp.exceptions.AMQPError, OSError):
                channel.close()

    def queued_count(self, queue: str) -> int:
        with self.channel() as channel:
            try:
                return channel.queue_declare(queue, passive=True).message_count
            except amqp.exceptions.NotFound:
                return 0

    def _take_all(self, channel: amqp.Channel, queue: str) -> list[amqp.Message]:
        """Every message waiting on ``queue``, taken without acknowledgement: they go
        back, in their order, when the channel closes."""
        taken = []
        try:
            while (message := channel.basic_get(queue)) is not None:
                taken.append(message)
        except amqp.exceptions.NotFound:
            return []
        return taken

    def messages(self, queue: str) -> list[QueuedMessage]:
        with self.channel() as channel:
            return [_from_amqp(message) for message in self._take_all(channel, queue)]

    def duplicate_oldest(self, queue: str) -> None:
        with self.channel() as channel:
            taken = self._take_all(channel, queue)
            assert taken, f"no message waits on {queue}"
            oldest = taken[0]
            channel.basic_publish(
                amqp.Message(oldest.body, **oldest.properties), exchange="", routing_key=queue
            )

    def drop_messages(self, queue: str) -> None:
        with self.channel() as channel:
            channel.queue_purge(queue)

    def delete_queue(self, queue: str) -> None:
        with self.channel() as channel:
            channel.queue_delete(queue)
            channel.exchange_delete(queue)

    def close(self) -> None:
        self.connection.release()


def _from_amqp(message: amqp.Message) -> QueuedMessage:
    """A message as py-amqp hands it over: properties, headers, and the body, decoded
    from its content encoding."""
    return QueuedMessage(
        content_type=message.properties["content_type"],
        content_encoding=message.properties["content_encoding"],
        headers=dict(message.headers),
        routing_key=message.delivery_info["routing_key"],
        body=json.loads(message.body),
        priority=message.properties.get("priority"),
    )


#: By broker: a django.tasks priority and the priority the broker keeps its run's message
#: at: RabbitMQ's larger first; on Redis reversed, in kombu's lists 0, 3, 6 and 9 (9 -> 0,
#: 5 -> 3, 0 -> 9).
TASK_PRIORITIES = {
    "rabbitmq": {-100: 0, 0: 4, 100: 9},
    "redis": {-100: 9, 0: 3, 100: 0},
}

#: The broker classes by name.
BY_NAME: dict[str, type[Broker]] = {cls.name: cls for cls in (RedisBroker, RabbitMQBroker)}
