"""Concurrency quotas on starting runs: declaration, validation and resolution.

A :class:`Concurrency` is declared on a workflow (``key`` a callable of the input,
``limit`` an int or a callable of the key, ``weight`` an int or a callable of the input)
or passed per start (``key`` a str, ``limit`` and ``weight`` ints); ``concurrency=``
takes one or a list of them. At start time each is resolved into a :class:`Quota`: one
key, one int limit, the statuses that occupy a slot and the units the run occupies. A
start is admitted only when every quota of its list admits it. A ``fair`` quota serves
the starts it refused in the order it refused them (:mod:`durable_django._rules.tickets`).
"""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from asgiref.sync import async_to_sync, sync_to_async

from .._core.lifecycle import ACTIVE_STATUSES, ALL_STATUSES, TERMINAL_STATUSES
from .._core.limits import MAX_LIMIT, MIN_LIMIT, RATE_TAG_PREFIX, TAG_PREFIX, text_lengths
from .._core.serialization import validate_text
from .._core.user_code import user_failure

#: The statuses that occupy a slot unless ``count_statuses`` says otherwise.
DEFAULT_CONCURRENCY_STATUSES: tuple[str, ...] = ACTIVE_STATUSES

KeyFunction = Callable[[Any], str | None]
LimitFunction = Callable[[str], int | Awaitable[int]]
WeightFunction = Callable[[Any], int]
#: What ``concurrency=`` takes: one quota (a ``Concurrency`` or a dict with its keys), a
#: list of them, or ``None``.
ConcurrencyOption = Union[
    "Concurrency", Mapping[str, Any], Sequence[Union["Concurrency", Mapping[str, Any]]], None
]

_T = TypeVar("_T")

_OPTION_NAMES = frozenset({"key", "limit", "count_statuses", "weight", "fair", "fair_window"})

#: Seconds a freed slot of a fair quota is held for the oldest ticket waiting on its key.
DEFAULT_FAIR_WINDOW = 3.0
#: The longest ``fair_window``, in seconds.
MAX_FAIR_WINDOW = 3600.0


def quota_tag(key: str) -> str:
    """The tag a run started under quota ``key`` carries."""
    return TAG_PREFIX + key


def rate_tag(key: str) -> str:
    """The tag a run started under rate limit ``key`` carries."""
    return RATE_TAG_PREFIX + key


