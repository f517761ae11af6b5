"""`/metrics` in Prometheus text format, read from the database at scrape time.

The numbers come from the database, not from process memory, so every web
replica could answer them. To keep `sum()` honest across replicas, only the
replica holding the metrics lease (`MetricsLease`, renewed at each scrape)
exports them; the others export `quartermaster_metrics_exporter` with
`replica_role="follower"` and nothing else. A scrape reads aggregates
(GROUP BY in the database), never row by row, and the decision counts it
adds up are bounded by the decision log's retention (pruned rows are folded
into `DecisionTally`). Names and labels match the chart's PrometheusRule and
dashboard (charts/quartermaster), which tests/chart/test_alerts.py checks
against series this module produced.
"""

from __future__ import annotations

import hmac
import os
import socket
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from portal.metrics import serving as metrics_serving
from portal.models import (
    Allocation,
    Attempt,
    Decision,
    DecisionTally,
    Device,
    GpuRequest,
    MetricsLease,
    Node,
    NodeProvision,
    Quota,
    SchedulerState,
    UsageRecord,
    WorkloadClass,
)
from portal.selectors.queue import promise_by_class
from portal.tick import waits
from portal.tick.run import TICK_BUCKETS

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


def _cumulative(counts: dict[str, int], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound in bounds:
        running += counts.get(str(bound), 0)
        out.append((str(bound), float(running)))
    out.append(("+Inf", float(running + counts.get("+Inf", 0))))
    return out


def _promise() -> Iterator[Metric]:
    """The queue-time promise per class (`promise_by_class`), and the all-time count of
    first admissions that broke it, which the queue-age alert watches."""
    attainment = GaugeMetricFamily(
        "quartermaster_queue_promise_attainment_ratio",
        "Share of requests of the last 7 days admitted within their class's maximum queue time",
        labels=["class"],
    )
    overrun = GaugeMetricFamily(
        "quartermaster_queue_promise_overrun_max_seconds",
        "Longest wait beyond the class's maximum queue time, requests of the last 7 days",
        labels=["class"],
    )
    for name, promise in promise_by_class(GpuRequest.objects.all()).items():
        attainment.add_metric([name], promise.attainment)
        overrun.add_metric([name], promise.overrun_max_s)
    yield attainment
    yield overrun
    broken = CounterMetricFamily(
        "quartermaster_queue_promise_broken",
        "First admissions that came after the class's maximum queue time",
        labels=["class"],
    )
    waited = ExpressionWrapper(
        F("admitted_at") - F("request__created_at"), output_field=DurationField()
    )
    for name, seconds in WorkloadClass.objects.filter(max_queue_s__gt=0).values_list(
        "name", "max_queue_s"
    ):
        late = (
            Attempt.objects.filter(number=1, request__workload_class__name=name)
            .annotate(waited=waited)
            .filter(waited__gt=timedelta(seconds=seconds))
            .count()
        )
        broken.add_metric([name], late)
    yield broken


def replica_name() -> str:
    """This web replica: the pod name in Kubernetes (all workers of a pod are one target)."""
    return settings.METRICS_REPLICA or os.environ.get("POD_NAME") or socket.gethostname()


def replica_role(name: str | None = None) -> str:
    """ "leader" if this replica holds (or just took) the metrics lease, else "follower"."""
    name = name or replica_name()
    now = timezone.now()
    until = now + timedelta(seconds=settings.METRICS_LEASE_SECONDS)
    MetricsLease.objects.get_or_create(pk=1)
    taken = (
        MetricsLease.objects.filter(pk=1)
        .filter(Q(holder=name) | Q(holder="") | Q(until__isnull=True) | Q(until__lt=now))
        .update(holder=name, until=until)
    )
    return "leader" if taken else "follower"


class PortalCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield _exporter_gauge("leader")
        yield from self._queue()
        yield from self._scheduler()
        yield from self._capacity()
        yield from self._teams()
        yield from self._outcomes()
        # serving SLOs, class queue limits, the node agent's device readings
        yield from metrics_serving.collect()
        yield from _capacity_planning()

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
            "Seconds from submit to first admission, by team, class and class band",
            labels=["team", "class", "priority"],
        )
        # One GROUP BY with a conditional count per bucket: the scrape never walks attempts.
        waited = ExpressionWrapper(
            F("admitted_at") - F("request__created_at"), output_field=DurationField()
        )
        per_bound = {
            f"le{i}": Count("id", filter=Q(waited__lte=timedelta(seconds=b)))
            for i, b in enumerate(WAIT_BUCKETS)
        }
        wait_rows = (
            Attempt.objects.filter(number=1)
            .annotate(waited=waited)
            .values(
                "request__team__name",
                "request__workload_class__name",
                "request__workload_class__band",
            )
            .annotate(total=Count("id"), seconds=Sum("waited"), **per_bound)
            .order_by()
        )
        for r in sorted(
            wait_rows, key=lambda r: (r["request__team__name"], r["request__workload_class__name"])
        ):
            buckets = [(str(float(b)), float(r[f"le{i}"])) for i, b in enumerate(WAIT_BUCKETS)]
            buckets.append(("+Inf", float(r["total"])))
            total = r["seconds"]
            seconds = total.total_seconds() if isinstance(total, timedelta) else 0.0
            wait.add_metric(
                [
                    r["request__team__name"],
                    r["request__workload_class__name"],
                    str(r["request__workload_class__band"]),
                ],
                buckets,
                max(0.0, seconds),
            )
        yield wait
        yield from _promise()

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
        waits = GaugeMetricFamily(
            "quartermaster_capacity_gpus",
            "Usable GPUs: healthy, not quarantined, on ready, uncordoned, reporting nodes",
            labels=["pool"],
        )
        # The one usable-device rule (portal.models.usable_q): stale nodes count out too.
        usable = Device.objects.usable(timezone.now())
        for r in usable.values("node__pool__name").annotate(n=Count("id")):
            waits.add_metric([r["node__pool__name"]], r["n"])
        yield waits
        heartbeat = GaugeMetricFamily(
            "quartermaster_node_agent_last_heartbeat_timestamp_seconds",
            "Last node agent report",
            labels=["node"],
        )
        for name, beat in Node.objects.filter(last_heartbeat__isnull=False).values_list(
            "name", "last_heartbeat"
        ):
            assert beat is not None  # (filtered on last_heartbeat__isnull=False)
            heartbeat.add_metric([name], beat.timestamp())
        yield heartbeat

    def _teams(self) -> Iterator[Metric]:
        quota = GaugeMetricFamily(
            "quartermaster_team_quota", "Nominal quota in GPUs", labels=["team", "pool"]
        )
        live = Quota.objects.filter(team__retired_at=None)
        for q in live.values("team__name", "pool__name", "nominal_milli"):
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
        # Decisions still in the log plus those pruned from it (DecisionTally): counters never drop.
        counts: dict[tuple[str, str, str, str], int] = defaultdict(int)
        for r in (
            Decision.objects.values("kind", "code", "team__name", "pool__name")
            .annotate(n=Count("id"))
            .order_by()
        ):
            counts[(r["kind"], r["code"], r["team__name"] or "", r["pool__name"] or "")] += r["n"]
        for t in DecisionTally.objects.values_list("kind", "code", "team_name", "pool_name", "n"):
            counts[t[:4]] += t[4]

        def by(kind: str | None, *fields: int) -> dict[tuple[str, ...], int]:
            out: dict[tuple[str, ...], int] = defaultdict(int)
            for key, n in counts.items():
                if kind is None or key[0] == kind:
                    out[tuple(key[f] for f in fields)] += n
            return out

        admitted = CounterMetricFamily(
            "quartermaster_admitted_requests", "Admissions", labels=["team", "pool"]
        )
        for labels, n in sorted(by(Decision.Kind.ADMIT, 2, 3).items()):
            admitted.add_metric(list(labels), n)
        yield admitted
        preempted = CounterMetricFamily(
            "quartermaster_preempted_requests",
            "Preemptions by the scheduler, by the team whose attempt was stopped",
            labels=["team", "reason"],
        )
        for labels, n in sorted(by(Decision.Kind.PREEMPT, 2, 1).items()):
            preempted.add_metric(list(labels), n)
        yield preempted
        evicted = CounterMetricFamily(
            "quartermaster_evicted_requests",
            "Attempts ended by the cluster or preempted, by team",
            labels=["team", "reason"],
        )
        for r in (
            Attempt.objects.filter(state__in=[Attempt.State.NODE_LOST, Attempt.State.PREEMPTED])
            .values("request__team__name", "state")
            .annotate(n=Count("id"))
            .order_by()
        ):
            evicted.add_metric([r["request__team__name"], r["state"]], r["n"])
        yield evicted
        lost = CounterMetricFamily(
            "quartermaster_lost_gpu_seconds",
            "GPU-seconds thrown away by preempted and node-lost attempts: the time since "
            "each one's last checkpoint, or since it started",
            labels=["team", "pool"],
        )
        for r in (
            UsageRecord.objects.filter(lost_gpu_milli_seconds__gt=0)
            .values("team__name", "pool__name")
            .annotate(m=Sum("lost_gpu_milli_seconds"))
            .order_by("team__name", "pool__name")
        ):
            lost.add_metric([r["team__name"], r["pool__name"]], r["m"] / 1000)
        yield lost
        checkpoints = CounterMetricFamily(
            "quartermaster_checkpoints",
            "Checkpoints reported by workloads, by team",
            labels=["team"],
        )
        for r in (
            Attempt.objects.filter(checkpoints__gt=0)
            .values("request__team__name")
            .annotate(n=Sum("checkpoints"))
            .order_by("request__team__name")
        ):
            checkpoints.add_metric([r["request__team__name"]], r["n"])
        yield checkpoints
        decisions = CounterMetricFamily(
            "quartermaster_decisions", "Decisions by kind and reason", labels=["kind", "code"]
        )
        for labels, n in sorted(by(None, 0, 1).items()):
            decisions.add_metric(list(labels), n)
        yield decisions


class FollowerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield _exporter_gauge("follower")


def _capacity_planning() -> Iterator[Metric]:
    """Where pending requests' wait went, pending demand, and nodes being added."""
    now = timezone.now()
    pending = GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
    wait = GaugeMetricFamily(
        "quartermaster_request_wait_seconds",
        "Seconds pending requests have waited so far, summed, by reason "
        "(unschedulable, quota, capacity, provisioning, backoff)",
        labels=["reason", "class", "team", "pool"],
    )
    group = ("workload_class__name", "team__name", "pool__name")
    for row in waits.split_by(pending, group, now):
        labels = [row["workload_class__name"], row["team__name"], row["pool__name"] or "any"]
        for reason in waits.REASONS:
            wait.add_metric([reason, *labels], float(row[reason]))
    yield wait
    oldest = GaugeMetricFamily(
        "quartermaster_request_wait_oldest_seconds",
        "The longest a pending request has been waiting for one reason without a change",
        labels=["reason", "pool"],
    )
    rows = (
        pending.exclude(wait_reason="")
        .filter(wait_since__isnull=False)
        .values("wait_reason", "pool__name")
        .annotate(first=Min("wait_since"))
        .order_by("wait_reason", "pool__name")
    )
    for r in rows:
        seconds = max(0.0, (now - r["first"]).total_seconds())
        oldest.add_metric([r["wait_reason"], r["pool__name"] or "any"], seconds)
    yield oldest
    wanted = GaugeMetricFamily(
        "quartermaster_pending_demand_gpus",
        "GPUs pending requests want, by pool (any: any pool) and device profile",
        labels=["pool", "profile"],
    )
    unfit = GaugeMetricFamily(
        "quartermaster_pending_unfit_gpus",
        "GPUs wanted by pending requests whose shape fits no node that exists",
        labels=["pool", "profile"],
    )
    for d in waits.pending_demand(pending):
        wanted.add_metric([d["pool"], d["profile"]], d["gpus_milli"] / 1000)
        unfit.add_metric([d["pool"], d["profile"]], d["unfit_gpus_milli"] / 1000)
    yield wanted
    yield unfit
    provisioning = GaugeMetricFamily(
        "quartermaster_provisioning_nodes",
        "Nodes autoscaled pools asked for and are still waiting for",
        labels=["pool"],
    )
    for pool, nodes in (
        NodeProvision.objects.filter(state=NodeProvision.State.REQUESTED)
        .values_list("pool__name")
        .annotate(n=Sum("nodes"))
        .order_by("pool__name")
    ):
        provisioning.add_metric([pool], float(nodes))
    yield provisioning


