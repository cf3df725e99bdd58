"""Fair quotas at the start path: the ticket a start presents (:class:`Presented`), and a
refusal's place kept in its key's line (:func:`keep_line`)."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.utils import timezone

from ..._rules import concurrency as quotas
from ..._rules import tickets
from ...errors import ConcurrencyLimitError
from ..handles import RunHandle

if TYPE_CHECKING:
    from ..._core.runtime import Runtime

logger = logging.getLogger("durable_django.starting")


class Presented:
    """The ticket a start presents to fair quotas: the one given (``ticket=``, checked
    here, before anything is written), else the one the request being served presented
    (:func:`durable_django._rules.tickets.presenting`, ignored when not valid); after a
    refusal, the ticket it gave, for the next attempt of a waiting start."""

    __slots__ = ("ticket",)

    def __init__(self, token: str | None) -> None:
        self.ticket = (
            tickets.read(token)
            if token is not None
            else tickets.read_presented(tickets.presented())
        )

    def attempt(self, admit: Callable[[tickets.Ticket | None], RunHandle]) -> RunHandle:
        """``admit(ticket)``, keeping the ticket a refusal gives."""
        try:
            return admit(self.ticket)
        except ConcurrencyLimitError as error:
            if error.ticket is not None:
                self.ticket = tickets.read(error.ticket)
            raise


def keep_line(
    engine: Runtime,
    error: ConcurrencyLimitError,
    quota: quotas.Quota,
    line: tickets.Line,
    give_ticket: bool,
) -> None:
    """A fair quota's refusal, in its key's line (the engine's namespace's): when the
    line alone turned the start away, a unit is held for it, and the line's tickets no
    hold binds (one may have ended since the line was read) are bound to one ending a
    window from now. With ``give_ticket``, the start's ticket (the one it presented, now
    kept, joining the back of the line bound to the hold it saw running, if it had not;
    or a new one, not kept until it comes back) goes on the error, valid until
    ``retry_after`` and the window have passed. A write that fails is logged: the
    refusal stands, and the ticket stays valid, unkept."""
    now = timezone.now()
    window = datetime.timedelta(seconds=quota.fair_window or 0)
    expires = now + datetime.timedelta(seconds=error.retry_after) + window
    hold_ends = line.hold_ends or (now + window if line.holds else None)
    presented = line.ticket
    if give_ticket:
        ticket = presented or tickets.issue(quota.key, quota.weight, now, expires)
        error.ticket = ticket.token
    try:
        if line.holds:  # a window from now for those no hold binds, whatever was read
            engine.store.hold_tickets(quota.key, engine.read_namespace, now + window)
        if give_ticket and presented is not None:
            engine.store.keep_ticket(
                tickets.KeptTicket(
                    presented.id,
                    quota.key,
                    now,
                    quota.weight,
                    expires,
                    engine.namespace,
                    hold_ends,
                ),
                most=tickets.most_kept(quota.limit),
            )
    except Exception:  # the refusal stands whatever the writes did
        logger.warning("could not keep the tickets of key %r", quota.key, exc_info=True)


__all__ = ["Presented", "keep_line"]
