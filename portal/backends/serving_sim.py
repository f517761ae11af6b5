"""A synthetic model server: one replica of a simulated serving workload.

Run as `python -m portal.backends.serving_sim --port P --runtime vllm ...`. It imports no Django
(it starts in well under a second) and serves, with the stdlib's http.server:

* `GET /metrics` — real Prometheus exposition with the names the runtime's server uses
  (vLLM, TGI or Triton, `RUNTIME_METRICS`), labelled with team, workload, pool, class and
  model revision (as the chart's PodMonitor relabels them), plus the series dcgm-exporter
  reports for its GPU or MIG instance, with exactly dcgm-exporter's labels
  (`portal.lib.dcgm`: device, pod, namespace, container; no label of ours);
* `GET /health` — 503 until the model is warmed up (`--warmup-s`), then 200: the
  readiness probe of the replica;
* `POST /load?rps=N` — set the offered load (requests per second);
* `POST /v1/completions` — one request through the simulated engine; answers its TTFT.

The engine is a small discrete simulation stepped every `STEP_S`: requests arrive
(Poisson at the offered rate), wait while `--max-batch` run, take a prefill that grows
with the batch, then decode at a per-sequence speed that falls as the batch grows. So
time to first token, end-to-end latency, queue depth and GPU utilization all rise with
load, as on a real server.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from portal.lib import dcgm

STEP_S = 0.05
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024)
#: the series each runtime's server exports, by role (docs/metrics.md lists the queries)
RUNTIME_METRICS = {
    "vllm": {
        "ttft": "vllm:time_to_first_token_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "iteration_tokens": "vllm:iteration_tokens_total",
        "generation_tokens": "vllm:generation_tokens",
    },
    # TGI exports no time to first token: its queue time (before prefill) stands in
    "tgi": {
        "queue_time": "tgi_request_queue_duration",
        "e2e": "tgi_request_duration",
        "running": "tgi_batch_current_size",
        "waiting": "tgi_queue_size",
        "generated": "tgi_request_generated_tokens",
    },
    "triton": {
        "ttft": "nv_inference_first_response_histogram_ms",
        "waiting": "nv_inference_pending_request_count",
        "success": "nv_inference_request_success",
        "exec": "nv_inference_exec_count",
        "e2e_us": "nv_inference_request_duration_us",
    },
}
LABELS = ("team", "workload", "pool", "class", "model_name", "model_revision")
#: the serving container of a replica's pod (portal/k8s/serving.py)
CONTAINER = "main"


def dcgm_labels(labels: dict[str, str]) -> dict[str, str]:
    """What dcgm-exporter in Kubernetes mode labels the replica's GPU series with, from the
    replica's `node`, `namespace`, `pod` and (a MIG instance) `mig_profile`/`mig_instance`."""
    node = labels.get("node", "")
    gpu = labels.get("gpu", "0")
    digest = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()
    out = {
        "gpu": gpu,
        "UUID": f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}",
        "pci_bus_id": f"00000000:{0x18 + int(gpu) if gpu.isdigit() else 0x18:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": labels.get("model", "NVIDIA H100 80GB HBM3"),
        "Hostname": node,
        "DCGM_FI_DRIVER_VERSION": "550.127.05",
        "container": CONTAINER,
        "namespace": labels.get("namespace", ""),
        "pod": labels.get("pod", ""),
    }
    if labels.get("mig_profile"):
        out["GPU_I_PROFILE"] = labels["mig_profile"]
        out["GPU_I_ID"] = labels.get("mig_instance", "1")
    return out


@dataclass
class _Req:
    arrived: float
    started: float = 0.0
    first_token: float = 0.0
    tokens_left: int = 0
    total_tokens: int = 0


