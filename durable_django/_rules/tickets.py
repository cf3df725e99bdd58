"""Fair turns on a quota key: tickets for refused starts, served in the order given.

A **fair** quota (``Concurrency(..., fair=True)``) gives each start it refuses a
**ticket**, ``ConcurrencyLimitError.ticket``: an opaque string, signed with the
project's ``SECRET_KEY``. A retry presenting it (``dispatch(..., ticket=...)``, or the
``Durable-Ticket`` request header read by the 429 middleware and decorator) takes, and
then keeps, a place in the key's line:

- A ticket is **kept** by the store, and joins the back of the line, the first time its
  client comes back with it and is refused again. Until then it reserves nothing: the
  refusals of a client that never presents its tickets (a flood) write nothing and hold
  no slot. (Joining on the first return rather than on the first refusal keeps the line
  known: a ticket's ``retry_after`` counts everything ahead of it, and no ticket issued
  earlier but presented later jumps ahead of it.)
- When a unit of the limit frees while kept tickets wait, it is **held** for the line: a
  start without an older ticket is refused (``error.held`` says how many units are held
  for tickets ahead of it), and the tickets whose turn has come are admitted when their
  clients come back.
- A hold belongs to the line, not to a ticket: it lasts at most the quota's
  ``fair_window`` seconds from the first start it turned away, however many tickets are
  in line. Every ticket in line then, and every one joining while it lasts, is bound to
  it (``KeptTicket.held_until``). A kept ticket admitted ends the hold (the line took a
  held slot: the others keep their places, and the next refusal at a free slot begins
  a new hold); a hold that runs out with no ticket admitted takes every ticket bound to
  it out of the line together, so abandoned tickets keep the key's free slots from
  others one window at most, whatever their number (see :func:`place_in_line`).
- A kept ticket also expires ``retry_after + fair_window`` after its last refusal, an
  unkept one ``retry_after + fair_window`` after it was issued. An expired ticket counts
  as none: its refusal gives a new ticket, at the back of the line.
- A line keeps at most :func:`most_kept` tickets (``LINE_PER_UNIT`` per unit of the
  limit): a ticket presented to a full line is not kept, and stays valid, unkept.
- The line is per namespace wherever the count is: an engine with ``scope_reads`` reads
  the tickets kept in its namespace only, as it counts its namespace's runs only.
- A kept ticket's ``retry_after`` counts the units of the tickets ahead of it: it says
  when its turn likely comes, not when the next slot frees.

A ticket only ever refuses a start the quota would admit, never admits one it would
refuse: the limit holds as it does without tickets. A key with no kept ticket behaves
exactly as a quota that is not fair.

This module is the arithmetic: tokens (:func:`issue`, :func:`read`), what a start's
place in a line is (:func:`place_in_line`), and the ticket the current request
presents (:func:`presenting`). The store keeps the tickets
(``BaseStore.ticket_line`` and its siblings); the start path writes them once the
refused start's transaction has ended (:mod:`durable_django._runtime.starting`).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import signing
from django.utils import timezone

#: The HTTP header a 429 answer gives a ticket in, and a retry presents it in.
HEADER = "Durable-Ticket"

_SALT = "durable_django.tickets"
_presented: ContextVar[str | None] = ContextVar("durable_django_ticket", default=None)


@dataclass(frozen=True, slots=True)
class Ticket:
    """A ticket read from its token: its ``id``, its quota ``key``, when the start it
    stands for was first refused (``issued_at``), the start's ``weight``, and when it
    expires unless the store keeps it (``due``)."""

    token: str
    id: str
    key: str
    issued_at: datetime.datetime
    weight: int
    due: datetime.datetime


@dataclass(frozen=True, slots=True)
class KeptTicket:
    """A ticket the store keeps: a place in key ``key``'s line in ``namespace`` (the
    namespace of the engine that kept it), taken when its client first came back with it
    (``joined_at``), reserving ``weight`` units until ``expires_at``, or until
    ``held_until`` when it is bound to a hold of the line that goes unused."""

    id: str
    key: str
    joined_at: datetime.datetime
    weight: int
    expires_at: datetime.datetime
    namespace: str = ""
    held_until: datetime.datetime | None = None

    @property
    def place(self) -> tuple[datetime.datetime, str]:
        """Its place in the key's line: the earlier joined first, ties broken by id."""
        return (self.joined_at, self.id)

    def live(self, now: datetime.datetime) -> bool:
        """Whether it holds its place at ``now``: not expired, nor taken out of the line
        by a hold that ran out."""
        return self.expires_at > now and (self.held_until is None or self.held_until > now)


@dataclass(frozen=True, slots=True)
class Line:
    """What a fair quota's check found in its key's line for one start.

    ``ticket``: the start's own live ticket for this key (``None``: it has none, or it
    expired); ``kept``: whether the store keeps that ticket; ``ahead``: the units of the
    live kept tickets ahead of the start; ``holds``: whether those tickets alone turn the
    start away (the limit would admit it: a freed unit is held for the line);
    ``hold_ends``: when the hold the line is bound to runs out (``None``: none runs);
    ``length``: the live kept tickets in the line."""

    ticket: Ticket | None
    kept: bool
    ahead: int
    holds: bool = False
    hold_ends: datetime.datetime | None = None
    length: int = 0


