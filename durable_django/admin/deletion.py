"""Deleting runs from the admin: only finished runs whose whole ancestry has finished.

An active parent (or grandparent...) replays its body and reads its children's outcomes;
deleting a child it still needs would leave it waiting for nothing. The admin says which
runs it refuses and why, and deletes through the store, which checks again under locks.
"""

from __future__ import annotations

from collections.abc import Collection

from django.utils.translation import ngettext

from .._rules.retention import active_ancestors
from ..models import Run
from .display import named


def runs_below_active(run_ids: Collection[str], using: str) -> dict[str, tuple[str, str]]:
    """The runs of ``run_ids`` with an ancestor that has not finished:
    ``{run_id: (ancestor_id, its status)}``; one query per level of ancestry."""
    runs = Run.objects.using(using)
    parents = dict(runs.filter(pk__in=list(run_ids)).values_list("pk", "parent_id"))

    def read(ids: set[str]) -> dict[str, tuple[str, str | None]]:
        rows = runs.filter(pk__in=list(ids)).values_list("pk", "status", "parent_id")
        return {run_id: (status, parent_id) for run_id, status, parent_id in rows}

    return active_ancestors(parents, read)


def below_active_messages(below: dict[str, tuple[str, str]]) -> list[str]:
    """Why each run of ``below`` (as :func:`runs_below_active` returns) is not deleted,
    one message per active ancestor, naming its runs."""
    by_ancestor: dict[tuple[str, str], list[str]] = {}
    for run_id, ancestor in below.items():
        by_ancestor.setdefault(ancestor, []).append(run_id)
    return [
        ngettext(
            "Nothing deleted: run %(names)s is below run %(ancestor)s, which is still "
            "%(status)s and may still read its outcome; delete it once that run has finished.",
            "Nothing deleted: %(count)d selected runs (%(names)s) are below run %(ancestor)s, "
            "which is still %(status)s and may still read their outcomes; delete them once "
            "that run has finished.",
            len(run_ids),
        )
        % {
            "names": named(sorted(run_ids)),
            "count": len(run_ids),
            "ancestor": ancestor_id,
            "status": status,
        }
        for (ancestor_id, status), run_ids in sorted(by_ancestor.items())
    ]
