"""Rows behind `/metrics` and utilization history: the exporter lease, samples and rollups."""

from __future__ import annotations

from django.db import models

from portal.models.pools import Device


class MetricsLease(models.Model):
    """One row: which web replica exports the database-derived metrics.

    Every replica reads the same database, so each would export the same
    numbers and `sum()` would count them once per replica. The replica that
    holds this lease exports them; the others export only
    `quartermaster_metrics_exporter{replica_role="follower"}`.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    holder = models.CharField(max_length=253, blank=True)
    until = models.DateTimeField(null=True, blank=True)


class UtilizationSample(models.Model):
    """One device's utilization at one minute, as the node agent (or the simulated cluster)
    read it. Kept UTILIZATION_RAW_HOURS, then folded into `UtilizationRollup`."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField()
    #: denormalised so that rollups group without joins
    node = models.CharField(max_length=253)
    pool = models.CharField(max_length=63)
    #: the team holding the device then ("" = idle)
    team = models.CharField(max_length=63, blank=True)
    utilization_pct = models.PositiveSmallIntegerField(default=0)
    memory_used_mib = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["at"]), models.Index(fields=["pool", "at"])]


class UtilizationRollup(models.Model):
    """Mean and peak utilization of a node, pool or team over one bucket (5 min or 1 h)."""

    class Scope(models.TextChoices):
        NODE = "node"
        POOL = "pool"
        TEAM = "team"

    scope = models.CharField(max_length=4, choices=Scope.choices)
    key = models.CharField(max_length=253)
    resolution_s = models.PositiveIntegerField()
    start = models.DateTimeField()
    utilization_avg = models.FloatField(default=0.0)
    utilization_max = models.FloatField(default=0.0)
    memory_used_mib_avg = models.FloatField(default=0.0)
    #: device-minutes folded in
    samples = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "key", "resolution_s", "start"], name="rollup_unique"
            )
        ]
