"""Ticking again and again: a tick that fails is logged, and the next one goes on."""

from __future__ import annotations

import logging

from ._runtime.tick import TickResult
from .db import close_connections, close_stale_connections, one_line
from .engines import Engine, default_engine

logger = logging.getLogger(__name__)

#: While ticks fail, the wait between them doubles up to this (or the interval, if longer).
MAX_BACKOFF_SECONDS = 30.0


class Ticker:
    """Ticks an engine (the default one if none is given), each tick on its own.

    Each tick runs as Django runs a request: connections that are broken or older than
    ``CONN_MAX_AGE`` are closed before and after it. A tick that raises returns None
    instead: it is logged at ERROR on one line (the exception's type and message; the
    traceback at DEBUG), and the thread's connections are closed, so that the next tick
    opens fresh ones. An error of the same type as the previous failure's (the messages
    of one outage vary: refused, reset, starting up) is logged at the 2nd, 4th, 8th ...
    failure in a row only; the first tick that works again is logged at INFO.
    """

    def __init__(self, engine: Engine | None = None) -> None:
        self._engine = engine
        #: Ticks failed in a row.
        self.failures = 0
        self._last_error: type[BaseException] | None = None

    @property
    def engine(self) -> Engine:
        return self._engine if self._engine is not None else default_engine

    def tick(self) -> TickResult | None:
        """One tick of the engine: what it did, or None when it failed."""
        close_stale_connections()
        try:
            result = self.engine.tick()
        except Exception as error:
            close_connections()
            self._failed(error)
            return None
        close_stale_connections()
        if self.failures:
            logger.info("durable tick works again, after %d failed tick(s)", self.failures)
            self.failures, self._last_error = 0, None
        return result

    def delay(self, interval: float) -> float:
        """How long to wait before the next tick: ``interval``, doubled for each failed
        tick in a row after the first, up to :data:`MAX_BACKOFF_SECONDS` (or
        ``interval`` if it is longer)."""
        if self.failures <= 1:
            return interval
        return min(interval * 2.0 ** min(self.failures - 1, 32), max(interval, MAX_BACKOFF_SECONDS))

    def _failed(self, error: Exception) -> None:
        self.failures += 1
        # Powers of two: the 1st, 2nd, 4th, 8th ... failure in a row.
        if type(error) is not self._last_error or not self.failures & (self.failures - 1):
            in_a_row = f" ({self.failures} failed ticks in a row)" if self.failures > 1 else ""
            logger.error("durable tick failed: %s%s", one_line(error), in_a_row)
        logger.debug("durable tick failed", exc_info=error)
        self._last_error = type(error)
