"""Real Celery workers for the tests: started as subprocesses on the suite's broker.

A worker runs ``celery -A tests.celery_app worker --pool=solo`` (or another pool) on one
queue, against the test database of the pytest process that started it
(``DURABLE_TEST_DB_NAME``). It is stopped when the ``with`` block ends, whatever happened
inside, and it is killed with its parent should the pytest process die first.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import connection

from durable_django import RunHandle, RunTimeout
from durable_django._runtime import sending

from .celery_app import app

ROOT = Path(__file__).resolve().parent.parent
#: How long a worker may take to boot, and a run to settle, before the test fails.
WAIT = 60.0
#: kombu's Redis transport keeps priorities 3, 6 and 9 in lists of their own.
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITIES = (3, 6, 9)


def unique_queue(prefix: str) -> str:
    """A queue name no other test run uses."""
    return f"{prefix}-{uuid.uuid4().hex}"


# the broker ---------------------------------------------------------------------------


def broker_client() -> redis.Redis:
    """A redis-py client on the broker's database."""
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def queue_keys(queue: str) -> list[str]:
    """Every Redis key the transport keeps for ``queue``."""
    return [
        queue,
        *(f"{queue}{PRIORITY_SEPARATOR}{priority}" for priority in PRIORITIES),
        f"_kombu.binding.{queue}",
        f"_kombu.binding_permanent.{queue}",
    ]


def sent() -> None:
    """Wait until the run messages this process handed to its sender thread have left
    (``durable_django._runtime.sending``): what the tests read or change on a queue is then what
    the starts made so far sent."""
    assert sending.flush(10), "run messages were still not sent after 10 s"


def queued_count(client: redis.Redis, queue: str) -> int:
    """How many messages wait on ``queue``, at every priority."""
    sent()
    return sum(client.llen(key) for key in queue_keys(queue)[: 1 + len(PRIORITIES)])


def raw_messages(client: redis.Redis, queue: str) -> list[bytes]:
    """The raw messages waiting on ``queue`` (default priority), oldest first."""
    sent()
    return list(reversed(client.lrange(queue, 0, -1)))


def decode_message(raw: bytes) -> tuple[dict[str, Any], Any]:
    """A JSON message's envelope and its decoded body."""
    envelope = json.loads(raw)
    body = envelope["body"]
    if envelope["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    return envelope, json.loads(body)


def queued_run_ids(client: redis.Redis, queue: str) -> list[str]:
    """The run ids that the messages waiting on ``queue`` ask to execute, oldest first."""
    ids = []
    for raw in raw_messages(client, queue):
        envelope, (args, _kwargs, _embed) = decode_message(raw)
        assert envelope["headers"]["task"] == "durable_django.execute_run"
        ids.extend(args)
    return ids


def delete_queue(client: redis.Redis, queue: str) -> None:
    """Remove ``queue``, its messages and its bindings from the broker."""
    sent()
    client.delete(*queue_keys(queue))


# workers ------------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Have the kernel send SIGTERM to the worker when the pytest process dies."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Worker:
    """A ``celery worker`` subprocess consuming one queue."""

    def __init__(
        self,
        queue: str,
        *,
        include: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        pool: str = "solo",
        options: Iterable[str] = (),
    ) -> None:
        self.queue = queue
        self.pool = pool
        self.options = tuple(options)
        self.hostname = f"durable-test-{uuid.uuid4().hex}@localhost"
        self.include = tuple(include)
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="durable-worker-", suffix=".log", delete=False
        )

    def __repr__(self) -> str:
        return f"<Worker {self.hostname} queue={self.queue}>"

    def command(self) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.celery_app",
            "worker",
            f"--pool={self.pool}",
            "--concurrency=1",
            "--loglevel=warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            self.queue,
            "-n",
            self.hostname,
        ]
        if self.include:
            command += ["--include", ",".join(self.include)]
        return command + list(self.options)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DURABLE_TEST_DB=os.environ.get("DURABLE_TEST_DB", "sqlite"),
            # The database the pytest process is using: its test database.
            DURABLE_TEST_DB_NAME=str(connection.settings_dict["NAME"]),
            DURABLE_TEST_BROKER=settings.CELERY_BROKER_URL,
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.wait_ready()

    def wait_ready(self) -> None:
        """Return once the worker answers a ping; fail with its log if it never does."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"{self!r} exited before it was ready:\n{self.log()}")
            if app.control.ping(destination=[self.hostname], timeout=0.5):
                return
        raise RuntimeError(f"{self!r} did not answer a ping within {WAIT}s:\n{self.log()}")

    def stop(self) -> None:
        """Warm shutdown, then a kill if the worker does not exit in time."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._log.close()

    def log(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def discard_log(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._log.name)

    def result(self, handle: RunHandle) -> Any:
        """The run's output once it settles; its worker's log in the failure otherwise."""
        try:
            return handle.result(timeout=WAIT)
        except RunTimeout as error:
            raise AssertionError(f"{error}; log of {self!r}:\n{self.log()}") from None


@contextlib.contextmanager
def running_worker(
    queue: str,
    *,
    include: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    pool: str = "solo",
    options: Iterable[str] = (),
) -> Iterator[Worker]:
    """A ready worker on ``queue`` for the block; stopped when the block ends. ``pool``
    "threads" lets it answer ``inspect`` while it runs a task, "prefork" enforces time
    limits; ``options`` are more ``celery worker`` options."""
    worker = Worker(queue, include=include, env=env, pool=pool, options=options)
    try:
        worker.start()
        yield worker
    finally:
        worker.stop()
        worker.discard_log()


def wait_until(predicate: Callable[[], Any], what: str, *workers: Worker) -> Any:
    """Poll ``predicate`` until it is truthy; fail with the workers' logs after WAIT."""
    deadline = time.monotonic() + WAIT
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "".join(f"\nlog of {worker!r}:\n{worker.log()}" for worker in workers)
            raise AssertionError(f"timed out after {WAIT}s waiting for {what}{logs}")
        time.sleep(0.05)
