"""`/metrics` in Prometheus text format, read from the database at scrape time.

Names follow ../shared/reference/ECOSYSTEM.md §6 (`quartermaster_*`).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Min, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from portal.models import Allocation, Decision, Device, GpuRequest, Node, SchedulerState


class PortalCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = timezone.now()
        pending = GaugeMetricFamily(
            "quartermaster_pending_requests", "Pending requests", labels=["class", "team", "pool"]
        )
        age = GaugeMetricFamily(
            "quartermaster_queue_oldest_age_seconds", "Age of the oldest pending request", labels=["class", "team", "pool"]
        )
        rows = (
            GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
            .values("workload_class__name", "team__name", "pool__name")
            .annotate(n=Count("id"), oldest=Min("created_at"))
        )
        for r in rows:
            labels = [r["workload_class__name"], r["team__name"], r["pool__name"] or "any"]
            pending.add_metric(labels, r["n"])
            age.add_metric(labels, (now - r["oldest"]).total_seconds())
        yield pending
        yield age

        allocated = GaugeMetricFamily("quartermaster_allocated_gpu_milli", "GPU milli held by attempts", labels=["pool"])
        for r in Allocation.objects.filter(active=True).values("device__node__pool__name").annotate(m=Sum("milli")):
            allocated.add_metric([r["device__node__pool__name"]], r["m"] or 0)
        yield allocated

        capacity = GaugeMetricFamily("quartermaster_capacity_gpus", "Healthy GPUs on ready nodes", labels=["pool"])
        healthy = Device.objects.filter(healthy=True, node__ready=True, node__cordoned=False)
        for r in healthy.values("node__pool__name").annotate(n=Count("id")):
            capacity.add_metric([r["node__pool__name"]], r["n"])
        yield capacity

        decisions = CounterMetricFamily("quartermaster_decisions", "Decisions by kind and reason", labels=["kind", "code"])
        for r in Decision.objects.values("kind", "code").annotate(n=Count("id")):
            decisions.add_metric([r["kind"], r["code"]], r["n"])
        yield decisions

        state = SchedulerState.objects.filter(pk=1).first()
        ticks = CounterMetricFamily("quartermaster_ticks", "Scheduler ticks run")
        skipped = CounterMetricFamily("quartermaster_ticks_skipped", "Ticks skipped because another held the lock")
        duration = GaugeMetricFamily("quartermaster_tick_duration_seconds", "Duration of the last tick")
        ticks.add_metric([], state.ticks if state else 0)
        skipped.add_metric([], state.skipped_ticks if state else 0)
        duration.add_metric([], (state.last_tick_ms if state else 0) / 1000)
        yield ticks
        yield skipped
        yield duration

        nodes = GaugeMetricFamily("quartermaster_nodes", "Nodes by readiness", labels=["pool", "ready", "cordoned"])
        for r in Node.objects.values("pool__name", "ready", "cordoned").annotate(n=Count("id")):
            nodes.add_metric([r["pool__name"], str(r["ready"]).lower(), str(r["cordoned"]).lower()], r["n"])
        yield nodes


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    registry = CollectorRegistry()
    registry.register(PortalCollector())
    return HttpResponse(generate_latest(registry), content_type="text/plain; version=0.0.4; charset=utf-8")
