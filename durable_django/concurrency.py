"""Concurrency quotas on starting runs: declaration, validation and resolution.

A :class:`Concurrency` is declared on a workflow (``key`` a callable of the input,
``limit`` an int or a callable of the key) or passed per start (``key`` a str, ``limit``
an int). At start time it is resolved into a :class:`Quota`: one key, one int limit and
the statuses that occupy a slot.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from asgiref.sync import async_to_sync, sync_to_async

from .lifecycle import ACTIVE_STATUSES, ALL_STATUSES, TERMINAL_STATUSES
from .limits import MAX_LIMIT, MIN_LIMIT, TAG_PREFIX, text_lengths
from .serialization import validate_text

#: The statuses that occupy a slot unless ``count_statuses`` says otherwise.
DEFAULT_CONCURRENCY_STATUSES: tuple[str, ...] = ACTIVE_STATUSES

KeyFunction = Callable[[Any], str | None]
LimitFunction = Callable[[str], int | Awaitable[int]]
ConcurrencyOption = Union["Concurrency", Mapping[str, Any], None]

_T = TypeVar("_T")

_OPTION_NAMES = frozenset({"key", "limit", "count_statuses"})


def quota_tag(key: str) -> str:
    """The tag a run started under quota ``key`` carries."""
    return TAG_PREFIX + key


class Concurrency:
    """A quota on starting runs: at most ``limit`` runs in ``count_statuses`` per key.

    ``key``: on a workflow, a callable ``(input) -> str | None`` (``None`` leaves that start
    unlimited); per start, a plain ``str``.
    ``limit``: an ``int`` (``<= 0`` refuses every start), or on a workflow a callable
    ``(key) -> int``, sync or ``async def``.
    ``count_statuses``: the statuses that occupy a slot; defaults to every active status.
    """

    __slots__ = ("count_statuses", "key", "limit")

    key: KeyFunction | str
    limit: int | LimitFunction
    count_statuses: tuple[str, ...]

    def __init__(
        self,
        key: KeyFunction | str,
        limit: int | LimitFunction,
        count_statuses: Iterable[str] = DEFAULT_CONCURRENCY_STATUSES,
    ) -> None:
        if not (callable(key) or isinstance(key, str)):
            raise TypeError(
                f"Concurrency key must be a callable (input) -> str | None or a str, "
                f"not {type(key).__name__}"
            )
        if isinstance(key, str):
            validate_key(key)
        if isinstance(limit, bool) or not (isinstance(limit, int) or callable(limit)):
            raise TypeError(
                f"Concurrency limit must be an int or a callable (key) -> int, "
                f"not {type(limit).__name__} {limit!r}"
            )
        if isinstance(limit, int):
            _check_range(limit, "Concurrency limit")
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "count_statuses", _validate_statuses(count_statuses))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Concurrency is immutable")

    def __repr__(self) -> str:
        return (
            f"Concurrency(key={self.key!r}, limit={self.limit!r}, "
            f"count_statuses={list(self.count_statuses)!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Concurrency):
            return NotImplemented
        return (self.key, self.limit, self.count_statuses) == (
            other.key,
            other.limit,
            other.count_statuses,
        )

    def __hash__(self) -> int:
        return hash((self.key, self.limit, self.count_statuses))


@dataclass(frozen=True, slots=True)
class Quota:
    """A quota resolved for one start: one key, one limit, the statuses counted."""

    key: str
    limit: int
    count_statuses: tuple[str, ...]

    @property
    def tag(self) -> str:
        """The tag runs started under this quota carry: ``concurrency:<key>``."""
        return quota_tag(self.key)


def validate_key(key: object, what: str = "concurrency key") -> str:
    """Return ``key`` if it is a usable quota key, else raise naming what is wrong."""
    return validate_text(key, what, text_lengths().quota_key)


def _check_range(limit: int, what: str) -> int:
    """``limit`` if it is in the range every database takes (``<= 0`` refuses every start)."""
    if not MIN_LIMIT <= limit <= MAX_LIMIT:
        raise ValueError(f"{what} must be between {MIN_LIMIT} and {MAX_LIMIT}, not {limit}")
    return limit


def _validate_statuses(statuses: Iterable[str]) -> tuple[str, ...]:
    if isinstance(statuses, str):
        raise TypeError(f"count_statuses must be a list of statuses, not the str {statuses!r}")
    try:
        values = tuple(str(s) if not isinstance(s, str) else s for s in statuses)
    except TypeError:
        raise TypeError(
            f"count_statuses must be a list of statuses, not {type(statuses).__name__}"
        ) from None
    unknown = [s for s in values if s not in ALL_STATUSES]
    if unknown:
        raise ValueError(
            f"unknown status(es) in count_statuses: {unknown}; "
            f"known statuses are {sorted(ALL_STATUSES)}"
        )
    if not values:
        raise ValueError("count_statuses must name at least one status")
    finished = [s for s in values if s in TERMINAL_STATUSES]
    if finished:
        raise ValueError(
            f"count_statuses must name active statuses only, not {finished}: a finished run "
            f"never frees its slot, so the key would become a lifetime cap; "
            f"active statuses are {list(ACTIVE_STATUSES)}"
        )
    return tuple(dict.fromkeys(values))


def coerce(option: ConcurrencyOption) -> Concurrency | None:
    """Turn a ``Concurrency``, a dict with the same keys, or ``None`` into a Concurrency."""
    if option is None or isinstance(option, Concurrency):
        return option
    if isinstance(option, Mapping):
        unknown = set(option) - _OPTION_NAMES
        if unknown:
            raise ValueError(
                f"unknown concurrency option(s) {sorted(unknown)}; expected {sorted(_OPTION_NAMES)}"
            )
        missing = {"key", "limit"} - set(option)
        if missing:
            raise ValueError(f"concurrency option(s) {sorted(missing)} missing")
        return Concurrency(**option)
    raise TypeError(
        f"concurrency must be a Concurrency, a dict or None, not {type(option).__name__}"
    )


def for_workflow(option: ConcurrencyOption, workflow: str) -> Concurrency | None:
    """Validate a workflow's declared quota: the key must be a callable of the input."""
    concurrency = coerce(option)
    if concurrency is not None and not callable(concurrency.key):
        raise TypeError(
            f"workflow {workflow!r}: the concurrency key on a workflow must be a callable "
            f"(input) -> str | None, not {type(concurrency.key).__name__}; "
            f"pass a plain str key per start instead"
        )
    return concurrency