def _exporter_gauge(role: str) -> Metric:
    g = GaugeMetricFamily(
        "quartermaster_metrics_exporter",
        "1 on the web replica that exports the database-derived metrics (the lease holder)",
        labels=["replica_role"],
    )
    g.add_metric([role], 1.0 if role == "leader" else 0.0)
    return g


def metrics_text(role: str | None = None) -> bytes:
    role = role or replica_role()
    registry = CollectorRegistry()
    registry.register(PortalCollector() if role == "leader" else FollowerCollector())
    return generate_latest(registry)


def metrics_response() -> HttpResponse:
    return HttpResponse(metrics_text(), content_type="text/plain; version=0.0.4; charset=utf-8")


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Served by ProbeMiddleware; kept as a view (checking the token the same way, for every
    method) so the URL resolves and reverses, and so that nothing reaches the numbers unchecked."""
    return metrics_guarded(request)


def metrics_token_ok(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    if not token:
        return True
    auth = request.headers.get("Authorization", "")
    return hmac.compare_digest(auth.encode(), f"Bearer {token}".encode())


def metrics_guarded(request: HttpRequest) -> HttpResponse:
    """/metrics for any method: 401 without the token, 405 but for GET and HEAD."""
    if not metrics_token_ok(request):
        return HttpResponse(
            "metrics need a bearer token\n",
            status=401,
            content_type="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(
            "metrics answer GET only\n",
            status=405,
            content_type="text/plain",
            headers={"Allow": "GET, HEAD"},
        )
    return metrics_response()
