"""Stores: where runs live. ``OrmStore`` is the default; ``MemoryStore`` is for tests.
Both implement :class:`BaseStore`, the store contract."""

from typing import TYPE_CHECKING

from .._core.records import NewRun, RunRecord, StartOutcome, StepRecord
from .base import BaseStore, StartRequest, Store
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
    "BaseStore",
    "MemoryStore",
    "NewRun",
    "OrmStore",
    "RunRecord",
    "StartOutcome",
    "StartRequest",
    "StepRecord",
    "Store",
]
