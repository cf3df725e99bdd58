"""The batch start's argument laid out in columns (``stores.postgres.batch_columns``):
what it numbers, read without a database. ``test_postgresql_functions.py`` binds the
function reading it to the element-by-element reference."""

from __future__ import annotations

from durable_django.stores.postgres.batch_columns import columns

ALL = ("pending", "running", "suspended", "blocked")


def element(run_id, quotas=(), *, check=False, tags=None, namespace="default"):
    return {
        "id": run_id,
        "check_existing": check,
        "workflow": "wf",
        "version": "1",
        "namespace": namespace,
        "input": {"n": run_id},
        "tags": [f"concurrency:{key}" for key, *_ in quotas] if tags is None else tags,
        "queue": "q",
        "attempt": 1,
        "keys": [key for key, *_ in quotas],
        "limits": [limit for _, limit, _, _ in quotas],
        "weights": [weight for _, _, weight, _ in quotas],
        "statuses": [statuses for *_, statuses in quotas],
    }


def test_a_batch_is_numbered_by_first_appearance():
    batch = [
        element("r1", [("a", 3, 2, ALL), ("b", 5, 1, ("running", None))]),
        element("r2", [("a", 3, 1, ("running", "pending", "running"))], check=True),
        element("r1", [("b", 5, 1, ("running",))], check=True),
        element("r3", tags=["concurrency:b", "plain"], namespace="blue"),
    ]
    arrays = columns(batch, "default")
    assert arrays["ids"] == ["r1", "r2", "r1", "r3"]
    assert arrays["firsts"] == [1, 2, 1, 4]
    # the ids looked for, at their first element's position
    assert (arrays["look_ids"], arrays["look_positions"]) == (["r2", "r1"], [2, 1])
    assert arrays["quotas"] == [2, 1, 1, 0]
    assert arrays["key_names"] == ["a", "b"]
    assert arrays["quota_keys"] == [1, 2, 1, 2]
    # a counting is a key and a set of statuses: b's ("running",) is met twice
    assert arrays["quota_countings"] == [1, 2, 3, 2]
    assert arrays["counting_pendings"] == [1, 0, 1]
    assert list(zip(arrays["pair_keys"], arrays["pair_statuses"], strict=True)) == [
        ("a", "blocked"),
        ("a", "pending"),
        ("a", "running"),
        ("a", "suspended"),
        ("b", "running"),
    ]
    assert list(zip(arrays["link_countings"], arrays["link_pairs"], strict=True)) == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 5),
        (3, 2),
        (3, 3),
    ]
    assert (arrays["limits"], arrays["weights"]) == ([3, 5, 3, 5], [2, 1, 1, 1])
    # a quota's tag weighs its weight; another tag, or one carried without its quota, 1
    assert arrays["tag_weights"] == [2, 1, 1, 1, 1, 1]
    # r3 is in a namespace the batch does not count: its tag of b adds nothing
    assert list(zip(arrays["add_positions"], arrays["add_keys"], strict=True)) == [
        (1, 1),
        (1, 2),
        (2, 1),
        (3, 2),
    ]
    assert columns(batch, None)["add_positions"] == [1, 1, 2, 3, 4]


def test_an_empty_batch_is_empty_columns():
    arrays = columns([], None)
    assert arrays["ids"] == [] and arrays["key_names"] == [] and arrays["add_keys"] == []
