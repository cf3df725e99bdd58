"""The argument of ``durable_start_runs_v2``, a batch of starts in one call: the batch's
elements laid out in columns, one JSON array per field, with what the function's
decisions index numbered here, so that the server reads the batch with one
``jsonb_to_record`` and sorts nothing (``functions.sql`` describes each array).

An element is a start as ``durable_start_run_v2`` takes it, by name: ``id``,
``check_existing``, ``workflow``, ``version``, ``namespace``, ``input``, ``tags``,
``queue``, ``parent_id`` (left out for none), ``attempt`` and, one item per quota,
``keys``, ``limits``, ``weights`` and ``statuses`` (each quota's counted statuses;
``None`` items are ignored, so rows padded to one width are read as they are).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..._core.limits import TAG_PREFIX

_PREFIX_LENGTH = len(TAG_PREFIX)


def columns(elements: Sequence[Mapping[str, Any]], read_namespace: str | None) -> dict[str, Any]:
    """``elements`` as the arrays of ``durable_start_runs_v2``'s argument, for a batch
    counting the runs of ``read_namespace`` (``None``: of every namespace).

    Raises :class:`ValueError`, naming the element, for what the function must not be
    sent: limits, weights or rows of statuses not matching the keys in number, or a key
    named twice by one element.
    """
    ids: list[str] = []
    checks: list[bool] = []
    firsts: list[int] = []
    quotas: list[int] = []
    first_of: dict[str, int] = {}
    looked: dict[str, None] = {}  # the ids looked for, in the order first named
    key_numbers: dict[str, int] = {}
    countings: dict[tuple[str, tuple[str, ...]], int] = {}
    pairs: dict[tuple[str, str], int] = {}
    quota_keys: list[int] = []
    quota_countings: list[int] = []
    limits: list[int] = []
    weights: list[int] = []
    counting_pendings: list[int] = []
    link_countings: list[int] = []
    link_pairs: list[int] = []
    tag_positions: list[int] = []
    tag_names: list[str] = []
    tag_weights: list[int] = []
    for position, element in enumerate(elements, 1):
        run_id = element["id"]
        check = bool(element.get("check_existing"))
        first = first_of.setdefault(run_id, position)
        ids.append(run_id)
        checks.append(check)
        firsts.append(first)
        if check:
            looked[run_id] = None
        keys = element.get("keys") or ()
        element_limits = element.get("limits") or ()
        element_weights = element.get("weights") or ()
        rows = element.get("statuses") or ()
        if not len(element_limits) == len(element_weights) == len(rows) == len(keys):
            raise ValueError(
                f"durable_start_runs_v2 takes one limit, weight and row of statuses per key "
                f"(element {position})"
            )
        if len(set(keys)) != len(keys):
            raise ValueError(f"durable_start_runs_v2 takes each key once (element {position})")
        quotas.append(len(keys))
        for key, limit, weight, row in zip(
            keys, element_limits, element_weights, rows, strict=True
        ):
            statuses = tuple(sorted({status for status in row if status is not None}))
            counting = countings.get((key, statuses))
            if counting is None:
                counting = countings[key, statuses] = len(countings) + 1
                counting_pendings.append(1 if "pending" in statuses else 0)
                for status in statuses:
                    link_countings.append(counting)
                    link_pairs.append(pairs.setdefault((key, status), len(pairs) + 1))
            quota_keys.append(key_numbers.setdefault(key, len(key_numbers) + 1))
            quota_countings.append(counting)
            limits.append(limit)
            weights.append(weight)
        for tag in element.get("tags") or ():
            weight = 1
            if tag.startswith(TAG_PREFIX) and tag[_PREFIX_LENGTH:] in keys:
                weight = element_weights[list(keys).index(tag[_PREFIX_LENGTH:])]
            tag_positions.append(position)
            tag_names.append(tag)
            tag_weights.append(weight)
    # The units a run adds: its tags naming a key of the batch (any element's), when its
    # namespace is counted.
    add_positions: list[int] = []
    add_keys: list[int] = []
    add_weights: list[int] = []
    for position, tag, weight in zip(tag_positions, tag_names, tag_weights, strict=True):
        number = key_numbers.get(tag[_PREFIX_LENGTH:]) if tag.startswith(TAG_PREFIX) else None
        namespace = elements[position - 1]["namespace"]
        if number is not None and (read_namespace is None or namespace == read_namespace):
            add_positions.append(position)
            add_keys.append(number)
            add_weights.append(weight)
    return {
        "ids": ids,
        "checks": checks,
        "workflows": [element["workflow"] for element in elements],
        "versions": [element["version"] for element in elements],
        "namespaces": [element["namespace"] for element in elements],
        "inputs": [element.get("input") for element in elements],
        "queues": [element["queue"] for element in elements],
        "parents": [element.get("parent_id") for element in elements],
        "attempts": [element["attempt"] for element in elements],
        "quotas": quotas,
        "firsts": firsts,
        "look_ids": list(looked),
        "look_positions": [first_of[run_id] for run_id in looked],
        "quota_keys": quota_keys,
        "quota_countings": quota_countings,
        "limits": limits,
        "weights": weights,
        "key_names": list(key_numbers),
        "counting_pendings": counting_pendings,
        "pair_keys": [key for key, _ in pairs],
        "pair_statuses": [status for _, status in pairs],
        "link_countings": link_countings,
        "link_pairs": link_pairs,
        "tag_positions": tag_positions,
        "tag_names": tag_names,
        "tag_weights": tag_weights,
        "add_positions": add_positions,
        "add_keys": add_keys,
        "add_weights": add_weights,
    }