class Concurrency:
    """A quota on starting runs: at most ``limit`` runs in ``count_statuses`` per key.

    ``key``: on a workflow, a callable ``(input) -> str | None`` (``None`` leaves that start
    unlimited); per start, a plain ``str``.
    ``limit``: an ``int`` (``<= 0`` refuses every start), or on a workflow a callable
    ``(key) -> int``, sync or ``async def``.
    ``count_statuses``: the statuses that occupy a slot; defaults to every active status.
    ``weight``: the units of the limit a run occupies, an ``int >= 1`` (default 1), or on
    a workflow a callable ``(input) -> int``; the key's counted runs and the new one must
    weigh at most ``limit`` together.
    ``fair``: serve refused starts in turn: a refusal carries a ticket
    (``error.ticket``), and a retry presenting it is admitted before starts that came
    later; a freed slot is held for the oldest ticket for at most ``fair_window``
    seconds (a number or a ``timedelta``, default :data:`DEFAULT_FAIR_WINDOW`). See
    :mod:`durable_django._rules.tickets`.
    """

    __slots__ = ("count_statuses", "fair", "fair_window", "key", "limit", "weight")

    key: KeyFunction | str
    limit: int | LimitFunction
    count_statuses: tuple[str, ...]
    weight: int | WeightFunction
    fair: bool
    fair_window: float

    def __init__(
        self,
        key: KeyFunction | str,
        limit: int | LimitFunction,
        count_statuses: Iterable[str] = DEFAULT_CONCURRENCY_STATUSES,
        weight: int | WeightFunction = 1,
        fair: bool = False,
        fair_window: float | datetime.timedelta = DEFAULT_FAIR_WINDOW,
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
        if isinstance(weight, bool) or not (isinstance(weight, int) or callable(weight)):
            raise TypeError(
                f"Concurrency weight must be an int or a callable (input) -> int, "
                f"not {type(weight).__name__} {weight!r}"
            )
        if isinstance(weight, int):
            check_weight(weight, "Concurrency weight")
            if isinstance(limit, int) and 0 < limit < weight:
                raise ValueError(
                    f"Concurrency weight {weight} is more than its limit {limit}: "
                    f"no start could ever be admitted"
                )
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "count_statuses", _validate_statuses(count_statuses))
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "fair", _check_fair(fair))
        object.__setattr__(self, "fair_window", _check_fair_window(fair_window))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Concurrency is immutable")

    def __repr__(self) -> str:
        weight = "" if self.weight == 1 else f", weight={self.weight!r}"
        fair = f", fair=True, fair_window={self.fair_window!r}" if self.fair else ""
        return (
            f"Concurrency(key={self.key!r}, limit={self.limit!r}, "
            f"count_statuses={list(self.count_statuses)!r}{weight}{fair})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Concurrency):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[Any, ...]:
        return (self.key, self.limit, self.count_statuses, self.weight, self.fair, self.fair_window)


#: The longest rate limit window, in seconds (a year of 366 days).
MAX_RATE_PER = 366 * 24 * 3600.0

_RATE_OPTION_NAMES = frozenset({"key", "limit", "per", "weight"})


class RateLimit:
    """A rate limit on starting runs: at most ``limit`` units started per key in any
    ``per`` seconds (a sliding window over the runs' creation times, whatever became of
    the runs since).

    ``key``: on a workflow, a callable ``(input) -> str | None`` (``None`` leaves that
    start unlimited); per start, a plain ``str``.
    ``limit``: an ``int`` (``<= 0`` refuses every start), or on a workflow a callable
    ``(key) -> int``, sync or ``async def``.
    ``per``: the window, seconds (a number) or a ``timedelta``, more than 0 and at most
    :data:`MAX_RATE_PER`.
    ``weight``: the units a start takes from the window, an ``int >= 1`` (default 1), or
    on a workflow a callable ``(input) -> int``.
    """

    __slots__ = ("key", "limit", "per", "weight")

    key: KeyFunction | str
    limit: int | LimitFunction
    per: float
    weight: int | WeightFunction

    def __init__(
        self,
        key: KeyFunction | str,
        limit: int | LimitFunction,
        per: float | datetime.timedelta,
        weight: int | WeightFunction = 1,
    ) -> None:
        if not (callable(key) or isinstance(key, str)):
            raise TypeError(
                f"RateLimit key must be a callable (input) -> str | None or a str, "
                f"not {type(key).__name__}"
            )
        if isinstance(key, str):
            validate_key(key, "rate limit key")
        if isinstance(limit, bool) or not (isinstance(limit, int) or callable(limit)):
            raise TypeError(
                f"RateLimit limit must be an int or a callable (key) -> int, "
                f"not {type(limit).__name__} {limit!r}"
            )
        if isinstance(limit, int):
            _check_range(limit, "RateLimit limit")
        if isinstance(weight, bool) or not (isinstance(weight, int) or callable(weight)):
            raise TypeError(
                f"RateLimit weight must be an int or a callable (input) -> int, "
                f"not {type(weight).__name__} {weight!r}"
            )
        if isinstance(weight, int):
            check_weight(weight, "RateLimit weight")
            if isinstance(limit, int) and 0 < limit < weight:
                raise ValueError(
                    f"RateLimit weight {weight} is more than its limit {limit}: "
                    f"no start could ever be admitted"
                )
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "per", _check_per(per))
        object.__setattr__(self, "weight", weight)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("RateLimit is immutable")

    def __repr__(self) -> str:
        weight = "" if self.weight == 1 else f", weight={self.weight!r}"
        return f"RateLimit(key={self.key!r}, limit={self.limit!r}, per={self.per!r}{weight})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RateLimit):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[Any, ...]:
        return (self.key, self.limit, self.per, self.weight)


