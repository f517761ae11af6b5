"""The portal's queries run against a real Prometheus (Debian's
`prometheus`, /usr/bin/prometheus) that scrapes a test serving process on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from portal.backends.serving_sim import Engine, serve
from portal.models import GpuRequest
from portal.services import serving_samples as serving_metrics
from tests.base import make_world, submit_serving

PROMETHEUS = "/usr/bin/prometheus"
RUNTIMES = {4242: "vllm", 4243: "tgi", 4244: "triton"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A test server per runtime (vLLM: request 4242, TGI: 4243, Triton: 4244, all of team
    vision) and Prometheus scraping them every second."""
    assert Path(PROMETHEUS).exists(), "apt-get install -y --no-install-recommends prometheus"
    servers, targets = [], []
    for rid, runtime in RUNTIMES.items():
        labels = {
            "team": "vision",
            "workload": f"qm-{rid}",
            "pool": "h100-mig",
            "class": "inference",
            "model_name": "llama",
            "model_revision": "r1",
        }
        engine = Engine(runtime, labels, max_batch=16, rps=12.0, warmup_s=0.0, seed=1)
        port = _port()
        servers.append(serve(engine, "127.0.0.1", port))
        targets.append(f"'127.0.0.1:{port}'")
    d = tmp_path_factory.mktemp("prometheus")
    (d / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: serving\n"
        f"    static_configs: [{{targets: [{', '.join(targets)}]}}]\n"
    )
    prom_port = _port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={d / 'prometheus.yml'}",
            f"--storage.tsdb.path={d / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.monotonic() + 60
        expr = 'count(rate(vllm:time_to_first_token_seconds_count{workload="qm-4242"}[1m]) > 0)'
        expr += ' and count(rate(nv_inference_request_success{workload="qm-4244"}[1m]) > 0)'
        while time.monotonic() < deadline:
            try:
                q = urllib.request.urlopen(
                    f"{url}/api/v1/query?query={urllib.parse.quote(expr)}", timeout=2
                )
                if json.loads(q.read())["data"]["result"]:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never scraped the test server")
        yield {"url": url}
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for server in servers:
            server.shutdown()


def _serving(w: Any, rid: int) -> GpuRequest:
    req = submit_serving(
        w.bob, w.vision, model_name="llama", model_revision="r1", runtime=RUNTIMES[rid]
    )
    GpuRequest.objects.filter(pk=req.pk).update(id=rid)
    return GpuRequest.objects.get(pk=rid)


@pytest.mark.django_db
@pytest.mark.parametrize("rid", sorted(RUNTIMES))
def test_every_query_of_each_runtime_answers_on_prometheus(stack: dict[str, Any], rid: int) -> None:
    req = _serving(make_world(), rid)
    prom = serving_metrics.Prometheus(stack["url"])
    for name, expr in serving_metrics.queries_for(req).items():
        result = prom.query(expr)
        assert result, f"{RUNTIMES[rid]} {name}: {expr} returned nothing"
        if name != "revision":
            value = float(result[0]["value"][1])
            assert value == value, f"{name} is NaN"  # noqa: PLR0124


@pytest.mark.django_db
def test_the_metrics_api_reads_prometheus(stack: dict[str, Any]) -> None:
    w = make_world()
    req = _serving(w, 4242)
    with override_settings(PROMETHEUS_URL=stack["url"]):
        api = APIClient()
        api.force_authenticate(w.bob)
        r = api.get(f"/api/v1/requests/{req.pk}/metrics/")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["source"] == "prometheus"
    series = body["series"]
    for name in ("ttft_p95_seconds", "batch_size", "queue_depth", "gpu_utilization"):
        values = [v for _, v in series[name] if v is not None]
        assert values, name
    assert all(v > 0 for _, v in series["ttft_p95_seconds"] if v is not None)
    assert series["model_revision"][-1][1] == "r1"


@pytest.mark.django_db
def test_without_prometheus_reachable_the_stored_samples_answer() -> None:
    w = make_world()
    req = submit_serving(w.bob, w.vision, model_name="llama", runtime="tgi")
    with override_settings(PROMETHEUS_URL=f"http://127.0.0.1:{_port()}"):
        m = serving_metrics.request_metrics(req)
    assert m["source"] == "samples"
