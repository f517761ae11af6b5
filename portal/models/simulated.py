"""State of the simulated cluster: its workloads and what was changed on its nodes."""

from __future__ import annotations

from django.db import models


class SimulatedWorkload(models.Model):
    """A workload of the simulated cluster. Its life is a function of time."""

    name = models.CharField(max_length=63)
    namespace = models.CharField(max_length=63)
    node = models.CharField(max_length=253)
    spec = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    exit_code = models.IntegerField(default=0)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="simworkload_unique")
        ]


class SimulatedNode(models.Model):
    """What was changed on a simulated node (labels, cordon): the simulated cluster's state
    beyond its YAML file, shared by the web, worker and beat processes."""

    name = models.CharField(max_length=253, unique=True)
    labels = models.JSONField(default=dict)
    unschedulable = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.name
