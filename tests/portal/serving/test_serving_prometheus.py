"""The portal's queries run against a real Prometheus (Debian's
`prometheus`, /usr/bin/prometheus) that scrapes test serving processes on loopback: their
runtime series as the chart's PodMonitor relabels them, their GPU series with exactly
dcgm-exporter's labels (a whole GPU for vLLM and TGI, a MIG instance for Triton)."""

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
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from portal.backends.serving_sim import Engine, dcgm_labels, serve
from portal.lib import dcgm
from portal.lib.prometheus import Prometheus
from portal.models import Attempt, GpuRequest, Node, Pool
from portal.services import serving_samples as serving_metrics
from portal.services import utilization
from tests.base import make_world, submit_serving

PROMETHEUS = "/usr/bin/prometheus"
RUNTIMES = {4242: "vllm", 4243: "tgi", 4244: "triton"}
#: where each runs: (node, MIG profile or "" for a whole GPU)
PLACES = {4242: ("h100-01", ""), 4243: ("h100-01", ""), 4244: ("h100-02", "1g.10gb")}


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
            "node": PLACES[rid][0],
            "namespace": "qm-vision",
            "pod": f"qm-{rid}-1-x7k2p",
            "gpu": str(rid - 4242),
            "mig_profile": PLACES[rid][1],
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
        # as dcgm-exporter's ServiceMonitor must: keep the exporter's pod/namespace labels
        "    honor_labels: true\n"
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
        # every runtime's server scraped at least twice (a rate needs two samples): under
        # load the three targets are not scraped together
        expr = 'count(rate(vllm:time_to_first_token_seconds_count{workload="qm-4242"}[1m]) > 0)'
        expr += ' and count(rate(tgi_request_queue_duration_count{workload="qm-4243"}[1m]) > 0)'
        expr += ' and count(rate(nv_inference_request_success{workload="qm-4244"}[1m]) > 0)'
        expr += " and count(DCGM_FI_PROF_GR_ENGINE_ACTIVE)"
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
    req = GpuRequest.objects.get(pk=rid)
    Attempt.objects.create(
        request=req,
        number=1,
        pool=Pool.objects.get(name="h100-mig"),
        workload_name=f"qm-{rid}-1",
        namespace=w.vision.namespace,
        gpus_milli=1000,
        admitted_at=timezone.now(),
    )
    return req


@pytest.mark.django_db
@pytest.mark.parametrize("rid", sorted(RUNTIMES))
def test_every_query_of_each_runtime_answers_on_prometheus(stack: dict[str, Any], rid: int) -> None:
    req = _serving(make_world(), rid)
    prom = Prometheus(stack["url"])
    for name, expr in serving_metrics.queries_for(req).items():
        assert not dcgm.foreign_labels(expr), expr
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


def test_the_test_exporters_carry_exactly_dcgm_exporters_labels(stack: dict[str, Any]) -> None:
    prom = Prometheus(stack["url"])
    for series in prom.query('{__name__=~"DCGM_.+"}'):
        labels = set(series["metric"]) - {"__name__", "job", "instance"}
        mig = "GPU_I_ID" in labels
        expected = set(dcgm.LABELS) - (set() if mig else set(dcgm.MIG_LABELS))
        assert labels == expected, series["metric"]
        assert series["metric"]["__name__"] != dcgm.GPU_UTIL or not mig  # no GPU_UTIL on MIG


@pytest.mark.django_db
def test_mig_utilization_shows_on_the_history_page_when_prometheus_is_set(
    stack: dict[str, Any],
) -> None:
    w = make_world()
    mig = _serving(w, 4244)  # a MIG instance: dcgm-exporter reports no GPU_UTIL for it
    node = Node.objects.get(name=PLACES[4244][0])
    assert dcgm_labels({"mig_profile": "1g.10gb"})["GPU_I_PROFILE"] == "1g.10gb"
    # without Prometheus: the node agent's NVML samples (none for a MIG instance)
    assert utilization.history("node", node.name, "24h") == []
    with override_settings(PROMETHEUS_URL=stack["url"]):
        points = utilization.history("node", node.name, "24h")
        assert points and all(0 < mean <= peak <= 100 for _, mean, peak in points), points
        assert utilization.history("pool", "h100-mig", "24h")
        assert utilization.history("team", "vision", "24h")
        api = APIClient()
        api.force_authenticate(w.bob)
        m = api.get(f"/api/v1/requests/{mig.pk}/metrics/").json()
        assert [v for _, v in m["series"]["gpu_utilization"] if v], m["series"]
        client = Client()
        client.force_login(w.dave)
        page = client.get(f"/ops/nodes/{node.pk}/history/")
    assert page.status_code == 200
    assert "no data yet" not in page.content.decode()