def for_start(option: ConcurrencyOption) -> Concurrency | None:
    """Validate a per-start quota: a str key and an int limit."""
    concurrency = coerce(option)
    if concurrency is None:
        return None
    if not isinstance(concurrency.key, str):
        raise TypeError(
            f"a per-start concurrency key must be a str, not {type(concurrency.key).__name__}"
        )
    if not isinstance(concurrency.limit, int):
        raise TypeError(
            f"a per-start concurrency limit must be an int, not {type(concurrency.limit).__name__}"
        )
    return concurrency


def _resolve_key(concurrency: Concurrency, input: Any, workflow: str) -> str | None:
    if isinstance(concurrency.key, str):
        return concurrency.key
    try:
        key = concurrency.key(input)
    except Exception as error:
        raise ValueError(
            f"workflow {workflow!r}: the concurrency key function raised "
            f"{type(error).__name__}: {error}"
        ) from error
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(
            f"workflow {workflow!r}: the concurrency key function must return a str or None, "
            f"not {type(key).__name__} {key!r}"
        )
    return validate_key(key, f"workflow {workflow!r}: concurrency key")


def _check_limit(limit: object, workflow: str, key: str) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(
            f"workflow {workflow!r}: the concurrency limit for key {key!r} must be an int, "
            f"not {type(limit).__name__} {limit!r}"
        )
    return _check_range(limit, f"workflow {workflow!r}: the concurrency limit for key {key!r}")


def _call_limit(function: LimitFunction, key: str, workflow: str) -> int | Awaitable[int]:
    try:
        return function(key)
    except Exception as error:
        raise ValueError(
            f"workflow {workflow!r}: the concurrency limit function raised "
            f"{type(error).__name__} for key {key!r}: {error}"
        ) from error


async def _awaited(awaitable: Awaitable[_T]) -> _T:
    return await awaitable


def limit_for(concurrency: Concurrency, key: str, workflow: str) -> int:
    """The limit for ``key``: the int, or the limit function's answer (an async one is
    run through ``async_to_sync``). A bad answer raises naming the workflow and key."""
    function = concurrency.limit
    limit: object = function
    if callable(function):
        limit = _call_limit(function, key, workflow)
        if inspect.isawaitable(limit):
            limit = async_to_sync(_awaited)(limit)
    return _check_limit(limit, workflow, key)


def resolve(concurrency: Concurrency | None, input: Any, workflow: str) -> Quota | None:
    """Resolve a quota for one start, calling an async limit function through async_to_sync."""
    if concurrency is None:
        return None
    key = _resolve_key(concurrency, input, workflow)
    if key is None:
        return None
    return Quota(key, limit_for(concurrency, key, workflow), concurrency.count_statuses)


async def aresolve(concurrency: Concurrency | None, input: Any, workflow: str) -> Quota | None:
    """Resolve a quota for one start from async code (a sync limit function runs in a thread)."""
    if concurrency is None:
        return None
    key = _resolve_key(concurrency, input, workflow)
    if key is None:
        return None
    function = concurrency.limit
    limit: object = function
    if callable(function):
        if inspect.iscoroutinefunction(function):
            limit = _call_limit(function, key, workflow)
        else:  # a sync limit function may query the database: keep it off the event loop
            limit = await sync_to_async(_call_limit)(function, key, workflow)
        if inspect.isawaitable(limit):
            limit = await limit
    return Quota(key, _check_limit(limit, workflow, key), concurrency.count_statuses)
