"""The exporter's series for serving and utilization (part of `/metrics`, portal/metrics/collector.py).

* `quartermaster_serving_replicas` and `quartermaster_serving_ttft_objective_seconds`:
  each running serving workload, labelled like its servers' series (team, workload,
  pool, class, model_revision);
* `quartermaster_serving_ttft_slo_le{workload,le}` = 1: the bucket of the runtime's
  TTFT histogram that the objective falls on, so the burn-rate rules select the "good"
  requests with `* on (workload, le)` (PromQL cannot compare a label with a value);
* `quartermaster_class_max_queue_seconds{class}`: the queue-age alert's limit per class;
* `quartermaster_device_utilization_ratio` and `quartermaster_device_memory_used_bytes`:
  the node agent's last NVML readings per device (`Device.utilization_pct`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from portal.models import Attempt, Device, GpuRequest, WorkloadClass

#: prometheus_client's own formatting of a bound (`le` label), typed (the client is not annotated)
_go_float: Callable[[float], str] = floatToGoString

#: the TTFT histogram buckets of vLLM (and of the simulated servers), seconds
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.025,
    0.04,
    0.05,
    0.06,
    0.075,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
)
SERVING_LABELS = ["team", "workload", "pool", "class", "model_revision"]


def objective_bucket(objective_s: float) -> float:
    """The largest bucket bound at or below the objective: "good" is then never overcounted."""
    below = [b for b in TTFT_BUCKETS if b <= objective_s + 1e-9]
    return below[-1] if below else TTFT_BUCKETS[0]


def le_label(objective_s: float, runtime: str = "vllm") -> str:
    bound = objective_bucket(objective_s)
    # Triton's first-response histogram is in milliseconds
    return _go_float(bound * 1000 if runtime == "triton" else bound)


def collect() -> Iterator[Metric]:
    replicas = GaugeMetricFamily(
        "quartermaster_serving_replicas",
        "Replicas of a running serving workload",
        labels=SERVING_LABELS,
    )
    objective = GaugeMetricFamily(
        "quartermaster_serving_ttft_objective_seconds",
        "TTFT p95 objective of a serving workload: its class's latency objective",
        labels=SERVING_LABELS,
    )
    slo_bucket = GaugeMetricFamily(
        "quartermaster_serving_ttft_slo_le",
        "1 on the TTFT histogram bucket (le) that a serving workload's objective falls on",
        labels=["team", "workload", "class", "le"],
    )
    rows = (
        Attempt.objects.filter(
            state__in=Attempt.ACTIVE_STATES, request__kind=GpuRequest.Kind.SERVING
        )
        .values_list(
            "request_id",
            "request__team__name",
            "pool__name",
            "request__workload_class__name",
            "request__workload_class__latency_objective_ms",
            "request__model_revision",
            "request__runtime",
            "request__pods",
        )
        .order_by("request_id")
    )
    for rid, team, pool, cls, objective_ms, revision, runtime, pods in rows:
        labels = [team, f"qm-{rid}", pool, cls, revision]
        replicas.add_metric(labels, pods)
        if objective_ms:
            objective.add_metric(labels, objective_ms / 1000)
            slo_bucket.add_metric(
                [team, f"qm-{rid}", cls, le_label(objective_ms / 1000, runtime)], 1
            )
    yield replicas
    yield objective
    yield slo_bucket

    limit = GaugeMetricFamily(
        "quartermaster_class_max_queue_seconds",
        "A class's maximum queue time (classes that set one)",
        labels=["class"],
    )
    for name, seconds in WorkloadClass.objects.filter(max_queue_s__gt=0).values_list(
        "name", "max_queue_s"
    ):
        limit.add_metric([name], seconds)
    yield limit

    util = GaugeMetricFamily(
        "quartermaster_device_utilization_ratio",
        "GPU utilization the node agent last read through NVML (0-1)",
        labels=["node", "pool", "gpu"],
    )
    memory = GaugeMetricFamily(
        "quartermaster_device_memory_used_bytes",
        "GPU memory in use as the node agent last read it",
        labels=["node", "pool", "gpu"],
    )
    for node, pool, index, pct, mib in (
        Device.objects.filter(reported_at__isnull=False)
        .values_list(
            "node__name", "node__pool__name", "index", "utilization_pct", "memory_used_mib"
        )
        .order_by("node__name", "index")
    ):
        util.add_metric([node, pool, str(index)], pct / 100)
        memory.add_metric([node, pool, str(index)], mib * 1024 * 1024)
    yield util
    yield memory
