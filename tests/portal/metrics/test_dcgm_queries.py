"""No query of the portal selects a DCGM label that dcgm-exporter does not emit (the set is
`portal.lib.dcgm.LABELS`), and the synthetic model server's GPU series carry exactly that set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from portal.backends.serving_sim import Engine
from portal.lib import dcgm
from portal.metrics import catalog
from portal.models import Attempt, GpuRequest, Pool
from portal.services import serving_samples, utilization
from tests.base import make_world, submit_serving

ROOT = Path(__file__).resolve().parents[3]


def test_the_check_reads_selectors_and_groupings_and_catches_a_foreign_label() -> None:
    assert dcgm.foreign_labels('avg(DCGM_FI_DEV_GPU_UTIL{workload="qm-1"})') == {"workload"}
    assert dcgm.foreign_labels("avg by (team) (DCGM_FI_DEV_GPU_UTIL)") == {"team"}
    assert dcgm.foreign_labels('{__name__="DCGM_FI_DEV_FB_USED", pool="a"}') == {"pool"}
    # a runtime's series may carry the PodMonitor's labels: not a DCGM selector
    assert not dcgm.foreign_labels('sum by (le) (rate(vllm:x_bucket{workload="qm-1"}[1m]))')
    with pytest.raises(ValueError, match="cannot read"):
        dcgm.selected_labels("DCGM_FI_DEV_GPU_UTIL{pod=~qm}")


@pytest.mark.django_db
def test_no_query_the_portal_builds_selects_a_label_dcgm_exporter_lacks() -> None:
    w = make_world()
    built: list[str] = []
    for runtime in ("vllm", "tgi", "triton"):
        req = submit_serving(w.bob, w.vision, model_name="m", runtime=runtime)
        Attempt.objects.create(
            request=req,
            number=1,
            pool=Pool.objects.get(name="h100-mig"),
            workload_name=f"qm-{req.pk}-1",
            namespace=w.vision.namespace,
            gpus_milli=1000,
            admitted_at=timezone.now(),
        )
        built += serving_samples.queries_for(GpuRequest.objects.get(pk=req.pk)).values()
    for scope, key in (("node", "h100-01"), ("pool", "h100-mig"), ("team", "vision")):
        sel = utilization.device_selector(scope, key)
        assert sel is not None
        built += utilization.history_queries(sel, 300)
    built += serving_samples.device_queries(catalog.DSEL).values()
    # what the chart ships: the dashboard's and the alert rules' DCGM expressions
    dashboard = json.loads((ROOT / "charts/quartermaster/files/dashboard.json").read_text())
    built += re.findall(r'"expr": "((?:[^"\\]|\\.)*)"', json.dumps(dashboard, indent=1))
    rules = (ROOT / "charts/quartermaster/templates/prometheusrule.yaml").read_text()
    built += [line.split("expr:", 1)[1] for line in rules.splitlines() if "expr:" in line]
    dcgm_queries = [q.replace('\\"', '"') for q in built if "DCGM_" in q]
    assert len(dcgm_queries) >= 12
    for q in dcgm_queries:
        assert not dcgm.foreign_labels(q), q
    # a request's GPU series are its pods', GPU_UTIL or (MIG) the graphics engine's activity
    q = serving_samples.queries_for(GpuRequest.objects.filter(runtime="vllm").get())
    assert re.search(r'namespace="qm-vision",pod=~"\(qm-\d+-1\)-\.\+"', q["gpu_utilization"])
    assert dcgm.GR_ENGINE_ACTIVE in q["gpu_utilization"]


def _dcgm_families(engine: Engine) -> dict[str, set[str]]:
    text = engine.metrics().decode()
    return {
        fam.name: set(fam.samples[0].labels)
        for fam in text_string_to_metric_families(text)
        if fam.name.startswith("DCGM_")
    }


def test_the_synthetic_server_emits_exactly_dcgm_exporters_labels() -> None:
    base = {"team": "vision", "workload": "qm-1", "node": "h100-01", "namespace": "qm-vision"}
    whole = _dcgm_families(Engine("vllm", {**base, "pod": "qm-1-1-abcde"}, **ENGINE))
    assert dcgm.GPU_UTIL in whole and dcgm.GR_ENGINE_ACTIVE in whole
    for labels in whole.values():
        assert labels == dcgm.LABELS - set(dcgm.MIG_LABELS)
    mig = _dcgm_families(Engine("vllm", {**base, "mig_profile": "1g.10gb"}, **ENGINE))
    assert dcgm.GPU_UTIL not in mig  # as dcgm-exporter: none for a MIG instance
    for labels in mig.values():
        assert labels == dcgm.LABELS


def test_the_sampler_reads_a_mig_instances_utilization_and_the_runtimes_revision() -> None:
    engine = Engine(
        "vllm",
        {"node": "h100-02", "mig_profile": "1g.10gb", "model_revision": "r7"},
        **ENGINE,
    )
    engine.gr_active.set(0.42)
    scraped = serving_samples.parse_scrape(engine.metrics().decode(), "vllm")
    assert scraped["util"] == pytest.approx(42)
    assert scraped["revision"] == "r7"


ENGINE = {"max_batch": 4, "rps": 0.0, "warmup_s": 0.0}


@pytest.mark.django_db
def test_history_falls_back_to_the_node_agents_rollups_when_prometheus_does_not_answer() -> None:
    from datetime import timedelta

    from django.test import override_settings

    from portal.models import UtilizationRollup

    make_world()
    now = timezone.now()
    UtilizationRollup.objects.create(
        scope="node",
        key="h100-01",
        resolution_s=300,
        start=now - timedelta(minutes=10),
        utilization_avg=40,
        utilization_max=60,
        memory_used_mib_avg=0,
        samples=5,
    )
    with override_settings(PROMETHEUS_URL="http://127.0.0.1:9", PROMETHEUS_TIMEOUT_S=1):
        points = utilization.history("node", "h100-01", "24h", now=now)
    assert [(mean, peak) for _, mean, peak in points] == [(40, 60)]
