"""`/metrics` in Prometheus text format, read from the database at scrape time.

Every web replica answers the same numbers because they come from the
database, not from process memory. Names follow ECOSYSTEM.md §6 and the
chart's PrometheusRule and dashboard (charts/quartermaster).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from django.db.models import Count, F, Min, Q, Sum
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from portal.models import (
    Allocation,
    Attempt,
    Decision,
    Device,
    GpuRequest,
    Node,
    Quota,
    SchedulerState,
    UsageRecord,
)

TICK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


def tick_bucket(seconds: float) -> str:
    """The histogram bucket a tick duration falls in (its upper bound, or +Inf)."""
    for bound in TICK_BUCKETS:
        if seconds <= bound:
            return str(bound)
    return "+Inf"


def _cumulative(counts: dict[str, int], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound in bounds:
        running += counts.get(str(bound), 0)
        out.append((str(bound), float(running)))
    out.append(("+Inf", float(running + counts.get("+Inf", 0))))
    return out


class PortalCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from self._queue()
        yield from self._scheduler()
        yield from self._capacity()
        yield from self._teams()
        yield from self._outcomes()

    def _queue(self) -> Iterator[Metric]:
        now = timezone.now()
        pending = GaugeMetricFamily(
            "quartermaster_pending_requests",
            "Pending requests; status=active may start now, backoff waits for its requeue time",
            labels=["class", "team", "pool", "status"],
        )
        age = GaugeMetricFamily(
            "quartermaster_queue_oldest_age_seconds",
            "Age of the oldest pending request",
            labels=["class", "team", "pool"],
        )
        backoff = Q(requeue_at__gt=now)
        rows = (
            GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
            .values("workload_class__name", "team__name", "pool__name")
            .annotate(n=Count("id"), waiting=Count("id", filter=backoff), oldest=Min("created_at"))
        )
        for r in rows:
            labels = [r["workload_class__name"], r["team__name"], r["pool__name"] or "any"]
            pending.add_metric([*labels, "active"], r["n"] - r["waiting"])
            pending.add_metric([*labels, "backoff"], r["waiting"])
            age.add_metric(labels, (now - r["oldest"]).total_seconds())
        yield pending
        yield age

        wait = HistogramMetricFamily(
            "quartermaster_admission_wait_time_seconds",
            "Seconds from submit to first admission, by class band",
            labels=["class", "priority"],
        )
        first = Attempt.objects.filter(number=1).values(
            "request__workload_class__name",
            "request__workload_class__band",
            "admitted_at",
            "request__created_at",
        )
        buckets: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        sums: dict[tuple[str, str], float] = defaultdict(float)
        for a in first.iterator():
            key = (a["request__workload_class__name"], str(a["request__workload_class__band"]))
            seconds = max(0.0, (a["admitted_at"] - a["request__created_at"]).total_seconds())
            bound = next((str(b) for b in WAIT_BUCKETS if seconds <= b), "+Inf")
            buckets[key][bound] += 1
            sums[key] += seconds
        for key, counts in sorted(buckets.items()):
            wait.add_metric(
                list(key), _cumulative(counts, tuple(float(b) for b in WAIT_BUCKETS)), sums[key]
            )
        yield wait
        # Filled by inference serving; declared so that dashboards and alerts resolve.
        yield HistogramMetricFamily(
            "quartermaster_inference_time_to_first_token_seconds",
            "Inference time to first token",
            labels=["team"],
        )

    def _scheduler(self) -> Iterator[Metric]:
        state = SchedulerState.objects.filter(pk=1).first() or SchedulerState()
        duration = HistogramMetricFamily(
            "quartermaster_scheduler_tick_duration_seconds", "Duration of scheduler ticks"
        )
        duration.add_metric(
            [], _cumulative(state.tick_histogram, TICK_BUCKETS), state.tick_seconds_sum
        )
        yield duration
        for name, value, doc in (
            (
                "quartermaster_scheduler_tick_skipped",
                state.skipped_ticks,
                "Ticks skipped because another held the lock",
            ),
            (
                "quartermaster_scheduler_tick_failures",
                state.failed_ticks,
                "Ticks that raised an error",
            ),
            (
                "quartermaster_reconciler_repairs",
                state.reconciler_repairs,
                "Launches and stops the reconciler re-drove",
            ),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c

    def _capacity(self) -> Iterator[Metric]:
        allocated = GaugeMetricFamily(
            "quartermaster_allocated_gpu_milli", "GPU milli held by attempts", labels=["pool"]
        )
        for r in (
            Allocation.objects.filter(active=True, slot__in=["gpu", "s0", "m0"])
            .values("device__node__pool__name")
            .annotate(m=Sum("milli"))
        ):
            allocated.add_metric([r["device__node__pool__name"]], r["m"] or 0)
        yield allocated
        capacity = GaugeMetricFamily(
            "quartermaster_capacity_gpus", "Usable GPUs on ready, uncordoned nodes", labels=["pool"]
        )
        usable = Device.objects.filter(
            healthy=True,
            agent_healthy=True,
            quarantined=False,
            node__ready=True,
            node__cordoned=False,
        )
        for r in usable.values("node__pool__name").annotate(n=Count("id")):
            capacity.add_metric([r["node__pool__name"]], r["n"])
        yield capacity
        heartbeat = GaugeMetricFamily(
            "quartermaster_node_agent_last_heartbeat_timestamp_seconds",
            "Last node agent report",
            labels=["node"],
        )
        for name, beat in Node.objects.filter(last_heartbeat__isnull=False).values_list(
            "name", "last_heartbeat"
        ):
            heartbeat.add_metric([name], beat.timestamp())
        yield heartbeat

    def _teams(self) -> Iterator[Metric]:
        quota = GaugeMetricFamily(
            "quartermaster_team_quota", "Nominal quota in GPUs", labels=["team", "pool"]
        )
        for q in Quota.objects.values("team__name", "pool__name", "nominal_milli"):
            quota.add_metric([q["team__name"], q["pool__name"]], q["nominal_milli"] / 1000)
        yield quota
        usage = GaugeMetricFamily(
            "quartermaster_team_usage", "GPUs held now", labels=["team", "pool", "class"]
        )
        held = (
            UsageRecord.objects.filter(ended_at__isnull=True)
            .values("team__name", "pool__name", class_name=F("workload_class__name"))
            .annotate(m=Sum("gpus_milli"))
        )
        for r in held:
            usage.add_metric(
                [r["team__name"], r["pool__name"], r["class_name"]], (r["m"] or 0) / 1000
            )
        yield usage

    def _outcomes(self) -> Iterator[Metric]:
        admitted = CounterMetricFamily(
            "quartermaster_admitted_requests", "Admissions", labels=["pool"]
        )
        for r in (
            Decision.objects.filter(kind=Decision.Kind.ADMIT)
            .values("pool__name")
            .annotate(n=Count("id"))
        ):
            admitted.add_metric([r["pool__name"] or ""], r["n"])
        yield admitted
        preempted = CounterMetricFamily(
            "quartermaster_preempted_requests", "Preemptions by the scheduler", labels=["reason"]
        )
        for r in (
            Decision.objects.filter(kind=Decision.Kind.PREEMPT)
            .values("code")
            .annotate(n=Count("id"))
        ):
            preempted.add_metric([r["code"]], r["n"])
        yield preempted
        evicted = CounterMetricFamily(
            "quartermaster_evicted_requests", "Attempts ended by the cluster", labels=["reason"]
        )
        for r in (
            Attempt.objects.filter(state__in=[Attempt.State.NODE_LOST, Attempt.State.PREEMPTED])
            .values("state")
            .annotate(n=Count("id"))
        ):
            evicted.add_metric([r["state"]], r["n"])
        yield evicted
        decisions = CounterMetricFamily(
            "quartermaster_decisions", "Decisions by kind and reason", labels=["kind", "code"]
        )
        for r in Decision.objects.values("kind", "code").annotate(n=Count("id")):
            decisions.add_metric([r["kind"], r["code"]], r["n"])
        yield decisions


def metrics_response() -> HttpResponse:
    registry = CollectorRegistry()
    registry.register(PortalCollector())
    return HttpResponse(
        generate_latest(registry), content_type="text/plain; version=0.0.4; charset=utf-8"
    )


def metrics_view(request: object) -> HttpResponse:
    """Served by ProbeMiddleware; kept as a view so the URL resolves and reverses."""
    return metrics_response()