#: How many tickets a line keeps per unit of its quota's limit (:func:`most_kept`).
LINE_PER_UNIT = 10


def most_kept(limit: int) -> int:
    """The most tickets a line under a quota of ``limit`` keeps: ``LINE_PER_UNIT`` per
    unit. A line that long is many typical runs deep; a ticket presented to it is not
    kept (it stays valid, unkept, and joins when the line has room)."""
    return LINE_PER_UNIT * limit


def issue(
    key: str,
    weight: int,
    issued_at: datetime.datetime,
    due: datetime.datetime,
) -> Ticket:
    """A new ticket for a start refused under ``key`` at ``issued_at``, valid until
    ``due`` unless kept."""
    ticket_id = uuid.uuid4().hex
    payload = {"i": ticket_id, "k": key, "t": _micros(issued_at), "w": weight, "d": _micros(due)}
    token = signing.dumps(payload, salt=_SALT, compress=True)
    return Ticket(token, ticket_id, key, issued_at, weight, due)


def read(token: object) -> Ticket:
    """The ticket ``token`` stands for; ``ValueError`` naming what is wrong when it is not
    a ticket this project issued (``TypeError`` when it is not a str)."""
    if not isinstance(token, str):
        raise TypeError(f"ticket must be a str (error.ticket), not {type(token).__name__}")
    try:
        payload = signing.loads(token, salt=_SALT)
    except signing.BadSignature:
        raise ValueError(
            "ticket is not one this project issued: its signature does not match "
            "(was it changed, or SECRET_KEY since?)"
        ) from None
    try:
        return Ticket(
            token,
            str(payload["i"]),
            str(payload["k"]),
            _from_micros(payload["t"]),
            int(payload["w"]),
            _from_micros(payload["d"]),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        raise ValueError("ticket is signed but malformed") from None


def read_presented(token: str | None) -> Ticket | None:
    """The ticket a request presented, or ``None`` when it presented none or one that is
    not valid (a client's stale or altered header is a start without a ticket)."""
    if not token:
        return None
    try:
        return read(token)
    except ValueError:
        return None


def presented() -> str | None:
    """The ticket token presented by the request being served (see :func:`presenting`)."""
    return _presented.get()


@contextmanager
def presenting(token: str | None) -> Iterator[None]:
    """Within the block, starts without a ``ticket=`` of their own present ``token``: how
    the 429 middleware and decorator pass on a request's ``Durable-Ticket`` header."""
    reset = _presented.set(token or None)
    try:
        yield
    finally:
        _presented.reset(reset)


def place_in_line(
    kept: Sequence[KeptTicket],
    ticket: Ticket | None,
    key: str,
    *,
    active: int,
    limit: int,
    weight: int,
    now: datetime.datetime,
) -> Line:
    """Where a start weighing ``weight`` stands in ``key``'s line, given the tickets the
    store keeps for the key (``kept``, live or not, any order), the start's ticket, and
    the key's ``active`` units under ``limit``: behind every live kept ticket, or, with a
    kept ticket of its own, behind those that joined before it.

    A ticket bound to a hold that ran out (``held_until`` passed) is out of the line like
    an expired one: the hold was the line's one window for the freed unit, and everyone
    bound to it let it pass."""
    live = sorted((entry for entry in kept if entry.live(now)), key=lambda entry: entry.place)
    mine = ticket if ticket is not None and ticket.key == key else None
    row = None
    if mine is not None:
        row = next((entry for entry in kept if entry.id == mine.id), None)
        if row is not None and not row.live(now):
            mine = row = None  # kept, and out of the line: no ticket
        elif row is None and mine.due <= now:
            mine = None
    ahead = sum(entry.weight for entry in live if row is None or entry.place < row.place)
    ends = [entry.held_until for entry in live if entry.held_until is not None]
    return Line(
        mine,
        row is not None,
        ahead,
        holds=bool(ahead) and active + weight <= limit < active + ahead + weight,
        hold_ends=min(ends) if ends else None,
        length=len(live),
    )


def _micros(moment: datetime.datetime) -> int:
    if timezone.is_naive(moment):  # USE_TZ = False: a time in the default time zone
        moment = timezone.make_aware(moment)
    return round(moment.timestamp() * 1_000_000)


def _from_micros(value: Any) -> datetime.datetime:
    """The moment ``value`` microseconds after the epoch, as ``timezone.now()`` gives
    moments: aware with ``USE_TZ``, naive in the default time zone without."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("not a time")
    moment = datetime.datetime.fromtimestamp(value / 1_000_000, tz=datetime.UTC)
    return moment if settings.USE_TZ else timezone.make_naive(moment)


__all__ = [
    "HEADER",
    "LINE_PER_UNIT",
    "KeptTicket",
    "Line",
    "Ticket",
    "issue",
    "most_kept",
    "place_in_line",
    "presented",
    "presenting",
    "read",
    "read_presented",
]
