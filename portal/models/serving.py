"""Serving workloads over time: request-path samples and model revision changes."""

from __future__ import annotations

from django.db import models

from portal.models.requests import GpuRequest


class RevisionChange(models.Model):
    """A serving workload's model revision changed: a mark on its timeline."""

    request = models.ForeignKey(
        GpuRequest, on_delete=models.CASCADE, related_name="revision_changes"
    )
    before = models.CharField(max_length=100, blank=True)
    after = models.CharField(max_length=100)
    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["at", "id"]


class ServingSample(models.Model):
    """A serving workload's request path at one moment, read from its replicas' /metrics:
    the fallback history when no Prometheus is configured (portal/services/serving_samples.py)."""

    request = models.ForeignKey(
        GpuRequest, on_delete=models.CASCADE, related_name="serving_samples"
    )
    at = models.DateTimeField()
    model_revision = models.CharField(max_length=100, blank=True)
    ttft_p50_seconds = models.FloatField(null=True)
    ttft_p95_seconds = models.FloatField(null=True)
    e2e_p95_seconds = models.FloatField(null=True)
    batch_size = models.FloatField(null=True)
    queue_depth = models.FloatField(null=True)
    running = models.FloatField(null=True)
    tokens_per_second = models.FloatField(null=True)
    gpu_utilization = models.FloatField(null=True)
    gpu_memory_used_mib = models.FloatField(null=True)

    class Meta:
        ordering = ["at"]
        indexes = [models.Index(fields=["request", "at"])]
