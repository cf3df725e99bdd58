"""Declaring and resolving quotas: every bad option refused with a clear error."""

from __future__ import annotations

import pytest

from durable_django import DEFAULT_CONCURRENCY_STATUSES, Concurrency
from durable_django._rules.concurrency import (
    Quota,
    aresolve,
    coerce,
    for_start,
    for_workflow,
    quota_tag,
    resolve,
)
from durable_django._rules.registry import Registry, make_definition


def test_default_statuses_are_the_active_ones():
    assert DEFAULT_CONCURRENCY_STATUSES == ("pending", "running", "suspended", "blocked")
    assert Concurrency(key="k", limit=1).count_statuses == DEFAULT_CONCURRENCY_STATUSES


def test_dict_and_object_forms_are_equal():
    assert coerce({"key": "k", "limit": 2, "count_statuses": ["pending"]}) == Concurrency(
        "k", 2, ["pending"]
    )


def test_concurrency_is_immutable():
    quota = Concurrency("k", 2)
    with pytest.raises(AttributeError):
        quota.limit = 3


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"key": 3, "limit": 1}, TypeError, "key must be a callable"),
        ({"key": "k", "limit": True}, TypeError, "limit must be an int"),
        ({"key": "k", "limit": 1.5}, TypeError, "limit must be an int"),
        ({"key": "k", "limit": "8"}, TypeError, "limit must be an int"),
        ({"key": "k", "limit": 1, "count_statuses": ["pending", "done"]}, ValueError, "done"),
        ({"key": "k", "limit": 1, "count_statuses": []}, ValueError, "at least one"),
        ({"key": "k", "limit": 1, "count_statuses": "pending"}, TypeError, "list of statuses"),
        ({"key": "", "limit": 1}, ValueError, "must not be empty"),
        ({"key": "x" * 244, "limit": 1}, ValueError, "at most 243"),
        ({"key": "k\x00", "limit": 1}, ValueError, "NUL character"),
        ({"key": "k", "limit": 2**31}, ValueError, "between -2147483648 and 2147483647"),
        ({"key": "k", "limit": -(2**31) - 1}, ValueError, "between"),
        ({"key": "k", "limit": 1, "count_statuses": ["completed"]}, ValueError, "lifetime cap"),
        ({"key": "k"}, ValueError, "missing"),
        ({"key": "k", "limit": 1, "limits": 2}, ValueError, "unknown concurrency option"),
    ],
)
def test_bad_options_are_refused(options, error, message):
    with pytest.raises(error, match=message):
        coerce(options)


def test_a_workflow_key_must_be_callable():
    with pytest.raises(TypeError, match="must be a callable"):
        for_workflow({"key": "tenant:acme", "limit": 1}, "wf")


def test_bad_option_refused_at_declaration(registry: Registry):
    with pytest.raises(TypeError, match="limit must be an int"):
        make_definition("wf", "1", lambda ctx, i: i, concurrency={"key": str, "limit": False})
    assert registry.all() == []


def test_a_per_start_quota_takes_a_str_key_and_an_int_limit():
    with pytest.raises(TypeError, match="per-start concurrency key must be a str"):
        for_start({"key": lambda i: "k", "limit": 1})
    with pytest.raises(TypeError, match="per-start concurrency limit must be an int"):
        for_start({"key": "k", "limit": lambda key: 1})
    with pytest.raises(TypeError, match="per-start concurrency weight must be an int"):
        for_start({"key": "k", "limit": 3, "weight": lambda i: 1})
    assert for_start(None) == ()
    assert for_start({"key": "k", "limit": 2}) == (Concurrency("k", 2),)


def test_resolve_key_function_and_int_limit():
    quota = Concurrency(key=lambda input: f"tenant:{input['t']}", limit=8)
    (resolved,) = resolve([quota], {"t": "acme"}, "wf")
    assert resolved == Quota("tenant:acme", 8, DEFAULT_CONCURRENCY_STATUSES)
    assert resolved.tag == quota_tag("tenant:acme") == "concurrency:tenant:acme"


def test_a_key_of_none_leaves_the_start_unlimited():
    assert resolve([Concurrency(key=lambda input: None, limit=1)], {}, "wf") == ()


def test_limit_function_receives_the_key():
    seen = []

    def limit(key):
        seen.append(key)
        return 3

    assert resolve([Concurrency(key=lambda i: "a", limit=limit)], {}, "wf")[0].limit == 3
    assert seen == ["a"]


def test_async_limit_function_from_sync_code():
    async def limit(key):
        return 5

    assert resolve([Concurrency(key=lambda i: "a", limit=limit)], {}, "wf")[0].limit == 5


async def _aresolve(concurrency):
    (quota,) = await aresolve([concurrency], {}, "wf")
    return quota


def test_aresolve_awaits_async_and_runs_sync_limit_functions():
    from asgiref.sync import async_to_sync

    async def async_limit(key):
        return 4

    assert async_to_sync(_aresolve)(Concurrency(lambda i: "a", async_limit)).limit == 4
    assert async_to_sync(_aresolve)(Concurrency(lambda i: "a", lambda key: 6)).limit == 6


@pytest.mark.parametrize(
    ("key", "limit", "error", "message"),
    [
        (lambda i: 1 / 0, 1, ValueError, "key function raised ZeroDivisionError"),
        (lambda i: 42, 1, TypeError, "must return a str or None, not int"),
        (lambda i: "", 1, ValueError, "must not be empty"),
        (lambda i: "k" * 300, 1, ValueError, "at most"),
        (lambda i: "k", lambda key: True, TypeError, "must be an int, not bool"),
        (lambda i: "k", lambda key: 2.0, TypeError, "must be an int, not float"),
        (lambda i: "k", lambda key: "8", TypeError, "must be an int, not str"),
        (lambda i: "k", lambda key: {}["plan"], ValueError, "limit function raised KeyError"),
    ],
)
def test_bad_key_or_limit_at_start_time(key, limit, error, message):
    with pytest.raises(error, match=message) as caught:
        resolve([Concurrency(key=key, limit=limit)], {}, "my.workflow")
    assert "my.workflow" in str(caught.value)
