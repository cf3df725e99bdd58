"""What the quota hammer tests share (``tests/processes/test_hammer.py``,
``tests/processes/test_pgbouncer.py``): the size of a trial, the store paths under test,
fresh keys, and the checks of what the starters of a trial did and left in the database."""

from __future__ import annotations

import os
import uuid
from collections import Counter, defaultdict

import pytest
from django.db import connection

from durable_django.models import Run, RunTag
from durable_django.status import RunStatus

from .hammer_worker import WORKFLOW, Outcome

LIMIT = 8
TRIALS = 20
THREADS = 32
#: Generous bounds for waits on other threads; a correct run never gets near them.
PATIENCE = 60.0

#: ``fast_path`` of the ORM store under test. On PostgreSQL the default store calls its
#: functions, on MariaDB its stored procedure; elsewhere it takes the portable path, so
#: there the portable-path case is the default store's case too.
STORES = [
    pytest.param(
        True,
        id="default-store",
        marks=pytest.mark.skipif(
            connection.vendor != "postgresql" and os.environ.get("DURABLE_TEST_DB") != "mariadb",
            reason="off PostgreSQL and MariaDB the default store takes the portable path, "
            "tested as such",
        ),
    ),
    pytest.param(False, id="portable-path"),
]


def fresh_keys(count: int) -> list[str]:
    prefix = uuid.uuid4().hex[:12]
    return [f"hammer:{prefix}:{n:02d}" for n in range(count)]


def tag_of(key: str) -> str:
    return f"concurrency:{key}"


def assert_no_errors(outcomes: list[Outcome]) -> None:
    errors = [o for o in outcomes if o.kind == "error"]
    assert not errors, "\n\n".join(f"{o.starter} (trial {o.trial}):\n{o.detail}" for o in errors)


def assert_trials(
    outcomes: list[Outcome], keys: list[str], starters: int, limit: int = LIMIT
) -> None:
    """Each trial admitted exactly ``limit`` starters, refused the rest, stored ``limit`` runs."""
    assert_no_errors(outcomes)
    by_trial: dict[int, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        by_trial[outcome.trial].append(outcome)
    assert sorted(by_trial) == list(range(len(keys)))
    for trial, key in enumerate(keys):
        results = by_trial[trial]
        kinds = Counter(o.kind for o in results)
        assert len(results) == starters, f"trial {trial}: {len(results)} outcomes"
        expected = Counter(created=limit, refused=starters - limit)
        assert kinds == expected, f"trial {trial}: {kinds}"
        for refused in (o for o in results if o.kind == "refused"):
            assert (refused.workflow, refused.key, refused.limit, refused.active) == (
                WORKFLOW,
                key,
                limit,
                limit,
            ), f"trial {trial}: {refused}"
        created = {o.run_id for o in results if o.kind == "created"}
        assert_stored(key, created)


def assert_stored(key: str, run_ids: set[str]) -> None:
    """The database holds exactly ``run_ids`` under ``key``, each with one quota tag row."""
    tag = tag_of(key)
    tagged_runs = set(Run.objects.filter(tag_rows__tag=tag).values_list("pk", flat=True))
    assert tagged_runs == run_ids
    tag_rows = list(RunTag.objects.filter(tag=tag).values_list("run_id", flat=True))
    assert sorted(tag_rows) == sorted(run_ids), "duplicate or orphan tag rows"
    assert Run.objects.filter(pk__in=tag_rows).count() == len(tag_rows)
    statuses = set(RunTag.objects.filter(tag=tag).values_list("status", flat=True))
    assert statuses <= {RunStatus.PENDING}