#: What ``rate_limit=`` takes: one rate limit (a ``RateLimit`` or a dict with its keys), a
#: list of them, or ``None``.
RateLimitOption = Union[
    "RateLimit", Mapping[str, Any], Sequence[Union["RateLimit", Mapping[str, Any]]], None
]


def _check_per(per: object) -> float:
    """``per`` in seconds if it is a usable rate limit window."""
    if isinstance(per, datetime.timedelta):
        per = per.total_seconds()
    if isinstance(per, bool) or not isinstance(per, int | float):
        raise TypeError(
            f"RateLimit per must be seconds (a number) or a timedelta, "
            f"not {type(per).__name__} {per!r}"
        )
    if not 0 < per <= MAX_RATE_PER:
        raise ValueError(
            f"RateLimit per must be more than 0 and at most {MAX_RATE_PER:g} seconds, not {per!r}"
        )
    return float(per)


def _coerce_rate(option: object, where: str) -> RateLimit:
    if isinstance(option, RateLimit):
        return option
    if isinstance(option, Mapping):
        unknown = set(option) - _RATE_OPTION_NAMES
        if unknown:
            raise ValueError(
                f"unknown rate limit option(s) {sorted(unknown)}; "
                f"expected {sorted(_RATE_OPTION_NAMES)}"
            )
        missing = {"key", "limit", "per"} - set(option)
        if missing:
            raise ValueError(f"rate limit option(s) {sorted(missing)} missing")
        return RateLimit(**option)
    raise TypeError(
        f"{where} must be a RateLimit, a dict, a list of them or None, not {type(option).__name__}"
    )


def coerce_rates(option: RateLimitOption) -> tuple[RateLimit, ...]:
    """Turn ``rate_limit=`` (one rate limit, a list of them, or ``None``) into a tuple of
    RateLimit, in the order given."""
    if option is None:
        return ()
    if isinstance(option, list | tuple):
        return tuple(
            _coerce_rate(item, f"rate_limit[{position}]") for position, item in enumerate(option)
        )
    return (_coerce_rate(option, "rate_limit"),)


def rates_for_workflow(option: RateLimitOption, workflow: str) -> tuple[RateLimit, ...]:
    """Validate a workflow's declared rate limits: each key must be a callable of the
    input."""
    rates = coerce_rates(option)
    for rate in rates:
        if not callable(rate.key):
            raise TypeError(
                f"workflow {workflow!r}: the rate limit key on a workflow must be a callable "
                f"(input) -> str | None, not {type(rate.key).__name__}; "
                f"pass a plain str key per start instead"
            )
    return rates


def rates_for_start(option: RateLimitOption) -> tuple[RateLimit, ...]:
    """Validate per-start rate limits: each with a str key, an int limit and an int
    weight. An empty list is refused: ``None`` is how a start takes the workflow's."""
    rates = coerce_rates(option)
    if option is not None and not rates:
        raise ValueError(
            "a per-start rate_limit list must hold at least one rate limit; "
            "pass rate_limit=None for the workflow's own"
        )
    for rate in rates:
        for name in ("key", "limit", "weight"):
            value = getattr(rate, name)
            wanted = str if name == "key" else int
            if not isinstance(value, wanted):
                raise TypeError(
                    f"a per-start rate limit {name} must be a{'' if name == 'key' else 'n'} "
                    f"{wanted.__name__}, not {type(value).__name__}"
                )
    return rates


#: A limit of either kind, as a workflow declares it or a start passes it.
Limit = Concurrency | RateLimit


