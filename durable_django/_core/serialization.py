"""What a store can hold, checked before anything is written: JSON values and text.

One rule for every database (``docs/databases.md`` says what each one refuses):

- JSON values (inputs, outputs, step results, payloads): strict JSON (no NaN or
  infinities, no objects a custom encoder would turn into strings), nested at most
  :data:`~durable_django._core.limits.MAX_JSON_DEPTH` levels, at most
  :data:`~durable_django._core.limits.MAX_JSON_BYTES` as JSON text;
- text, in JSON values (keys included) and in text columns (ids, keys, tags, names,
  tokens): no NUL character and no surrogate code point (U+D800 to U+DFFF, which UTF-8
  cannot encode).

A value that breaks a rule raises :class:`~durable_django.errors.UnstorableValueError`
naming the value, where in it the problem is and the rule.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ..errors import UnstorableValueError
from .limits import MAX_JSON_BYTES, MAX_JSON_DEPTH

#: A character no database stores in text: NUL, or a surrogate code point.
_FORBIDDEN_CHARACTER = re.compile("[\x00\ud800-\udfff]")
#: In JSON text with ASCII escapes: a NUL, or a surrogate not in a pair. A backslash
#: escaped before it can make a false alarm, which the walk of the value then clears.
_FORBIDDEN_ESCAPE = re.compile(
    r"\\u(?:0000|d[89ab][0-9a-f]{2}(?!\\ud[c-f])"
    r"|d[c-f][0-9a-f]{2}(?<!\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}))"
)
_CONTAINERS = (list, tuple, dict)
_KEY_TYPES = (str, int, float, type(None))
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: ``json.dumps(value, allow_nan=False)``'s encoder, made once (it keeps no state).
_STRICT_ENCODER = json.JSONEncoder(allow_nan=False)


def json_copy(value: Any, what: str) -> Any:
    """``value`` as it will read back from the store, or :class:`UnstorableValueError`
    naming ``what`` (for example ``"the input of workflow 'x'"``) and the rule broken."""
    try:
        text = _STRICT_ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as error:
        raise _unstorable(value, what, fallback=str(error)) from None
    # Cheap tests on the text first; the walk of the value says where, or clears them.
    if (
        text.count("[") + text.count("{") > MAX_JSON_DEPTH and _too_deep(value)
    ) or _FORBIDDEN_ESCAPE.search(text):
        problem = _find_problem(value)
        if problem is not None:
            raise UnstorableValueError(what, *problem)
    if len(text) > MAX_JSON_BYTES:
        raise UnstorableValueError(
            what, "$", f"it is {len(text):,} bytes as JSON; at most {MAX_JSON_BYTES:,} allowed"
        )
    return json.loads(text)


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored (a NUL or a surrogate, and where), or ``None``."""
    found = _FORBIDDEN_CHARACTER.search(text)
    if found is None:
        return None
    character = found.group()
    name = (
        "a NUL character (\\x00)"
        if character == "\x00"
        else f"a surrogate code point (U+{ord(character):04X}, which UTF-8 cannot encode)"
    )
    return f"it contains {name} at index {found.start()}"


def length_problem(label: str, text: str, length: int) -> str | None:
    """Why a column of ``length`` characters cannot hold ``text``, or ``None``."""
    if len(text) <= length:
        return None
    return f"{label} is {len(text)} characters long; its column holds {length}"


def number_problem(label: str, value: object, low: int, high: int) -> str | None:
    """Why an integer column of range ``low`` to ``high`` cannot hold ``value`` as given
    (a number that is not an int, such as ``2.5`` or ``True``, is not rounded), or
    ``None``."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{label} must be a whole number, not {value!r}"
    if not low <= value <= high:
        return f"{label} must be between {low} and {high}, not {value}"
    return None


def validate_text(value: object, what: str, max_length: int | None = None) -> str:
    """``value`` if it is a non-empty str of at most ``max_length`` characters that a
    text column can hold; else ``TypeError``, ``ValueError`` or
    :class:`UnstorableValueError` naming ``what``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__} {value!r}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if max_length is not None and len(value) > max_length:
        raise ValueError(f"{what} is {len(value)} characters long; at most {max_length} allowed")
    return check_text(value, what)


def check_text(value: str, what: str) -> str:
    """``value``, or :class:`UnstorableValueError` naming ``what`` when it holds a NUL
    character or a surrogate: no text column can hold it (nor can a run have it)."""
    problem = text_problem(value)
    if problem is not None:
        raise UnstorableValueError(what, "$", problem)
    return value


def storable_text(text: str, max_length: int, *, keep_end: bool = False) -> str:
    """``text`` made storable: NUL characters and surrogates replaced with U+FFFD, cut to
    ``max_length`` characters (keeping its end with ``keep_end``). For error records."""
    text = _FORBIDDEN_CHARACTER.sub("\ufffd", text)
    if len(text) <= max_length:
        return text
    cut = f"[{len(text) - max_length:,} characters cut]"
    if keep_end:
        return cut + text[len(text) - max_length :]
    return text[:max_length] + cut


# where the problem is ----------------------------------------------------------------


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests more than MAX_JSON_DEPTH containers (without recursion)."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    for _ in range(MAX_JSON_DEPTH):
        inner: list[Any] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            inner += [child for child in children if isinstance(child, _CONTAINERS)]
        if not inner:
            return False
        level = inner
    return True


def _unstorable(value: Any, what: str, fallback: str) -> UnstorableValueError:
    problem = _find_problem(value)
    if problem is None:  # something json refused that the walk does not know
        problem = ("$", f"it is not JSON-serialisable: {fallback}")
    return UnstorableValueError(what, *problem)


def _find_problem(value: Any) -> tuple[str, str] | None:
    """The first place (in document order) where ``value`` breaks a rule, as
    ``(path, rule)``; ``None`` when it breaks none. Iterative: no recursion limit."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return path, problem
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, f"{item} is not JSON-serialisable (JSON has no NaN or infinities)"
        elif isinstance(item, list | tuple | dict):
            if depth == MAX_JSON_DEPTH:
                return path, (
                    f"it is nested more than {MAX_JSON_DEPTH} levels deep (or contains itself)"
                )
            children: list[tuple[Any, str, int]] = []
            if isinstance(item, dict):
                for key, child in item.items():
                    problem = _key_problem(key)
                    if problem is not None:
                        return path, problem
                    children.append((child, _child_path(path, key), depth + 1))
            else:
                children = [(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item)]
            stack.extend(reversed(children))
        elif not (item is None or isinstance(item, int)):
            return path, f"{type(item).__name__} is not JSON-serialisable"
    return None


def _key_problem(key: Any) -> str | None:
    if not isinstance(key, _KEY_TYPES):
        return (
            f"a key of type {type(key).__name__} is not JSON-serialisable "
            f"(keys are str, int, float, bool or None)"
        )
    if isinstance(key, float) and not math.isfinite(key):
        return f"the key {key} is not JSON-serialisable (JSON has no NaN or infinities)"
    if isinstance(key, str) and (problem := text_problem(key)) is not None:
        return f"the key {_short(key)}: {problem}"
    return None


def _short(text: str, length: int = 40) -> str:
    return repr(text) if len(text) <= length else f"{text[:length]!r}..."


def _child_path(path: str, key: Any) -> str:
    if isinstance(key, str) and _IDENTIFIER.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key if isinstance(key, str) else str(key))}]"
