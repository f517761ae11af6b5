"""Day one on the real control plane (docs/operations.md): the chart carries the site
configuration, the hook Job's `config apply` fills an empty database, and a researcher's
request over HTTP runs on the kwok node the pool selects, with the decision log saying why.

The hook Job's image does not run here (kwok nodes run no containers): the Job is admitted by
the API server as the chart renders it (dry run), and its command runs in-process on the file
read back from the ConfigMap the chart created, as the Job reads it from its mount.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from django.contrib.auth import get_user_model
from django.core.management import call_command
from kubernetes import client

import portal.backends
from portal.backends.kubernetes import KubernetesBackend, _pool_selectors_from_db
from portal.models import AuditEvent, GpuRequest, Membership, Quota, Team, WorkloadClass
from portal.services.nodes import inventory_sync
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import api_secret
from tests.chart.chart import NAMESPACE, render
from tests.cluster.conftest import CHART_VALUES, JOB_OPTIONS, TEAM_NS
from tests.cluster.kube import Cluster, apply_one, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FULL = "qm-quartermaster"
SITE: dict[str, Any] = {
    "version": 1,
    "profiles": [{"name": "whole", "kind": "whole"}],
    "pools": [
        {
            "name": "a100",
            "gpu_model": "NVIDIA-A100-SXM4-80GB",
            "gpu_memory_mib": 81920,
            "node_selector": {"quartermaster.io/pool": "a100"},
        }
    ],
    "classes": [
        {
            "name": "training",
            "band": 100,
            "preemption": "always",
            "default_profile": "whole",
            "priority_class_name": "quartermaster-training",
        },
        {"name": "interactive", "band": 200, "preemption": "when-borrowing"},
    ],
    "teams": [
        {
            "name": "team-a",
            "namespace": "team-a",
            "quotas": {"a100": {"nominal_milli": 16000, "granted_milli": 16000}},
        }
    ],
}


@pytest.fixture
def backend(
    qm_api: client.ApiClient, gpu_nodes: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> Iterator[KubernetesBackend]:
    """The portal's backend as installed: pools' node selectors read from the database."""
    b = KubernetesBackend(
        core=client.CoreV1Api(qm_api),
        batch=client.BatchV1Api(qm_api),
        job_options=JOB_OPTIONS,
        pool_selectors=_pool_selectors_from_db,
        watch_namespaces=TEAM_NS,
        image_pull_timeout_s=5,
    )
    stop = threading.Event()
    b.start_watching(stop, resync_s=3600)
    assert b.watcher is not None
    wait_for("the watch to sync", b.watcher.synced)
    monkeypatch.setattr(portal.backends, "_backend", lambda name: b)
    yield b
    stop.set()


def _install_site_config(cluster: Cluster, site: dict[str, Any], tmp_path: Path, *args: str) -> str:
    """What `helm install/upgrade` with `siteConfig.file` does: the ConfigMap and the hook Job
    (admitted, not run), then the Job's command on the file as the ConfigMap holds it."""
    docs = render({**CHART_VALUES, "siteConfig": {"file": site}})
    dyn = cluster.dynamic()
    [cm] = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"{FULL}-site-config"
    ]
    [job] = [
        d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == f"{FULL}-site-config"
    ]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    apply_one(dyn, cm)
    apply_one(dyn, job, dry_run=True)
    stored = cluster.core().read_namespaced_config_map(f"{FULL}-site-config", NAMESPACE)
    path = tmp_path / "config.yaml"
    path.write_text(stored.data["config.yaml"])
    out = StringIO()
    call_command("config", "apply", "-f", str(path), *args, stdout=out)
    return out.getvalue()


def test_an_empty_site_configured_by_the_chart_admits_a_first_request(
    cluster: Cluster, backend: KubernetesBackend, live_server: Any, tmp_path: Path
) -> None:
    assert not Team.objects.exists()
    diff = _install_site_config(cluster, SITE, tmp_path)
    assert "created pool a100" in diff and "created quota team-a@a100" in diff
    inventory_sync()
    # a researcher of team-a with an API token (people come from SSO or the team page)
    bob = get_user_model().objects.create_user("bob", password="pw-bob-123")
    Membership.objects.create(user=bob, team=Team.objects.get(name="team-a"), role="member")
    headers = {"Authorization": f"Token {api_secret(bob)}"}
    body = {
        "team": "team-a",
        "workload_class": "training",
        "pool": "a100",
        "profile": "whole",
        "count": 1,
        "cpu_milli": 4000,
        "image": "qm.test/ok",
        "command": ["python", "train.py"],
        "estimated_runtime_s": 60,
    }
    r = requests.post(f"{live_server.url}/api/v1/requests/", json=body, headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    req = GpuRequest.objects.get(pk=r.json()["id"])
    run_tick()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.ADMITTED, (req.state, req.status_message)
    deadline = time.monotonic() + 40
    while req.state != GpuRequest.State.SUCCEEDED and time.monotonic() < deadline:
        reconcile()
        req.refresh_from_db()
        time.sleep(0.2)
    assert req.state == GpuRequest.State.SUCCEEDED, req.state
    attempt = req.attempts.get()
    [pod] = (
        cluster.core()
        .list_namespaced_pod("team-a", label_selector=f"quartermaster.io/attempt-id={attempt.pk}")
        .items
    )
    node = cluster.core().read_node(pod.spec.node_name)
    assert node.metadata.labels["quartermaster.io/pool"] == "a100"
    r = requests.get(
        f"{live_server.url}/api/v1/decisions/",
        params={"request": req.pk},
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    admits = [d for d in r.json()["results"] if d["kind"] == "admit"]
    assert admits and admits[0]["pool"] == "a100" and admits[0]["message"]


def test_a_changed_file_shows_its_diff_and_audits_each_change(
    cluster: Cluster, backend: KubernetesBackend, tmp_path: Path
) -> None:
    _install_site_config(cluster, SITE, tmp_path)
    changed = yaml.safe_load(yaml.safe_dump(SITE))
    changed["teams"][0]["quotas"]["a100"]["nominal_milli"] = 8000
    changed["classes"] = [c for c in changed["classes"] if c["name"] != "interactive"]
    dry = _install_site_config(cluster, changed, tmp_path, "--dry-run", "--prune")
    assert "changed quota team-a@a100\n    nominal_milli: 16000 -> 8000" in dry
    assert "retired class interactive" in dry
    assert Quota.objects.get(team__name="team-a").nominal_milli == 16000
    out = _install_site_config(cluster, changed, tmp_path, "--prune")
    assert out == dry.replace("would change", "changed")
    assert Quota.objects.get(team__name="team-a").nominal_milli == 8000
    assert WorkloadClass.objects.get(name="interactive").retired_at is not None
    quota_event = AuditEvent.objects.filter(action="quota.set").latest("id")
    assert (quota_event.before["nominal_milli"], quota_event.after["nominal_milli"]) == (
        16000,
        8000,
    )
    assert AuditEvent.objects.filter(action="class.retire").count() == 1
    again = _install_site_config(cluster, changed, tmp_path, "--prune")
    assert again.strip() == "No changes."
