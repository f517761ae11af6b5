"""The scheduler's own rows: decisions, scheduling profiles, tick state and what-if runs."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from portal.models.pools import Pool
from portal.models.requests import Attempt, GpuRequest
from portal.models.teams import Team
from scheduling import profile as scheduling_profile


class Decision(models.Model):
    class Kind(models.TextChoices):
        ADMIT = "admit"
        WAIT = "wait"
        PREEMPT = "preempt"
        REJECT = "reject"
        REQUEUE = "requeue"
        END = "end"

    # A tick writes thousands of rows here: only the indexes that reads use (Meta.indexes,
    # created_at for pruning, attempt and pool for their deletes). Team and request are
    # the first columns of the composite indexes; node is searched by substring.
    # The log's foreign keys are not database constraints: checking four per row at
    # commit took a tenth of a 10,000-request tick. The tick writes ids it has just read
    # in its own transaction, and deletes cascade (or set null) through the ORM as before.
    tick = models.BigIntegerField(default=0)
    request = models.ForeignKey(
        GpuRequest,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="decisions",
        db_index=False,
        db_constraint=False,
    )
    attempt = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.SET_NULL, db_constraint=False
    )
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, db_index=False, db_constraint=False
    )
    pool = models.ForeignKey(
        Pool, null=True, blank=True, on_delete=models.SET_NULL, db_constraint=False
    )
    node = models.CharField(max_length=253, blank=True)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    code = models.CharField(max_length=50)
    message = models.CharField(max_length=500)
    facts = models.JSONField(default=dict, blank=True)
    #: the scheduling profile in force when the tick decided (blank: not a tick's decision)
    profile_name = models.CharField(max_length=63, blank=True)
    profile_version = models.PositiveIntegerField(null=True, blank=True)
    #: the policy version in force (`PolicyVersion.number`): quotas, classes, pools, profiles
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["team", "-created_at"]),
            models.Index(fields=["request", "-created_at"]),
            models.Index(fields=["kind"], name="portal_decision_kind"),
        ]


class PolicyProfileQuerySet(models.QuerySet["PolicyProfile"]):
    def active_profile(self) -> scheduling_profile.Profile:
        """The active profile's knobs; the shipped default when none is stored yet (reads only:
        the tick stores it, `services.policy_profile_ensure`)."""
        row = self.filter(active=True).first()
        return row.profile() if row is not None else scheduling_profile.load()


class PolicyProfile(models.Model):
    """A named, versioned set of the scheduling core's knobs (`scheduling.profile`).

    Exactly one is active: the tick runs it and every decision records its name and
    version. Changed only through the services, which validate, bump `version` and audit.
    """

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[
            RegexValidator(
                scheduling_profile.NAME_RE.pattern,
                "Use lower-case letters, digits, '-', '_' or '.'.",
            )
        ],
    )
    version = models.PositiveIntegerField(default=1)
    #: every knob of `scheduling.types.Policy`, by name
    knobs = models.JSONField(default=dict)
    active = models.BooleanField(default=False)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    updated_at = models.DateTimeField(auto_now=True)

    objects = PolicyProfileQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            # at most one active; the services keep at least one
            models.UniqueConstraint(
                fields=["active"], condition=Q(active=True), name="policyprofile_one_active"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def profile(self) -> scheduling_profile.Profile:
        return scheduling_profile.parse({"name": self.name, "version": self.version, **self.knobs})


class SchedulerState(models.Model):
    """One row: tick counters, and the tick lease used where advisory locks do not exist."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    ticks = models.BigIntegerField(default=0)
    skipped_ticks = models.BigIntegerField(default=0)
    last_tick_at = models.DateTimeField(null=True, blank=True)
    last_tick_ms = models.PositiveIntegerField(default=0)
    failed_ticks = models.BigIntegerField(default=0)
    reconciler_repairs = models.BigIntegerField(default=0)
    #: tick durations: {"le-bound-in-seconds": count}, cumulative like a Prometheus histogram
    tick_histogram = models.JSONField(default=dict)
    tick_seconds_sum = models.FloatField(default=0.0)
    lease_until = models.DateTimeField(null=True, blank=True)


class DecisionTally(models.Model):
    """Counts of decisions pruned from the log, so that metrics counters never go down.

    `decisions_prune` folds rows older than DECISION_RETENTION_DAYS in here before
    deleting them; /metrics adds these to the counts of the rows still kept.
    """

    kind = models.CharField(max_length=10)
    code = models.CharField(max_length=50)
    team_name = models.CharField(max_length=63, blank=True)
    pool_name = models.CharField(max_length=63, blank=True)
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "code", "team_name", "pool_name"], name="decision_tally_unique"
            )
        ]


class WhatIfRun(models.Model):
    """An admin's drafted policy change, replayed on the site's history (portal/tick/whatif.py)
    by a Celery task, compared, and perhaps applied (audited with this result)."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    days = models.PositiveIntegerField(default=7)
    #: the proposed change, KEY=VALUE as `manage.py whatif --set` takes them
    changes = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    progress = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"what-if {self.pk}"
