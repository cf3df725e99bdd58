"""JSON only: inputs, outputs and step results are checked and copied as JSON."""

from __future__ import annotations

import json
from typing import Any


def json_copy(value: Any, what: str) -> Any:
    """``value`` as it will read back from the store, or a ``TypeError`` naming ``what``.

    Strict JSON: no NaN or infinities, no objects a custom encoder would turn into strings
    (they would come back as a different type on replay).
    """
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} must be JSON-serialisable: {error}") from None
    return json.loads(text)