class Engine:
    """The simulated engine; `step` advances it by `dt` seconds of wall time."""

    def __init__(
        self,
        runtime: str,
        labels: dict[str, str],
        *,
        max_batch: int,
        rps: float,
        warmup_s: float,
        seed: int = 0,
    ) -> None:
        self.runtime = runtime
        self.max_batch = max_batch
        self.rps = rps
        self.ready_at = time.monotonic() + warmup_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.ttft_scale = 1000.0 if runtime == "triton" else 1.0
        names = RUNTIME_METRICS[runtime]
        self.registry = CollectorRegistry()
        lv = [labels.get(k, "") for k in LABELS]
        reg = self.registry
        self.obs: dict[str, Any] = {}

        def hist(role: str, doc: str, buckets: tuple[float, ...]) -> None:
            if role in names:
                self.obs[role] = Histogram(
                    names[role], doc, LABELS, buckets=buckets, registry=reg
                ).labels(*lv)

        def gauge(role: str, doc: str) -> None:
            if role in names:
                self.obs[role] = Gauge(names[role], doc, LABELS, registry=reg).labels(*lv)

        def counter(role: str, doc: str) -> None:
            if role in names:
                # Triton's counters carry no _total suffix (prometheus_client would add one).
                kind = Gauge if runtime == "triton" else Counter
                self.obs[role] = kind(names[role], doc, LABELS, registry=reg).labels(*lv)

        ms = tuple(b * 1000 for b in LATENCY_BUCKETS)
        hist("ttft", "Time to first token", ms if runtime == "triton" else LATENCY_BUCKETS)
        hist("queue_time", "Request queue duration", LATENCY_BUCKETS)
        hist("e2e", "End-to-end request latency", LATENCY_BUCKETS)
        hist("iteration_tokens", "Tokens per engine step", TOKEN_BUCKETS)
        hist("generated", "Generated tokens per request", TOKEN_BUCKETS)
        gauge("running", "Requests in the running batch")
        gauge("waiting", "Requests waiting to be scheduled")
        counter("generation_tokens", "Generated tokens")
        counter("success", "Successful inference requests")
        counter("exec", "Model executions (batches)")
        counter("e2e_us", "Cumulative request duration, microseconds")
        device = dcgm_labels(labels)
        dnames, dv = tuple(device), list(device.values())
        self.mig = "GPU_I_ID" in device

        def dgauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, dnames, registry=reg).labels(*dv)

        # dcgm-exporter reports no GPU_UTIL for a MIG instance, only the profiling fields
        self.util = None if self.mig else dgauge(dcgm.GPU_UTIL, "GPU utilization (in %)")
        self.gr_active = dgauge(
            dcgm.GR_ENGINE_ACTIVE, "Ratio of time the graphics engine is active"
        )
        self.fb_used = dgauge(dcgm.FB_USED, "Framebuffer memory used (in MiB)")
        self.sm_active = dgauge("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has a warp")
        self.memory_mib = int(labels.get("memory_mib", "81920") or 81920)

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    def submit(self, now: float) -> _Req:
        n = self.rng.randint(64, 192)
        r = _Req(arrived=now, tokens_left=n, total_tokens=n)
        self.waiting.append(r)
        return r

    def step(self, now: float, dt: float) -> None:
        with self.lock:
            if self.ready:
                # Poisson arrivals at the offered rate
                n = 0
                lam = self.rps * dt
                threshold, p = pow(2.718281828, -lam), 1.0
                while True:
                    p *= self.rng.random()
                    if p <= threshold:
                        break
                    n += 1
                for _ in range(n):
                    self.submit(now)
            while self.waiting and len(self.running) < self.max_batch:
                r = self.waiting.popleft()
                r.started = now
                self.running.append(r)
            batch = len(self.running)
            # Prefill and decode both slow down as the batch grows (shared compute).
            prefill_s = 0.04 * (1 + batch / 4)
            per_seq_tps = 120.0 / (1 + batch / 16)
            tokens = 0
            done: list[_Req] = []
            for r in self.running:
                if not r.first_token:
                    if now - r.started >= prefill_s:
                        r.first_token = now
                        self._observe("ttft", (now - r.arrived) * self.ttft_scale)
                        self._observe("queue_time", r.started - r.arrived)
                    continue
                step_tokens = max(1, int(per_seq_tps * dt + self.rng.random()))
                step_tokens = min(step_tokens, r.tokens_left)
                r.tokens_left -= step_tokens
                tokens += step_tokens
                if r.tokens_left <= 0:
                    done.append(r)
            for r in done:
                self.running.remove(r)
                self._observe("e2e", now - r.arrived)
                self._observe("generated", r.total_tokens)
                self._inc("success", 1)
                self._inc("e2e_us", (now - r.arrived) * 1e6)
            if batch:
                self._observe("iteration_tokens", batch)
                self._inc("exec", 1 / max(1, batch))
            if tokens:
                self._inc("generation_tokens", tokens)
            self._set("running", len(self.running))
            self._set("waiting", len(self.waiting))
            util = 0.0 if not self.ready else min(100.0, 100.0 * batch / self.max_batch * 1.15)
            if self.util is not None:
                self.util.set(round(util))
            self.gr_active.set(round(util / 100, 3))
            self.sm_active.set(round(util / 100 * 0.9, 3))
            weights = 0.6 * self.memory_mib if self.ready else 0.2 * self.memory_mib
            self.fb_used.set(int(weights + 0.35 * self.memory_mib * batch / self.max_batch))

    def _observe(self, role: str, value: float) -> None:
        if role in self.obs:
            self.obs[role].observe(value)

    def _inc(self, role: str, value: float) -> None:
        if role in self.obs:
            self.obs[role].inc(value)

    def _set(self, role: str, value: float) -> None:
        if role in self.obs:
            self.obs[role].set(value)

    def metrics(self) -> bytes:
        with self.lock:
            return generate_latest(self.registry)


