"""docs/metrics.md, generated from code: every series, its labels, its meaning, which
alert uses it. `python manage.py metrics_catalog` writes it; `--check` fails when the
file is stale (CI runs the check through tests/portal/metrics/test_metric_catalog.py).

Sources, all read from the code that produces or queries the series:

* the portal's exporter (`portal.metrics.collector.PortalCollector`, names, types, labels, help);
* the serving runtimes' series as the simulated servers export them
  (`portal.backends.serving_sim.RUNTIME_METRICS`, the same names as vLLM, TGI and Triton) and the
  portal's queries of them (`portal.services.serving_samples.QUERIES`, `DEVICE_QUERIES`);
* the series of `GET /api/v1/requests/<id>/metrics/` (`portal.services.serving_samples.SERIES`);
* the alerts of charts/quartermaster/templates/prometheusrule.yaml, by the names their
  expressions mention.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from portal.backends import serving_sim
from portal.lib import dcgm
from portal.metrics.collector import PortalCollector
from portal.services import serving_samples

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
RULES = ROOT / "charts" / "quartermaster" / "templates" / "prometheusrule.yaml"

#: what the runtime and device series mean (their servers document them; one line here)
EXTERNAL_MEANING = {
    "vllm:time_to_first_token_seconds": "histogram: seconds from arrival to the first token",
    "vllm:e2e_request_latency_seconds": "histogram: seconds from arrival to the last token",
    "vllm:num_requests_running": "gauge: sequences in the running batch",
    "vllm:num_requests_waiting": "gauge: requests queued for the batch",
    "vllm:iteration_tokens_total": "histogram: tokens per engine step (decode: the batch size)",
    "vllm:generation_tokens_total": "counter: generated tokens",
    "tgi_request_queue_duration": "histogram: seconds queued before the prefill "
    "(TGI exports no TTFT; this lower bound stands in)",
    "tgi_request_duration": "histogram: seconds per request",
    "tgi_batch_current_size": "gauge: the running batch",
    "tgi_queue_size": "gauge: requests queued",
    "tgi_request_generated_tokens": "histogram: tokens generated per request",
    "nv_inference_first_response_histogram_ms": "histogram: milliseconds to the first response",
    "nv_inference_pending_request_count": "gauge: requests waiting",
    "nv_inference_request_success": "counter: successful requests",
    "nv_inference_exec_count": "counter: model executions (batches)",
    "nv_inference_request_duration_us": "counter: cumulative request microseconds",
    "DCGM_FI_DEV_GPU_UTIL": "gauge: GPU utilization, % (dcgm-exporter)",
    "DCGM_FI_DEV_FB_USED": "gauge: framebuffer memory used, MiB (dcgm-exporter)",
    "DCGM_FI_PROF_SM_ACTIVE": "gauge: share of cycles an SM has a warp resident (dcgm-exporter)",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge: share of time the graphics engine is active, 0..1 "
    "(dcgm-exporter; stands in for GPU_UTIL on MIG instances)",
}
API_MEANING = {
    "ttft_p50_seconds": "median time to first token over 1 min",
    "ttft_p95_seconds": "95th percentile time to first token over 1 min (the SLO's measure)",
    "batch_size": "mean sequences per engine step",
    "queue_depth": "requests waiting for the batch, all replicas",
    "tokens_per_second": "generated tokens per second, all replicas",
    "gpu_utilization": "mean GPU utilization of the replicas, %",
    "gpu_memory_used_mib": "GPU memory used by the replicas, MiB",
}
SERVING_LABELS = "team, workload, pool, class, model_name, model_revision"
SEL = 'workload="qm-<id>"'
#: the request's pods as dcgm-exporter labels them (attempt workloads `qm-<id>-<n>`)
DSEL = dcgm.pods_selector("<team namespace>", ["qm-<id>-<n>"])


def _alerts() -> dict[str, str]:
    """alert name -> its expression text (template expressions left in)."""
    text = RULES.read_text()
    out: dict[str, str] = {}
    blocks = re.split(r"\n\s*- alert: ", text)
    for block in blocks[1:]:
        name, _, rest = block.partition("\n")
        expr = rest.split("annotations:", 1)[0]
        names = [name.strip()]
        if "{{" in name:
            # alerts made in a range over dicts: their names sit in the range's list
            head = blocks[blocks.index(block) - 1].rsplit("{{- range", 1)[-1]
            names = re.findall(r'"name" "([A-Za-z]+)"', head)
        for n in names:
            out[n] = expr
    return out


def _used_by(name: str, alerts: dict[str, str]) -> str:
    pattern = re.compile(rf"(?<![A-Za-z0-9_:]){re.escape(name)}(_bucket|_count|_sum|_total)?\b")
    used = sorted(a for a, expr in alerts.items() if pattern.search(expr))
    return ", ".join(used) or "—"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    alerts = _alerts()
    lines = [
        "# Metrics",
        "",
        "<!-- Generated by `python manage.py metrics_catalog` from portal/metrics/catalog.py;"
        " do not edit. -->",
        "",
        "Every series Quartermaster exports, reads or answers, with its labels, its meaning",
        "and the alerts (charts/quartermaster, PrometheusRule) that use it. The tests fail",
        "when this page is stale: run `python manage.py metrics_catalog` after changing",
        "a series or an alert.",
        "",
        "## The portal's exporter (`/metrics`)",
        "",
        "| Series | Type | Labels | Meaning | Alerts |",
        "|---|---|---|---|---|",
    ]
    for fam in sorted(_families(), key=lambda f: f.name):
        exposed = fam.name + ("_total" if isinstance(fam, CounterMetricFamily) else "")
        kind = (
            "counter"
            if isinstance(fam, CounterMetricFamily)
            else "histogram"
            if isinstance(fam, HistogramMetricFamily)
            else "gauge"
        )
        labels = ", ".join(getattr(fam, "_labelnames", ())) or "—"
        lines.append(
            f"| `{exposed}` | {kind} | {labels} | {_cell(fam.documentation)} | "
            f"{_used_by(fam.name, alerts)} |"
        )
    lines += [
        "",
        "## Serving runtimes and devices (scraped from the replicas and dcgm-exporter)",
        "",
        f"Every runtime series carries {SERVING_LABELS} (the pod labels of the Deployment",
        "on Kubernetes, relabelled; the simulated servers set them). DCGM series carry",
        "only dcgm-exporter's labels: "
        + ", ".join(f"`{lab}`" for lab in dcgm.DEVICE_LABELS + dcgm.POD_LABELS)
        + ", and on a MIG instance "
        + ", ".join(f"`{lab}`" for lab in dcgm.MIG_LABELS)
        + "; the portal selects a request's by `namespace` and `pod`.",
        "",
        "| Runtime | Series | Meaning | Alerts |",
        "|---|---|---|---|",
    ]
    for runtime, names in serving_sim.RUNTIME_METRICS.items():
        for role, name in names.items():
            exposed = name + ("_total" if role == "generation_tokens" else "")
            meaning = EXTERNAL_MEANING.get(exposed, EXTERNAL_MEANING.get(name, ""))
            lines.append(
                f"| {runtime} | `{exposed}` | {_cell(meaning)} | {_used_by(exposed, alerts)} |"
            )
    for name in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_PROF_SM_ACTIVE",
    ):
        lines.append(
            f"| device | `{name}` | {_cell(EXTERNAL_MEANING[name])} | {_used_by(name, alerts)} |"
        )
    lines += [
        "",
        "## The request path (`GET /api/v1/requests/<id>/metrics/`)",
        "",
        "With `PROMETHEUS_URL` set, each series is a range query (below, per runtime,",
        "for request `<id>`); without it, the portal's own samples of",
        "the replicas' /metrics (`ServingSample`, every 15 s). `model_revision` is the",
        "revision (or revisions, during a rollover) serving at each point.",
        "",
        "| Series | Meaning | vLLM | TGI | Triton |",
        "|---|---|---|---|---|",
    ]
    for name in serving_samples.SERIES:
        queries = []
        for runtime in ("vllm", "tgi", "triton"):
            q = serving_samples.QUERIES[runtime].get(name, "").format(sel=SEL)
            q = q or serving_samples.device_queries(DSEL).get(name, "")
            queries.append(f"`{_cell(q)}`" if q else "—")
        lines.append(f"| `{name}` | {API_MEANING[name]} | {' | '.join(queries)} |")
    lines += [
        "| `model_revision` | the revision serving | "
        + " | ".join(
            f"`{_cell(serving_samples.QUERIES[r]['revision'].format(sel=SEL))}`"
            for r in ("vllm", "tgi", "triton")
        )
        + " |",
        "",
        "## Alerts",
        "",
        "| Alert | Series it reads |",
        "|---|---|",
    ]
    for alert, expr in sorted(alerts.items()):
        found = sorted(
            set(
                re.findall(
                    r"\b(?:quartermaster_[a-z_]+|DCGM_[A-Z_]+|kube_[a-z_]+|nv_inference_[a-z_]+)",
                    expr,
                )
            )
            | set(re.findall(r"vllm:[a-z_]+", expr))
        )
        lines.append(f"| {alert} | {', '.join(f'`{n}`' for n in found) or '—'} |")
    return "\n".join(lines) + "\n"


def _families() -> list[Metric]:
    """The exporter's families (with no rows, each is still declared with its labels)."""
    return list(PortalCollector().collect())