@dataclass(frozen=True, slots=True)
class Quota:
    """A quota resolved for one start: one key, one limit, the statuses counted, the
    units of the limit the run occupies (``weight``), and, for a fair quota, the seconds
    a freed slot is held for the oldest ticket (``fair_window``; ``None``: not fair).

    A rate limit resolved for one start is a Quota too, with ``per`` (its window, in
    seconds; ``None`` for a concurrency quota): it counts the units of the runs started
    under its key in the last ``per`` seconds, whatever their status
    (``count_statuses`` is empty)."""

    key: str
    limit: int
    count_statuses: tuple[str, ...]
    weight: int = 1
    fair_window: float | None = None
    per: float | None = None

    @property
    def rate(self) -> bool:
        """Whether this is a rate limit (it has a window, ``per``)."""
        return self.per is not None

    @property
    def fair(self) -> bool:
        """Whether the quota serves refused starts in turn (it has a ``fair_window``)."""
        return self.fair_window is not None

    @property
    def tag(self) -> str:
        """The tag runs started under this quota carry: ``concurrency:<key>``, or
        ``rate:<key>`` for a rate limit."""
        return quota_tag(self.key) if self.per is None else rate_tag(self.key)


def validate_key(key: object, what: str = "concurrency key") -> str:
    """Return ``key`` if it is a usable quota key, else raise naming what is wrong."""
    return validate_text(key, what, text_lengths().quota_key)


def _check_range(limit: int, what: str) -> int:
    """``limit`` if it is in the range every database takes (``<= 0`` refuses every start)."""
    if not MIN_LIMIT <= limit <= MAX_LIMIT:
        raise ValueError(f"{what} must be between {MIN_LIMIT} and {MAX_LIMIT}, not {limit}")
    return limit


def check_weight(weight: int, what: str) -> int:
    """``weight`` if it is a usable weight: at least 1, at most the highest limit."""
    if not 1 <= weight <= MAX_LIMIT:
        raise ValueError(f"{what} must be between 1 and {MAX_LIMIT}, not {weight}")
    return weight


def _check_fair(fair: object) -> bool:
    if not isinstance(fair, bool):
        raise TypeError(f"Concurrency fair must be True or False, not {type(fair).__name__}")
    return fair


def _check_fair_window(window: object) -> float:
    """``window`` in seconds if it is a usable ``fair_window``: more than 0, at most an hour."""
    if isinstance(window, datetime.timedelta):
        window = window.total_seconds()
    if isinstance(window, bool) or not isinstance(window, int | float):
        raise TypeError(
            f"Concurrency fair_window must be seconds (a number) or a timedelta, "
            f"not {type(window).__name__} {window!r}"
        )
    if not 0 < window <= MAX_FAIR_WINDOW:
        raise ValueError(
            f"Concurrency fair_window must be more than 0 and at most {MAX_FAIR_WINDOW:g} "
            f"seconds, not {window!r}"
        )
    return float(window)


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
        f"concurrency must be a Concurrency, a dict, a list of them or None, "
        f"not {type(option).__name__}"
    )


def coerce_all(option: ConcurrencyOption) -> tuple[Concurrency, ...]:
    """Turn ``concurrency=`` (one quota, a list of them, or ``None``) into a tuple of
    Concurrency, in the order given."""
    if isinstance(option, list | tuple):
        quotas = []
        for position, item in enumerate(option):
            if not isinstance(item, Concurrency | Mapping):
                raise TypeError(
                    f"concurrency[{position}] must be a Concurrency or a dict, "
                    f"not {type(item).__name__}"
                )
            quotas.append(coerce(item))
        return tuple(q for q in quotas if q is not None)
    single = coerce(option)
    return () if single is None else (single,)


def for_workflow(option: ConcurrencyOption, workflow: str) -> tuple[Concurrency, ...]:
    """Validate a workflow's declared quotas: each key must be a callable of the input."""
    concurrencies = coerce_all(option)
    for concurrency in concurrencies:
        if not callable(concurrency.key):
            raise TypeError(
                f"workflow {workflow!r}: the concurrency key on a workflow must be a callable "
                f"(input) -> str | None, not {type(concurrency.key).__name__}; "
                f"pass a plain str key per start instead"
            )
    return concurrencies


