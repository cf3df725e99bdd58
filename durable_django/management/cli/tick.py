"""``manage.py durable tick``: the engine's tick, once or every ``--interval`` seconds."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from types import FrameType, TracebackType
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ..._runtime.tick import TickResult
from ...db import one_line
from ...ticker import Ticker
from .base import Subcommand


class TickSubcommand(Subcommand):
    name = "tick"
    help = (
        "Wake runs whose timer is due, hand on runs whose worker died or that are blocked, "
        "send again runs whose message seems lost, fire due schedules. Once, or every "
        "--interval seconds until SIGTERM or SIGINT."
    )

    @classmethod
    def add_arguments(cls, parser: CommandParser) -> None:
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            metavar="SECONDS",
            help=(
                "Tick every this many seconds until stopped (default: tick once). A tick "
                "that fails is logged and the loop goes on, waiting longer while ticks fail."
            ),
        )
        parser.add_argument(
            "--iterations",
            type=int,
            default=None,
            metavar="N",
            help="With --interval, stop after this many ticks.",
        )

    def handle(self, **options: Any) -> None:
        interval, iterations = options["interval"], options["iterations"]
        if interval is not None and interval <= 0:
            raise CommandError("--interval must be a positive number of seconds")
        if iterations is not None and iterations <= 0:
            raise CommandError("--iterations must be a positive number")
        if iterations is not None and interval is None:
            raise CommandError("--iterations needs --interval")
        if interval is None:
            try:
                result = self.engine.tick()
            except Exception as error:
                raise CommandError(f"the tick failed: {one_line(error)}") from error
            self.show(result, always=True)
            return
        try:
            with StopSignals() as stop, self.logging_to_stderr():
                self.loop(interval, iterations, stop)
        except KeyboardInterrupt:
            return

    def loop(self, interval: float, iterations: int | None, stop: StopSignals) -> None:
        """Tick every ``interval`` seconds (longer while ticks fail) until ``stop``."""
        ticker = Ticker(self.engine)
        done = 0
        while not stop.requested:
            result = ticker.tick()
            done += 1
            if result is not None:
                self.show(result)
            if iterations is not None and done >= iterations:
                return
            stop.sleep(ticker.delay(interval))

    def show(self, result: TickResult, *, always: bool = False) -> None:
        counts = asdict(result)
        if self.as_json:
            self.emit_json(counts)
        elif always or any(counts.values()):
            self.write(", ".join(f"{name} {count}" for name, count in counts.items()))

    @contextmanager
    def logging_to_stderr(self) -> Iterator[None]:
        """When logging is not configured for durable_django, its records (a failed tick,
        the tick working again) go to stderr, with their time and level."""
        logger = logging.getLogger("durable_django")
        if logger.hasHandlers():
            yield
            return
        handler = logging.StreamHandler(self.command.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)


class _Wake(BaseException):
    """Ends a sleep when a stop signal comes."""


class StopSignals:
    """While in use (in the main thread), SIGTERM and SIGINT ask a loop to stop.

    A signal that comes while the loop works lets that work finish (``requested`` is
    then true); one that comes during :meth:`sleep` ends the sleep at once. The handlers
    are in place for the first signal only: a second one acts as it would without them
    (SIGINT raises ``KeyboardInterrupt``, SIGTERM ends the process).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested = False
        self._sleeping = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._restore()
        # A signal that came just as a sleep ended.
        return kind is _Wake

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if a stop is requested."""
        try:
            self._sleeping = True
            if not self.requested:
                time.sleep(seconds)
        except _Wake:
            pass
        finally:
            self._sleeping = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self._restore()
        if self._sleeping:
            raise _Wake

    def _restore(self) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)


subcommand = TickSubcommand
