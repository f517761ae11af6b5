"""The request path of serving workloads: TTFT, batch size, queue depth, tokens/s, beside
GPU utilization and memory, with the model revision (docs/metrics.md).

Two sources, one shape of answer (`request_metrics`):

* **Prometheus** (`PROMETHEUS_URL` set): range queries through its HTTP API, with the
  names each runtime's server exports (`QUERIES`, selected by the `workload` label the
  chart's PodMonitor relabels from the pods) and dcgm-exporter's device series
  (`device_queries`, selected by the namespace and pod names of the request's workloads:
  dcgm-exporter labels a series with the pod holding the GPU, nothing of ours);
* **the portal's own samples** (no Prometheus): `sample_serving` reads each replica's
  /metrics (the simulated cluster's servers, `portal.backends.serving_sim`) and stores one
  `ServingSample` per workload per call, from the histogram increments since the last
  call (kept in the cache), as Prometheus's `rate()` would.
"""

from __future__ import annotations

import logging
import math
import urllib.error
import urllib.request
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from portal.lib import dcgm
from portal.lib.prometheus import Prometheus, PrometheusError
from portal.models import Attempt, GpuRequest, RevisionChange, ServingSample
from portal.services.prometheus import client as prometheus

log = logging.getLogger(__name__)

#: the series of `GET /api/v1/requests/<id>/metrics/`, in order
SERIES = (
    "ttft_p50_seconds",
    "ttft_p95_seconds",
    "batch_size",
    "queue_depth",
    "tokens_per_second",
    "gpu_utilization",
    "gpu_memory_used_mib",
)
WINDOWS = {"1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600}

# PromQL per runtime; {sel} is the workload's label selector. TGI exports no TTFT: its
# queue time (before the prefill) is the nearest, a lower bound. Batch size is vLLM's
# mean tokens per engine step (decode steps carry one token per running sequence).
QUERIES: dict[str, dict[str, str]] = {
    "vllm": {
        "ttft_p50_seconds": "histogram_quantile(0.5, sum by (le) "
        "(rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[1m])))",
        "ttft_p95_seconds": "histogram_quantile(0.95, sum by (le) "
        "(rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[1m])))",
        "batch_size": "sum(rate(vllm:iteration_tokens_total_sum{{{sel}}}[1m])) / "
        "sum(rate(vllm:iteration_tokens_total_count{{{sel}}}[1m]))",
        "queue_depth": "sum(vllm:num_requests_waiting{{{sel}}})",
        "tokens_per_second": "sum(rate(vllm:generation_tokens_total{{{sel}}}[1m]))",
        "revision": "count by (model_revision) (vllm:num_requests_running{{{sel}}})",
    },
    "tgi": {
        "ttft_p50_seconds": "histogram_quantile(0.5, sum by (le) "
        "(rate(tgi_request_queue_duration_bucket{{{sel}}}[1m])))",
        "ttft_p95_seconds": "histogram_quantile(0.95, sum by (le) "
        "(rate(tgi_request_queue_duration_bucket{{{sel}}}[1m])))",
        "batch_size": "sum(tgi_batch_current_size{{{sel}}})",
        "queue_depth": "sum(tgi_queue_size{{{sel}}})",
        "tokens_per_second": "sum(rate(tgi_request_generated_tokens_sum{{{sel}}}[1m]))",
        "revision": "count by (model_revision) (tgi_queue_size{{{sel}}})",
    },
    "triton": {
        "ttft_p50_seconds": "histogram_quantile(0.5, sum by (le) "
        "(rate(nv_inference_first_response_histogram_ms_bucket{{{sel}}}[1m]))) / 1000",
        "ttft_p95_seconds": "histogram_quantile(0.95, sum by (le) "
        "(rate(nv_inference_first_response_histogram_ms_bucket{{{sel}}}[1m]))) / 1000",
        "batch_size": "sum(rate(nv_inference_request_success{{{sel}}}[1m])) / "
        "sum(rate(nv_inference_exec_count{{{sel}}}[1m]))",
        "queue_depth": "sum(nv_inference_pending_request_count{{{sel}}})",
        "revision": "count by (model_revision) (nv_inference_pending_request_count{{{sel}}})",
    },
}


def device_queries(dsel: str) -> dict[str, str]:
    """dcgm-exporter's series of a request; `dsel` selects its pods (`dcgm.pods_selector`)."""
    return {
        "gpu_utilization": f"avg({dcgm.utilization(dsel)})",
        "gpu_memory_used_mib": f"sum({dcgm.FB_USED}{{{dsel}}})",
    }


#: what the sampler reads from a replica's /metrics, per runtime and role
SCRAPE_NAMES = {
    "vllm": {
        "ttft": "vllm:time_to_first_token_seconds",
        "iteration": "vllm:iteration_tokens_total",
        "waiting": "vllm:num_requests_waiting",
        "running": "vllm:num_requests_running",
        "tokens": "vllm:generation_tokens",
    },
    "tgi": {
        "ttft": "tgi_request_queue_duration",
        "waiting": "tgi_queue_size",
        "running": "tgi_batch_current_size",
        "tokens_hist": "tgi_request_generated_tokens",
    },
    "triton": {
        "ttft_ms": "nv_inference_first_response_histogram_ms",
        "waiting": "nv_inference_pending_request_count",
        "success": "nv_inference_request_success",
        "exec": "nv_inference_exec_count",
    },
}


def selector(req: GpuRequest) -> str:
    """The runtime's series of a request: the PodMonitor's relabelled `workload`."""
    return f'workload="qm-{req.pk}"'


def device_selector(req: GpuRequest) -> str:
    """dcgm-exporter's series of a request: its attempts' pods, by namespace and name."""
    attempts = list(
        Attempt.objects.filter(request=req)
        .order_by("-pk")
        .values_list("namespace", "workload_name")
    )
    namespace = attempts[0][0] if attempts else req.team.namespace
    return dcgm.pods_selector(namespace, [name for ns, name in attempts if ns == namespace])


def queries_for(req: GpuRequest) -> dict[str, str]:
    """The PromQL of every series of a workload (its runtime's names, dcgm-exporter's)."""
    sel, dsel = selector(req), device_selector(req)
    per_runtime = QUERIES.get(req.runtime or "vllm", QUERIES["vllm"])
    out = {k: v.format(sel=sel) for k, v in per_runtime.items()}
    out.update(device_queries(dsel))
    return out


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def request_metrics(
    req: GpuRequest, *, window_s: int = 3600, now: datetime | None = None
) -> dict[str, Any]:
    """The request path of a serving workload over the last `window_s`: every `SERIES` as
    [[epoch seconds, value or null], …], the model revision over time, its revision changes,
    the TTFT SLO and the health indicator."""
    now = now or timezone.now()
    start = now - timedelta(seconds=window_s)
    step = max(15, window_s // 240)
    source = "samples"
    series: dict[str, list[list[Any]]] = {k: [] for k in SERIES}
    revision: list[list[Any]] = []
    prom = prometheus()
    if prom is not None:
        try:
            series, revision = _from_prometheus(prom, req, start, now, step)
            source = "prometheus"
        except PrometheusError as exc:
            log.warning("Prometheus unavailable, using stored samples: %s", exc)
    if source == "samples":
        series, revision = _from_samples(req, start)
    objective = (req.workload_class.latency_objective_ms or 0) / 1000
    return {
        "request": req.pk,
        "source": source,
        "window_s": window_s,
        "step_s": step,
        "series": {**series, "model_revision": revision},
        "revision_changes": [
            {"at": c.at.timestamp(), "before": c.before, "after": c.after}
            for c in RevisionChange.objects.filter(request=req, at__gte=start)
        ],
        "slo": slo(series.get("ttft_p95_seconds", []), objective),
        "health": health(series),
    }


def _from_prometheus(
    prom: Prometheus, req: GpuRequest, start: datetime, end: datetime, step: int
) -> tuple[dict[str, list[list[Any]]], list[list[Any]]]:
    q = queries_for(req)
    series: dict[str, list[list[Any]]] = {}
    for name in SERIES:
        if name not in q:
            series[name] = []
            continue
        result = prom.query_range(q[name], start, end, step)
        points = result[0]["values"] if result else []
        series[name] = [[float(t), _finite(v)] for t, v in points]
    by_time: dict[float, list[str]] = {}
    for r in prom.query_range(q["revision"], start, end, step):
        rev = r["metric"].get("model_revision", "")
        for t, _ in r["values"]:
            by_time.setdefault(float(t), []).append(rev)
    revision = [[t, ",".join(sorted(revs))] for t, revs in sorted(by_time.items())]
    return series, revision


def _from_samples(
    req: GpuRequest, start: datetime
) -> tuple[dict[str, list[list[Any]]], list[list[Any]]]:
    rows = list(ServingSample.objects.filter(request=req, at__gte=start).order_by("at")[:2000])
    series: dict[str, list[list[Any]]] = {k: [] for k in SERIES}
    fields = {
        "ttft_p50_seconds": "ttft_p50_seconds",
        "ttft_p95_seconds": "ttft_p95_seconds",
        "batch_size": "batch_size",
        "queue_depth": "queue_depth",
        "tokens_per_second": "tokens_per_second",
        "gpu_utilization": "gpu_utilization",
        "gpu_memory_used_mib": "gpu_memory_used_mib",
    }
    for row in rows:
        t = row.at.timestamp()
        for name, field in fields.items():
            series[name].append([t, getattr(row, field)])
    revision = [[r.at.timestamp(), r.model_revision] for r in rows]
    return series, revision


def _values(points: Iterable[list[Any]]) -> list[float]:
    return [p[1] for p in points if p[1] is not None]


def slo(ttft_p95: list[list[Any]], objective_s: float) -> dict[str, Any]:
    """The class's latency objective as a TTFT p95 SLO: the share of points within it."""
    values = _values(ttft_p95)
    if not objective_s:
        return {"objective_seconds": None, "compliance": None, "met": None}
    within = sum(1 for v in values if v <= objective_s)
    compliance = within / len(values) if values else None
    return {
        "objective_seconds": objective_s,
        "compliance": compliance,
        "met": None if compliance is None else compliance >= 0.95,
    }


def health(series: dict[str, list[list[Any]]]) -> dict[str, Any]:
    """High GPU utilization with rising latency: the GPU is saturated, not healthy.

    Rising = the TTFT p95 of the last third of the window is at least 1.5× the first
    third's; high = mean GPU utilization of the last third ≥ 85 %."""
    ttft = _values(series.get("ttft_p95_seconds", []))
    util = _values(series.get("gpu_utilization", []))
    if len(ttft) < 3 or not util:
        return {"status": "unknown", "message": "not enough samples yet"}
    third = max(1, len(ttft) // 3)
    early = sum(ttft[:third]) / third
    late = sum(ttft[-third:]) / third
    recent_util = util[-max(1, len(util) // 3) :]
    busy = sum(recent_util) / len(recent_util)
    rising = early > 0 and late >= 1.5 * early
    if busy >= 85 and rising:
        return {
            "status": "saturated",
            "message": f"GPU {busy:.0f} % busy and TTFT p95 rose from {early:.2f} s to "
            f"{late:.2f} s: add replicas or shed load",
        }
    return {"status": "ok", "message": f"GPU {busy:.0f} % busy, TTFT p95 {late:.2f} s"}


# ---------------------------------------------------------------------------------------
# The portal's own samples (no Prometheus)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile over cumulative (upper bound, count) buckets."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def parse_scrape(text: str, runtime: str) -> dict[str, Any]:
    """The cumulative numbers the sampler needs from one replica's /metrics."""
    names = SCRAPE_NAMES.get(runtime, SCRAPE_NAMES["vllm"])
    out: dict[str, Any] = {}
    dcgm_values: dict[str, float] = {}
    # the revision is the runtime's series' label (dcgm-exporter knows nothing of it)
    role_names = set(names.values())
    for fam in text_string_to_metric_families(text):
        for role, name in names.items():
            if fam.name != name:
                continue
            if role in ("ttft", "ttft_ms", "iteration", "tokens_hist"):
                buckets: dict[float, float] = {}
                s = c = 0.0
                for sample in fam.samples:
                    if sample.name.endswith("_bucket"):
                        le = float(sample.labels["le"])
                        buckets[le] = buckets.get(le, 0.0) + sample.value
                    elif sample.name.endswith("_sum"):
                        s += sample.value
                    elif sample.name.endswith("_count"):
                        c += sample.value
                out[role] = {"buckets": buckets, "sum": s, "count": c}
            else:
                out[role] = sum(x.value for x in fam.samples)
        if fam.name in (dcgm.GPU_UTIL, dcgm.GR_ENGINE_ACTIVE, dcgm.FB_USED) and fam.samples:
            values = [x.value for x in fam.samples]
            dcgm_values[fam.name] = (
                sum(values) if fam.name == dcgm.FB_USED else sum(values) / len(values)
            )
        if role_names & {fam.name, fam.name + "_total"}:
            for x in fam.samples:
                if "model_revision" in x.labels:
                    out["revision"] = x.labels["model_revision"]
    util = dcgm_values.get(dcgm.GPU_UTIL)
    if util is None and dcgm.GR_ENGINE_ACTIVE in dcgm_values:
        util = 100 * dcgm_values[dcgm.GR_ENGINE_ACTIVE]  # a MIG instance: no GPU_UTIL
    out["util"] = util
    out["fb_used"] = dcgm_values.get(dcgm.FB_USED)
    return out


def _merge(scrapes: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the replicas' numbers (histograms bucket by bucket); utilization is averaged."""
    merged: dict[str, Any] = {}
    utils = [s["util"] for s in scrapes if s.get("util") is not None]
    for s in scrapes:
        for role, v in s.items():
            if role in ("util", "revision"):
                continue
            if isinstance(v, dict):
                m = merged.setdefault(role, {"buckets": {}, "sum": 0.0, "count": 0.0})
                for le, n in v["buckets"].items():
                    m["buckets"][le] = m["buckets"].get(le, 0.0) + n
                m["sum"] += v["sum"]
                m["count"] += v["count"]
            elif v is not None:
                merged[role] = merged.get(role, 0.0) + v
    merged["util"] = sum(utils) / len(utils) if utils else None
    merged["revisions"] = sorted({s.get("revision", "") for s in scrapes})
    return merged


def _delta_hist(now: dict[str, Any] | None, before: dict[str, Any] | None) -> dict[str, Any] | None:
    if not now:
        return None
    if not before or before["count"] > now["count"]:
        return now  # first look, or a replica restarted: its counts since it started
    return {
        "buckets": {le: n - before["buckets"].get(le, 0.0) for le, n in now["buckets"].items()},
        "sum": now["sum"] - before["sum"],
        "count": now["count"] - before["count"],
    }


def _rate(now: float | None, before: float | None, seconds: float) -> float | None:
    if now is None or before is None or seconds <= 0 or now < before:
        return None
    return (now - before) / seconds


def sample_from(
    req: GpuRequest, merged: dict[str, Any], previous: dict[str, Any] | None, at: datetime
) -> ServingSample:
    """One `ServingSample` from the replicas' merged numbers and the previous call's."""
    prev = previous or {}
    seconds = at.timestamp() - float(prev.get("at", 0.0)) if prev else 0.0
    ttft_role = "ttft_ms" if "ttft_ms" in merged else "ttft"
    ttft = _delta_hist(merged.get(ttft_role), prev.get(ttft_role))
    scale = 1000.0 if ttft_role == "ttft_ms" else 1.0
    p50 = p95 = None
    if ttft and ttft["count"] > 0:
        b = list(ttft["buckets"].items())
        q50, q95 = histogram_quantile(0.5, b), histogram_quantile(0.95, b)
        p50 = None if q50 is None else q50 / scale
        p95 = None if q95 is None else q95 / scale
    batch = None
    it = _delta_hist(merged.get("iteration"), prev.get("iteration"))
    if it and it["count"] > 0:
        batch = it["sum"] / it["count"]
    elif "success" in merged:
        done = _rate(merged.get("success"), prev.get("success"), seconds)
        execs = _rate(merged.get("exec"), prev.get("exec"), seconds)
        batch = done / execs if done is not None and execs else None
    elif merged.get("running") is not None:
        batch = merged["running"]
    tokens = _rate(merged.get("tokens"), prev.get("tokens"), seconds)
    if tokens is None and merged.get("tokens_hist"):
        h = merged["tokens_hist"]
        before = (prev.get("tokens_hist") or {}).get("sum")
        tokens = _rate(h["sum"], before, seconds)
    return ServingSample(
        request=req,
        at=at,
        model_revision=",".join(r for r in merged.get("revisions", []) if r) or req.model_revision,
        ttft_p50_seconds=p50,
        ttft_p95_seconds=p95,
        batch_size=batch,
        queue_depth=merged.get("waiting"),
        running=merged.get("running"),
        tokens_per_second=tokens,
        gpu_utilization=merged.get("util"),
        gpu_memory_used_mib=merged.get("fb_used"),
    )


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - a replica we run
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def sample_serving(now: datetime | None = None) -> int:
    """Read every running serving workload's replicas and store one sample each; returns
    how many were stored: the simulated cluster's server processes, or on Kubernetes each
    ready replica pod's metrics port (the portal's pods reach pod IPs)."""
    from portal.backends import get_backend

    if settings.PROMETHEUS_URL and settings.CLUSTER_BACKEND == "kubernetes":
        return 0  # Prometheus scrapes the replicas; the pages read it
    backend = get_backend()
    replicas_of = getattr(backend, "serving_replicas", None)
    if replicas_of is None:
        return 0
    now = now or timezone.now()
    stored = 0
    attempts = Attempt.objects.filter(
        state__in=[Attempt.State.ADMITTED, Attempt.State.RUNNING],
        request__kind=GpuRequest.Kind.SERVING,
    ).select_related("request", "request__workload_class")
    for attempt in attempts:
        req = attempt.request
        scrapes = []
        for replica in replicas_of(attempt.workload_name, attempt.namespace, req.pods):
            host = replica.get("host", "127.0.0.1")
            text = _scrape(f"http://{host}:{replica['port']}/metrics")
            if text is not None:
                scrapes.append(parse_scrape(text, req.runtime))
        if not scrapes:
            continue
        merged = _merge(scrapes)
        key = f"serving-scrape:{attempt.pk}"
        sample = sample_from(req, merged, cache.get(key), now)
        sample.save()
        cache.set(key, {**merged, "at": now.timestamp()}, timeout=3600)
        stored += 1
    return stored


def serving_prune(now: datetime | None = None) -> int:
    cutoff = (now or timezone.now()) - timedelta(days=settings.SERVING_SAMPLE_DAYS)
    return int(ServingSample.objects.filter(at__lt=cutoff).delete()[0])
