"""The tables behind the ORM store: runs, their tags, their recorded steps, quota locks."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import connections, models
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import Q, Sum
from django.utils import timezone
from django.utils import timezone as django_timezone

from ._core import limits
from ._core.serialization import json_copy, length_problem, number_problem, text_problem
from ._rules.registry import default_registry
from ._rules.windows import next_window, schedule_quota, validate_timing
from .errors import UnstorableValueError, WorkflowNotFound
from .fields import ExactCharField
from .status import RunStatus

_Field = TypeVar("_Field", bound="models.Field[Any, Any]")


def model_field(model: type[models.Model], name: str, kind: type[_Field]) -> _Field:
    """``model``'s field ``name``, which is a ``kind`` (``_meta.get_field`` also finds the
    relations pointing at the model)."""
    field = model._meta.get_field(name)
    if not isinstance(field, kind):
        raise TypeError(f"{model.__name__}.{name} is not a {kind.__name__}")
    return field


class PartialIndex(models.Index):
    """An index of ``fields`` holding only the rows that match ``where`` on a database
    with partial indexes (PostgreSQL, SQLite), and every row elsewhere (MySQL, MariaDB).

    Django's ``Index(condition=...)`` does the same, but warns on every ``migrate`` of a
    MariaDB database (``models.W037``); this one says so here instead. A row whose status
    the index does not hold writes no entry of it: a status change costs one index entry
    less per such index.
    """

    def __init__(self, *, fields: Sequence[str], name: str, where: Q) -> None:
        super().__init__(fields=fields, name=name)
        self.where = where

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        partial = schema_editor.connection.features.supports_partial_indexes
        made = models.Index(
            fields=self.fields, name=self.name, condition=self.where if partial else None
        )
        return made.create_sql(model, schema_editor, using=using, **kwargs)

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        return path, args, {**kwargs, "where": self.where}


class RunQuerySet(models.QuerySet["Run"]):
    """Domain filters on runs."""

    def active(self) -> RunQuerySet:
        """Runs not yet completed, failed or cancelled."""
        return self.exclude(status__in=RunStatus.terminal_values())

    def tagged(self, tag: str) -> RunQuerySet:
        """Runs carrying ``tag``."""
        return self.filter(tag_rows__tag=tag)


class Run(models.Model):
    """One execution of a workflow, from its start to its end."""

    id = ExactCharField(primary_key=True, max_length=limits.RUN_ID, verbose_name="run id")
    workflow = ExactCharField(
        max_length=limits.WORKFLOW, help_text="The workflow's registered name."
    )
    version = models.CharField(
        max_length=limits.VERSION, help_text="The workflow version that started it."
    )
    namespace = ExactCharField(max_length=limits.NAMESPACE, default="default")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    queue = models.CharField(
        max_length=limits.QUEUE,
        blank=True,
        default="",
        help_text="Celery queue; empty for the default.",
    )
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # NULL, not "", for a run without a parent: it is a reference, not text. Its index is
    # partial (``durable_run_parent_idx``, below): only child runs are looked up by parent.
    parent_id = ExactCharField(max_length=limits.RUN_ID, null=True, blank=True)
    blocked_reason = models.TextField(blank=True, default="")
    attempt = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    wake_at = models.DateTimeField(
        null=True, blank=True, help_text="When a suspended or blocked run is due again."
    )
    wait = models.JSONField(null=True, blank=True, help_text="What a suspended run waits for.")
    lease_owner = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="The worker executing the run.",
    )
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="A running run whose lease lapsed is handed on."
    )

    objects = RunQuerySet.as_manager()

    class Meta:
        db_table = "durable_run"
        verbose_name = "run"
        verbose_name_plural = "runs"
        ordering = ["-created_at"]
        indexes = [
            # Also the tick's search for the running runs whose lease lapsed: it reads the
            # running runs (as many as the turns executing, or about to be handed on) and
            # tests their lease. No index holds the lease, so a renewal of the lease
            # changes no indexed column: on PostgreSQL it stays in place (a HOT update, no
            # index entry), and on MySQL and MariaDB it updates no index.
            models.Index(fields=["status", "created_at"], name="durable_run_status_idx"),
            models.Index(fields=["workflow", "status"], name="durable_run_workflow_idx"),
            # No index on the namespace: a store's namespaces are few (one per deployment
            # sharing it), so a search by namespace reads most of the table's entries
            # anyway; its queries are served by the status index (a count or listing in
            # some statuses) and the creation time's (a listing, newest first). Every
            # status change of a run (none stays in place: the status is indexed) writes
            # a new entry in each full index, so one index fewer is two entries fewer per
            # turn, and one index fewer to open on a new connection's first start.
            models.Index(fields=["created_at"], name="durable_run_created_idx"),
            # The tick's search (``OrmStore.due_runs``) for the runs due to wake. Partial on
            # those statuses, so that the other status changes of a run (its claim, its
            # end) write no entry of it.
            PartialIndex(
                fields=["status", "wake_at"],
                name="durable_run_wake_idx",
                where=Q(status__in=[RunStatus.SUSPENDED, RunStatus.BLOCKED]),
            ),
            # A run's children (the purge, the admin's deletion): only the runs that have a
            # parent are in it, so the other runs' rows (a start, and every status change,
            # none of which can stay in place: the status is indexed) write no entry of it.
            PartialIndex(
                fields=["parent_id"],
                name="durable_run_parent_idx",
                where=Q(parent_id__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="durable_run_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} {self.id} ({self.status})"


class RunTagQuerySet(models.QuerySet["RunTag"]):
    """Domain filters on tag rows."""

    def count_runs(
        self, *, tag: str, statuses: list[str] | tuple[str, ...], namespace: str | None = None
    ) -> int:
        """How many runs carry ``tag`` with one of ``statuses``: one indexed ``COUNT(*)``.

        It reads the tag rows alone, whose copy of the run's status and namespace is kept in
        step with the run, so its cost does not grow with the key's finished history.
        On PostgreSQL it is a ``UNION ALL`` of one equality per status: with
        ``status IN (...)`` the planner may read every index entry of the tag and filter
        the statuses afterwards (when its statistics say the tag has few rows); with an
        equality per status the index is searched on ``(tag, status)`` whatever the
        statistics say, so finished runs are never read. Either way one statement, so one
        snapshot.
        """
        statuses = list(dict.fromkeys(statuses))
        if len(statuses) > 1 and connections[self.db].vendor == "postgresql":
            parts = [self._tagged(tag, [status], namespace).values("status") for status in statuses]
            return int(parts[0].union(*parts[1:], all=True).count())
        return self._tagged(tag, statuses, namespace).count()

    def units(
        self, quotas: Sequence[tuple[str, Sequence[str]]], namespace: str | None = None
    ) -> list[int]:
        """For each ``(tag, statuses)`` of ``quotas``, the sum of the weights of the rows
        of ``tag`` in one of ``statuses``: the units a quota's key holds. One query, read
        from the ``(tag, status, namespace)`` index's rows, whatever the number of quotas;
        on PostgreSQL a ``UNION ALL`` of one equality per tag and status, as
        :meth:`count_runs` is (see there why)."""
        wanted = [(tag, list(dict.fromkeys(statuses))) for tag, statuses in quotas]
        pairs = [(tag, status) for tag, statuses in wanted for status in statuses]
        if len(pairs) > 1 and connections[self.db].vendor == "postgresql":
            parts = [
                self._tagged(tag, [status], namespace)
                .values_list("tag", "status")
                .annotate(units=Sum("weight"))
                for tag, status in pairs
            ]
            rows = parts[0].union(*parts[1:], all=True)
        else:
            tags = list(dict.fromkeys(tag for tag, _ in pairs))
            statuses = list(dict.fromkeys(status for _, status in pairs))
            rows = (
                self.filter(tag__in=tags, status__in=statuses)
                .filter(**({"namespace": namespace} if namespace is not None else {}))
                .values_list("tag", "status")
                .annotate(units=Sum("weight"))
            )
        found = {(tag, status): units for tag, status, units in rows}
        return [
            int(sum(found.get((tag, status), 0) for status in statuses)) for tag, statuses in wanted
        ]

    def _tagged(self, tag: str, statuses: list[str], namespace: str | None) -> RunTagQuerySet:
        rows = self.filter(tag=tag, status__in=statuses)
        return rows.filter(namespace=namespace) if namespace is not None else rows


class RunTag(models.Model):
    """A tag on a run, with a copy of the run's status and namespace for indexed counts."""

    # No index of its own: the unique (run, tag) constraint's index leads with the run.
    # No foreign key in the database (db_constraint=False): every tag row is inserted in
    # the transaction that inserts its run or holds its row lock, so a key's check per
    # insert would only repeat it. A run deleted otherwise than through Django (which
    # deletes its tag rows first, on_delete=CASCADE) takes its tag rows with it: the
    # trigger ``durable_run_deleted`` of migration 0006 (``stores.run_deletion``).
    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        related_name="tag_rows",
        db_index=False,
        db_constraint=False,
    )
    tag = ExactCharField(max_length=limits.TAG)
    status = models.CharField(
        max_length=16,
        choices=RunStatus.choices,
        help_text="Copy of the run's status, changed in the same transaction.",
    )
    namespace = ExactCharField(
        max_length=limits.NAMESPACE, help_text="Copy of the run's namespace."
    )
    weight = models.PositiveIntegerField(
        default=1,
        db_default=1,
        help_text="The units of its quota the run occupies (1 for a tag of no quota).",
    )
    created_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Copy of the run's creation time, on a rate limit's tag only.",
    )

    objects = RunTagQuerySet.as_manager()

    class Meta:
        db_table = "durable_run_tag"
        verbose_name = "run tag"
        verbose_name_plural = "run tags"
        constraints = [
            models.UniqueConstraint(fields=["run", "tag"], name="durable_run_tag_unique"),
        ]
        indexes = [
            models.Index(fields=["tag", "status", "namespace"], name="durable_tag_count_idx"),
            # A rate limit's window: the sum of its key's weights created after a time
            # reads only the window's entries, never the key's older history. Partial,
            # on the rate limits' rows alone, so that no plan counts a concurrency key
            # through it (a generic plan on PostgreSQL could: both indexes lead with the
            # tag). MySQL and MariaDB, without partial indexes, get it whole.
            PartialIndex(
                fields=["tag", "created_at", "weight"],
                name="durable_tag_window_idx",
                where=Q(created_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.tag


class Step(models.Model):
    """A recorded ``ctx.step``: its position in the body, its name and its outcome."""

    # No index of its own: the unique (run, position) constraint's index leads with the run.
    # No foreign key in the database (db_constraint=False): every record of a step is made
    # under its run's row lock (the share lock of ``durable_record_held_step_v1``, the
    # update of a transition), which already guarantees the run, so the key's check per
    # record would only repeat it. Deleting runs locks their rows first too
    # (``OrmStore.delete_runs`` and ``purge_runs``), and Django deletes their steps with
    # them (on_delete=CASCADE is Django's, with or without the key).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="steps", db_index=False, db_constraint=False
    )
    position = models.PositiveIntegerField()
    name = models.CharField(max_length=limits.STEP_NAME)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "durable_step"
        verbose_name = "step"
        verbose_name_plural = "steps"
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="durable_step_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.position}: {self.name}"


class Signal(models.Model):
    """A payload sent to a token, kept until a run waiting on that token takes it."""

    token = ExactCharField(max_length=limits.SIGNAL_TOKEN)
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    consumed_by = ExactCharField(
        max_length=limits.RUN_ID,
        blank=True,
        default="",
        db_default="",
        help_text="The run that took it.",
    )
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "durable_signal"
        verbose_name = "signal"
        verbose_name_plural = "signals"
        indexes = [
            models.Index(fields=["token", "consumed_by", "id"], name="durable_signal_token_idx"),
        ]

    def __str__(self) -> str:
        return self.token


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    """Domain filters and writes on schedules."""

    def enabled(self) -> ScheduleQuerySet:
        """Schedules that fire."""
        return self.filter(enabled=True)

    def due(self, now: datetime.datetime) -> ScheduleQuerySet:
        """Enabled schedules whose next window is due at ``now``, earliest first."""
        return self.enabled().filter(next_due_at__lte=now).order_by("next_due_at")

    def put(self, key: str, **fields: Any) -> Schedule:
        """Create or update the schedule ``key`` from code, validated like an admin form
        (``full_clean``); its next due time is computed afresh."""
        row = self.filter(key=key).first() or self.model(key=key)
        for name, value in fields.items():
            setattr(row, name, value)
        row.full_clean()
        row.next_due_at = row.compute_next_due(django_timezone.now()) if row.enabled else None
        row.save()
        return row


class Schedule(models.Model):
    """A persisted schedule: one run of ``workflow`` per window, under a quota of its own."""

    class Source(models.TextChoices):
        CODE = "code", "Declared in code"
        ADMIN = "admin", "Edited in the admin"

    key = ExactCharField(
        max_length=limits.SCHEDULE_KEY, unique=True, help_text="Stable name of the schedule."
    )
    workflow = ExactCharField(
        max_length=limits.WORKFLOW, help_text="The registered workflow to start."
    )
    input = models.JSONField(null=True, blank=True, help_text="The input of every run.")
    cron = models.CharField(
        max_length=limits.SCHEDULE_CRON,
        blank=True,
        default="",
        help_text="Five-field cron expression.",
    )
    timezone = models.CharField(
        max_length=limits.TIMEZONE,
        default="UTC",
        help_text="IANA timezone the cron expression is read in.",
    )
    interval_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Fire every this many seconds (instead of cron)."
    )
    enabled = models.BooleanField(default=True)
    concurrency_key = ExactCharField(
        max_length=limits.SCHEDULE_QUOTA_KEY,
        blank=True,
        default="",
        help_text="Quota key of the schedule's own; empty: the workflow's quota applies.",
    )
    concurrency_limit = models.IntegerField(null=True, blank=True)
    concurrency_statuses = models.JSONField(
        default=list, blank=True, help_text="Statuses that hold a slot; empty: the default."
    )
    source = models.CharField(
        max_length=8,
        choices=Source.choices,
        default=Source.ADMIN,
        help_text="Declared schedules follow their code until edited in the admin.",
    )
    next_due_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_run_id = ExactCharField(max_length=limits.RUN_ID, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    # The ``timezone`` field above hides django.utils.timezone in this class body.
    created_at = models.DateTimeField(default=django_timezone.now)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        db_table = "durable_schedule"
        verbose_name = "schedule"
        verbose_name_plural = "schedules"
        ordering = ["key"]
        indexes = [
            models.Index(fields=["enabled", "next_due_at"], name="durable_schedule_due_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval_seconds__isnull=False))
                | (~Q(cron="") & Q(interval_seconds__isnull=True)),
                name="durable_schedule_one_timing",
                violation_error_message="Give exactly one of a cron expression and an interval.",
            ),
            models.CheckConstraint(
                condition=Q(interval_seconds__isnull=True) | Q(interval_seconds__gt=0),
                name="durable_schedule_interval_positive",
            ),
            models.CheckConstraint(
                condition=Q(concurrency_key="") | Q(concurrency_limit__isnull=False),
                name="durable_schedule_quota_has_limit",
                violation_error_message="A schedule's concurrency key needs a limit.",
            ),
        ]

    def __str__(self) -> str:
        return self.key

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The next due time is derived from the timing; fill it in when it is missing.
        if self.next_due_at is None and self.enabled:
            self.next_due_at = self.compute_next_due(timezone.now())
        super().save(*args, **kwargs)

    def clean_fields(self, exclude: Any = None) -> None:
        """Django's checks of each field, and the columns' own on the values as given (in
        their place for a field both refuse): a number that is not an int (``2.5``,
        ``True``) is refused, not rounded; ranges are the same on every database; text
        and JSON must not hold a NUL character."""
        given = {
            field.name: getattr(self, field.attname)
            for field in self._meta.concrete_fields
            if not field.primary_key and field.name not in (exclude or ())
        }
        errors: dict[str, list[str]] = {}
        try:
            super().clean_fields(exclude=exclude)
        except ValidationError as error:
            errors = error.message_dict
        errors.update((name, [message]) for name, message in column_errors(given).items())
        if errors:
            raise ValidationError(errors)

    def clean(self) -> None:
        """Refuse what could not fire: the timing, the workflow, the quota options."""
        errors: dict[str, list[str]] = {}
        try:
            validate_timing(self.cron, self.timezone, self.interval_seconds)
        except (TypeError, ValueError) as error:
            field: str
            if bool(self.cron) == (self.interval_seconds is not None):
                field = NON_FIELD_ERRORS
            elif "timezone" in str(error):
                field = "timezone"
            else:
                field = "cron" if self.cron else "interval_seconds"
            errors.setdefault(field, []).append(str(error))
        try:
            default_registry.latest(self.workflow)
        except WorkflowNotFound as error:
            errors.setdefault("workflow", []).append(str(error))
        try:
            schedule_quota(self.concurrency_key, self.concurrency_limit, self.concurrency_statuses)
        except (TypeError, ValueError) as error:
            errors.setdefault("concurrency_key", []).append(str(error))
        if errors:
            raise ValidationError(errors)

    def compute_next_due(self, after: datetime.datetime) -> datetime.datetime:
        """The first window after ``after``."""
        return next_window(self.cron, self.timezone, self.interval_seconds, after)


def column_errors(fields: Mapping[str, Any]) -> dict[str, str]:
    """What the schedule table's columns would refuse among ``fields`` (``{name: value}``),
    by field name: text longer than its column or holding a NUL character, JSON holding a
    NUL character, a number that is not an int or is past its column's range. The limits
    are read from the model's fields, and the ranges are the same on every database."""
    errors = {}
    for name, value in fields.items():
        column = model_field(Schedule, name, models.Field)
        label = str(column.verbose_name)
        kind = column.get_internal_type()
        if value is None:
            continue
        if kind in BaseDatabaseOperations.integer_field_ranges:
            low, high = BaseDatabaseOperations.integer_field_ranges[kind]
            if problem := number_problem(label, value, low, high):
                errors[name] = problem
        elif (
            isinstance(value, str)
            and column.max_length
            and (problem := length_problem(label, value, column.max_length))
        ):
            errors[name] = problem
        elif isinstance(value, str) and (problem := text_problem(value)):
            errors[name] = f"{label} cannot be stored: {problem}"
        elif kind == "JSONField":
            try:
                json_copy(value, str(label))
            except UnstorableValueError as error:
                errors[name] = str(error)
    return errors


class QuotaLock(models.Model):
    """One row per quota key, locked to serialise starts of that key."""

    key = ExactCharField(primary_key=True, max_length=limits.QUOTA_KEY)
    last_start_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "durable_quota_lock"
        verbose_name = "quota lock"
        verbose_name_plural = "quota locks"

    def __str__(self) -> str:
        return self.key


class QuotaOverride(models.Model):
    """An operator's limit for one quota key, in place of the declared (or per-start)
    one until ``until`` (for good when it is empty): read by every start of the key under
    the key's lock (:mod:`durable_django._rules.overrides`)."""

    tag = ExactCharField(
        max_length=limits.TAG,
        help_text="The key's tag: concurrency:<key>, or rate:<key> for a rate key.",
    )
    scope = ExactCharField(
        max_length=limits.NAMESPACE,
        blank=True,
        help_text="The namespace whose starts it applies to; empty: those counting every one.",
    )
    limit = models.PositiveIntegerField(
        db_column="quota_limit", help_text="The limit in force while it lasts; 0 pauses the key."
    )
    until = models.DateTimeField(
        null=True, blank=True, help_text="When it ends by itself; empty: when it is cleared."
    )
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "durable_quota_override"
        verbose_name = "quota override"
        verbose_name_plural = "quota overrides"
        constraints = [
            models.UniqueConstraint(fields=["tag", "scope"], name="durable_override_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tag} = {self.limit}"


class QuotaTicket(models.Model):
    """A ticket a fair quota keeps: a refused start's place in its key's line, taken when
    its client came back with it (:mod:`durable_django._rules.tickets`)."""

    id = models.CharField(primary_key=True, max_length=32)
    quota_key = ExactCharField(max_length=limits.QUOTA_KEY)
    joined_at = models.DateTimeField(
        help_text="When its client first came back with it: its place in the key's line."
    )
    weight = models.PositiveIntegerField(default=1)
    expires_at = models.DateTimeField(help_text="Past this, the ticket holds no place.")
    namespace = ExactCharField(
        max_length=limits.NAMESPACE,
        default="",
        help_text="The namespace of the engine that kept it: the line it is in.",
    )
    held_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Bound to a hold of the line: past this, unless the hold ended used, "
        "the ticket holds no place.",
    )

    class Meta:
        db_table = "durable_quota_ticket"
        verbose_name = "quota ticket"
        verbose_name_plural = "quota tickets"
        indexes = [models.Index(fields=["quota_key", "joined_at"], name="durable_ticket_line")]

    def __str__(self) -> str:
        return f"{self.quota_key} {self.id}"
