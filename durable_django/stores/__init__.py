"""Stores: where runs live. ``OrmStore`` is the default; ``MemoryStore`` is for tests.
Both implement :class:`BaseStore`, the store contract. A store of your own takes the
values the contract passes from here: the records, a start's :class:`Quota`, a fair
quota's :class:`Ticket` and :class:`KeptTicket`, and the release listeners."""

from typing import TYPE_CHECKING

from .._core.records import NewRun, RunRecord, StartOutcome, StepRecord
from .._rules.concurrency import Quota
from .._rules.tickets import KeptTicket, Ticket
from .base import AsyncReleaseListener, BaseStore, ReleaseListener, StartRequest, Store
from .memory import MemoryStore

if TYPE_CHECKING:
    from .orm import OrmStore


def __getattr__(name: str) -> object:
    # OrmStore imports the models, which need the app registry: load it on first use.
    if name == "OrmStore":
        from .orm import OrmStore

        return OrmStore
    raise AttributeError(name)


__all__ = [
    "AsyncReleaseListener",
    "BaseStore",
    "KeptTicket",
    "MemoryStore",
    "NewRun",
    "OrmStore",
    "Quota",
    "ReleaseListener",
    "RunRecord",
    "StartOutcome",
    "StartRequest",
    "StepRecord",
    "Store",
    "Ticket",
]