def for_start(option: ConcurrencyOption) -> tuple[Concurrency, ...]:
    """Validate per-start quotas: each with a str key, an int limit and an int weight.
    An empty list is refused: ``None`` is how a start takes the workflow's quotas."""
    concurrencies = coerce_all(option)
    if option is not None and not concurrencies:
        raise ValueError(
            "a per-start concurrency list must hold at least one quota; "
            "pass concurrency=None for the workflow's own"
        )
    for concurrency in concurrencies:
        if not isinstance(concurrency.key, str):
            raise TypeError(
                f"a per-start concurrency key must be a str, not {type(concurrency.key).__name__}"
            )
        if not isinstance(concurrency.limit, int):
            raise TypeError(
                f"a per-start concurrency limit must be an int, "
                f"not {type(concurrency.limit).__name__}"
            )
        if not isinstance(concurrency.weight, int):
            raise TypeError(
                f"a per-start concurrency weight must be an int, "
                f"not {type(concurrency.weight).__name__}"
            )
    return concurrencies


def _kind(limit: Limit) -> str:
    """How messages name ``limit``'s kind."""
    return "rate limit" if isinstance(limit, RateLimit) else "concurrency"


def _resolve_key(concurrency: Limit, input: Any, workflow: str) -> str | None:
    if isinstance(concurrency.key, str):
        return concurrency.key
    kind = _kind(concurrency)
    try:
        key = concurrency.key(input)
    except BaseException as error:
        if not user_failure(error):
            raise
        raise ValueError(
            f"workflow {workflow!r}: the {kind} key function raised {type(error).__name__}: {error}"
        ) from error
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(
            f"workflow {workflow!r}: the {kind} key function must return a str or None, "
            f"not {type(key).__name__} {key!r}"
        )
    return validate_key(key, f"workflow {workflow!r}: {kind} key")


def _resolve_weight(concurrency: Limit, input: Any, workflow: str, key: str) -> int:
    weight: object = concurrency.weight
    if isinstance(weight, int):
        return weight  # checked when the Concurrency was made
    assert callable(concurrency.weight)
    kind = _kind(concurrency)
    try:
        weight = concurrency.weight(input)
    except BaseException as error:
        if not user_failure(error):
            raise
        raise ValueError(
            f"workflow {workflow!r}: the {kind} weight function raised "
            f"{type(error).__name__} for key {key!r}: {error}"
        ) from error
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise TypeError(
            f"workflow {workflow!r}: the {kind} weight for key {key!r} must be an int, "
            f"not {type(weight).__name__} {weight!r}"
        )
    return check_weight(weight, f"workflow {workflow!r}: the {kind} weight for key {key!r}")


def _check_limit(limit: object, workflow: str, key: str, kind: str = "concurrency") -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(
            f"workflow {workflow!r}: the {kind} limit for key {key!r} must be an int, "
            f"not {type(limit).__name__} {limit!r}"
        )
    return _check_range(limit, f"workflow {workflow!r}: the {kind} limit for key {key!r}")


def _call_limit(
    function: LimitFunction, key: str, workflow: str, kind: str = "concurrency"
) -> int | Awaitable[int]:
    try:
        return function(key)
    except BaseException as error:
        if not user_failure(error):
            raise
        raise ValueError(
            f"workflow {workflow!r}: the {kind} limit function raised "
            f"{type(error).__name__} for key {key!r}: {error}"
        ) from error


async def _awaited(awaitable: Awaitable[_T]) -> _T:
    return await awaitable


def _window(concurrency: Limit) -> float | None:
    return (
        concurrency.fair_window
        if isinstance(concurrency, Concurrency) and concurrency.fair
        else None
    )


def _quota(concurrency: Limit, key: str, limit: int, input: Any, workflow: str) -> Quota:
    """``concurrency`` resolved for one start, its key and limit known."""
    weight = _resolve_weight(concurrency, input, workflow, key)
    if isinstance(concurrency, RateLimit):
        return Quota(key, limit, (), weight, None, concurrency.per)
    return Quota(key, limit, concurrency.count_statuses, weight, _window(concurrency))


