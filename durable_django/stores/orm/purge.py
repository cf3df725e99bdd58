"""The retention of :class:`~durable_django.stores.OrmStore`: runs deleted with their
tags and steps once their whole ancestry has finished, and signals taken."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from django.db import transaction

from ..._rules.retention import active_ancestors
from ...models import Signal
from ...status import TERMINAL_STATUSES
from .portable import PortablePath


class Purging(PortablePath):
    """``purge_runs``, ``delete_runs`` and ``purge_signals`` through the ORM."""

    def purge_runs(
        self,
        finished_before: datetime,
        statuses: Collection[str],
        namespace: str | None,
        limit: int,
        after: str | None = None,
    ) -> tuple[int, str | None]:
        """Delete, in one transaction, those of the next ``limit`` runs (by id, after
        ``after``) in ``statuses`` that finished before ``finished_before`` (in
        ``namespace`` when given) whose whole ancestry has finished, with their tags and
        steps. Returns how many it deleted and the id to go on after (``None``: no run
        left). Runs held by another transaction (a retry under way), or whose ancestor
        is, are skipped."""
        runs = self._runs().filter(status__in=list(statuses), finished_at__lt=finished_before)
        if namespace is not None:
            runs = runs.filter(namespace=namespace)
        if after is not None:
            runs = runs.filter(pk__gt=after)
        with transaction.atomic(using=self.using):
            batch = list(
                runs.select_for_update(skip_locked=True)
                .order_by("pk")
                .values_list("pk", "parent_id")[:limit]
            )
            deleted = self._delete_with_finished_ancestry(dict(batch))
        return len(deleted), batch[-1][0] if len(batch) == limit else None

    def delete_runs(self, run_ids: Collection[str]) -> list[str]:
        """Delete those of ``run_ids`` that have finished and whose whole ancestry has
        finished, with their tags and steps, in one transaction; return their ids. The
        others stay: active, held by another transaction, or below an active run."""
        with transaction.atomic(using=self.using):
            batch = (
                self._runs()
                .filter(pk__in=list(run_ids), status__in=TERMINAL_STATUSES)
                .select_for_update(skip_locked=True)
                .values_list("pk", "parent_id")
            )
            return self._delete_with_finished_ancestry(dict(batch))

    def _delete_with_finished_ancestry(self, batch: dict[str, str | None]) -> list[str]:
        """Delete the runs of ``batch`` (locked, finished; ``{id: parent_id}``) whose
        ancestors have all finished; those ancestors stay locked until the transaction
        ends, so a retry cannot make one active again meanwhile."""
        below_active = active_ancestors(batch, self._lock_finished)
        ids = [run_id for run_id in batch if run_id not in below_active]
        if ids:
            # Its tags and steps go with it (Django deletes them first, by run id).
            self._runs().filter(pk__in=ids).delete()
        return ids

    def _lock_finished(self, run_ids: set[str]) -> dict[str, tuple[str, str | None]]:
        """``(status, parent_id)`` of the runs found among ``run_ids``, the finished ones
        locked until the transaction ends. A finished run another transaction holds (a
        retry under way) is reported as ``"locked"``; active runs are read, not locked."""
        runs = self._runs().filter(pk__in=list(run_ids))
        found = {
            run_id: (status, parent_id)
            for run_id, status, parent_id in runs.filter(status__in=TERMINAL_STATUSES)
            .select_for_update(skip_locked=True)
            .values_list("pk", "status", "parent_id")
        }
        if len(found) < len(run_ids):
            rest = runs.exclude(pk__in=list(found)).values_list("pk", "status", "parent_id")
            for run_id, status, parent_id in rest:
                found[run_id] = ("locked" if status in TERMINAL_STATUSES else status, parent_id)
        return found

    def purge_signals(self, taken_before: datetime, limit: int) -> int:
        """Delete up to ``limit`` signals taken by a run before ``taken_before``; signals
        still kept for a waiter stay."""
        signals = Signal.objects.using(self.using)
        with transaction.atomic(using=self.using):
            ids = list(
                signals.filter(consumed_at__lt=taken_before)
                .order_by()
                .values_list("pk", flat=True)[:limit]
            )
            if ids:
                signals.filter(pk__in=ids).delete()
        return len(ids)