def _handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return

        def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/metrics":
                self._send(200, engine.metrics(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/health":
                self._send(200 if engine.ready else 503, b"ok" if engine.ready else b"warming up")
            else:
                self._send(404, b"not found")

        def do_POST(self) -> None:
            url = urlparse(self.path)
            if url.path == "/load":
                try:
                    rps = float(parse_qs(url.query).get("rps", [""])[0])
                except ValueError:
                    self._send(400, b"rps: a number")
                    return
                with engine.lock:
                    engine.rps = max(0.0, min(rps, 10_000.0))
                self._send(200, json.dumps({"rps": engine.rps}).encode(), "application/json")
            elif url.path == "/v1/completions":
                if not engine.ready:
                    self._send(503, b"warming up")
                    return
                with engine.lock:
                    r = engine.submit(time.monotonic())
                deadline = time.monotonic() + 30
                while not r.first_token and time.monotonic() < deadline:
                    time.sleep(STEP_S)
                body = {"ttft_s": round(r.first_token - r.arrived, 4) if r.first_token else None}
                self._send(200, json.dumps(body).encode(), "application/json")
            else:
                self._send(404, b"not found")

    return Handler


def serve(engine: Engine, host: str, port: int) -> ThreadingHTTPServer:
    """Start the engine's clock and its HTTP server in threads; returns the server."""
    server = ThreadingHTTPServer((host, port), _handler(engine))
    server.daemon_threads = True

    def clock() -> None:
        last = time.monotonic()
        while True:
            time.sleep(STEP_S)
            now = time.monotonic()
            engine.step(now, now - last)
            last = now

    threading.Thread(target=clock, daemon=True).start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--runtime", choices=sorted(RUNTIME_METRICS), default="vllm")
    p.add_argument("--rps", type=float, default=2.0)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", action="append", default=[], help="key=value, repeatable")
    a = p.parse_args(argv)
    labels = dict(x.split("=", 1) for x in a.label if "=" in x)
    disable_created_metrics()  # type: ignore[no-untyped-call]  # (prometheus_client: unannotated)
    engine = Engine(
        a.runtime, labels, max_batch=a.max_batch, rps=a.rps, warmup_s=a.warmup_s, seed=a.seed
    )
    serve(engine, a.host, a.port)
    parent = os.getppid()
    # A replica lives as long as the portal process that started it (no orphans after
    # the portal stops; the simulated backend starts it again when it is gone).
    while os.getppid() == parent:
        time.sleep(1)


if __name__ == "__main__":
    main()