def limit_for(concurrency: Limit, key: str, workflow: str) -> int:
    """The limit for ``key``: the int, or the limit function's answer (an async one is
    run through ``async_to_sync``). A bad answer raises naming the workflow and key."""
    function = concurrency.limit
    if not callable(function):
        return function  # checked when the Concurrency was made
    kind = _kind(concurrency)
    limit = _call_limit(function, key, workflow, kind)
    if inspect.isawaitable(limit):
        limit = async_to_sync(_awaited)(limit)
    return _check_limit(limit, workflow, key, kind)


def merge(quotas: Iterable[Quota]) -> tuple[Quota, ...]:
    """The quotas of one start, one per key (per key and window for rate limits), in the
    order each first appears.

    Two quotas naming the same key are merged into one that admits a start only when
    both would: the smaller limit, the statuses of both counted, and the weights summed
    (the run holds one tag on the key, weighing what both quotas take from it); fair when
    either is, with the shorter window. Two rate limits of one key and one window merge
    the same way; rate limits of one key with different windows stay apart (each counts
    the key's one tag in its own window), and must then weigh the same."""
    quotas = tuple(quotas)
    if len(quotas) < 2:
        return quotas
    by_key: dict[tuple[str, float | None], Quota] = {}
    for quota in quotas:
        seen = by_key.get((quota.key, quota.per))
        if seen is None:
            by_key[(quota.key, quota.per)] = quota
            continue
        weight = seen.weight + quota.weight
        if weight > MAX_LIMIT:
            raise ValueError(
                f"the {'rate limit' if quota.rate else 'concurrency'} weights for key "
                f"{quota.key!r} add up to {weight}, more than {MAX_LIMIT}"
            )
        windows = [q.fair_window for q in (seen, quota) if q.fair_window is not None]
        by_key[(quota.key, quota.per)] = Quota(
            quota.key,
            min(seen.limit, quota.limit),
            tuple(dict.fromkeys((*seen.count_statuses, *quota.count_statuses))),
            weight,
            min(windows) if windows else None,
            quota.per,
        )
    merged = tuple(by_key.values())
    weights: dict[str, int] = {}
    for quota in merged:
        if quota.rate and weights.setdefault(quota.key, quota.weight) != quota.weight:
            raise ValueError(
                f"the rate limits of key {quota.key!r} weigh {weights[quota.key]} and "
                f"{quota.weight}: rate limits of one key must weigh the same"
            )
    return merged


def resolve(concurrencies: Iterable[Limit], input: Any, workflow: str) -> tuple[Quota, ...]:
    """Resolve the quotas (and rate limits) of one start, in their order (a key function
    answering ``None`` drops its quota; duplicate keys are merged, see :func:`merge`),
    calling an async limit function through async_to_sync. An empty tuple: the start
    is unlimited."""
    resolved = []
    for concurrency in concurrencies:
        key = _resolve_key(concurrency, input, workflow)
        if key is None:
            continue
        limit = limit_for(concurrency, key, workflow)
        resolved.append(_quota(concurrency, key, limit, input, workflow))
    return merge(resolved)


async def aresolve(concurrencies: Iterable[Limit], input: Any, workflow: str) -> tuple[Quota, ...]:
    """:func:`resolve` from async code (a sync limit function runs in a thread)."""
    resolved = []
    for concurrency in concurrencies:
        key = _resolve_key(concurrency, input, workflow)
        if key is None:
            continue
        kind = _kind(concurrency)
        function = concurrency.limit
        limit: object = function
        if callable(function):
            if inspect.iscoroutinefunction(function):
                limit = _call_limit(function, key, workflow, kind)
            else:  # a sync limit function may query the database: keep it off the event loop
                limit = await sync_to_async(_call_limit)(function, key, workflow, kind)
            if inspect.isawaitable(limit):
                limit = await limit
        checked = _check_limit(limit, workflow, key, kind)
        resolved.append(_quota(concurrency, key, checked, input, workflow))
    return merge(resolved)
