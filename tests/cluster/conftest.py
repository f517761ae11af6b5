"""Fixtures of the `cluster` tests: a real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok) built and started by scripts/controlplane.

Where the binaries are not built (no Go, or `scripts/controlplane build` never ran) every
`cluster` test is skipped with the reason; with QM_REQUIRE_CLUSTER=1 (.ci/run sets it) that
skip, and any other skip of a `cluster` test, is a failure instead.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from portal.backends.kubernetes import KubernetesBackend
from portal.k8s.jobs import JobOptions
from tests.chart.chart import NAMESPACE, RELEASE, render
from tests.cluster import nodes as gpu_nodes_mod
from tests.cluster.kube import (
    SCRIPT,
    Cluster,
    apply_one,
    node_settled,
    token_client,
    wait_for,
)

HERE = Path(__file__).resolve().parent
REQUIRE = os.environ.get("QM_REQUIRE_CLUSTER") == "1"
SA = f"{RELEASE}-quartermaster"
TEAM_NS = ("team-a", "team-b")

#: chart values of the cluster tests: every part a real install has, external database/broker
CHART_VALUES: dict[str, Any] = {
    "externalDatabase": {"url": "postgres://qm:pw@db.example.com:5432/quartermaster"},
    "externalRedis": {"url": "redis://:pw@redis.example.com:6379/0"},
    "teams": [
        {
            "name": "team-a",
            "quota": {
                "requests.nvidia.com/gpu": "16",
                "requests.nvidia.com/mig-1g.10gb.me": "1",
                "requests.cpu": "256",
                "count/jobs.batch": "50",
            },
            "readers": {"groups": ["team-a-researchers"], "users": ["alice@example.com"]},
        },
        {"name": "team-b", "quota": {"requests.nvidia.com/gpu": "1"}},
    ],
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
    },
}
#: kinds that would start pods: applied with dryRun=All (validated and admitted, not run), so
#: the portal's own pods do not take CPU on the simulated GPU nodes the inventory tests count
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "Pod"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE and rep.skipped and item.get_closest_marker("cluster") is not None:
        rep.outcome = "failed"
        rep.longrepr = f"QM_REQUIRE_CLUSTER=1 but this cluster test was skipped: {rep.longrepr}"


def _built() -> bool:
    return subprocess.run([str(SCRIPT), "built"], check=False).returncode == 0


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not _built():
        bin_dir = subprocess.run(
            [str(SCRIPT), "bin-dir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        why = (
            f"the control plane is not built in {bin_dir}: run `scripts/controlplane build` "
            "(needs Go and the Go module proxy)"
        )
        if REQUIRE:
            pytest.fail(f"QM_REQUIRE_CLUSTER=1: {why}")
        pytest.skip(why)
    state = tmp_path_factory.mktemp("cluster")
    started = time.monotonic()
    subprocess.run([str(SCRIPT), "up", str(state)], check=True, timeout=300)
    env = subprocess.run(
        [str(SCRIPT), "env", str(state)], check=True, capture_output=True, text=True
    ).stdout
    values = dict(
        line.removeprefix("export ").split("=", 1) for line in env.splitlines() if "=" in line
    )
    c = Cluster(state=state, env=values)
    print(f"\ncontrol plane up in {time.monotonic() - started:.1f}s ({state})")
    try:
        wait_for(
            "the default ServiceAccount",
            lambda: c.core().read_namespaced_service_account("default", "default"),
            60,
        )
        yield c
    finally:
        subprocess.run([str(SCRIPT), "down", str(state)], check=False, timeout=120)


@pytest.fixture(scope="session")
def gpu_nodes(cluster: Cluster) -> list[dict[str, Any]]:
    """The simulated GPU nodes, created as their kubelet would register them, and Ready."""
    docs = gpu_nodes_mod.all_nodes()
    core = cluster.core()
    for doc in docs:
        core.create_node(doc)
    for doc in docs:
        name = doc["metadata"]["name"]
        wait_for(f"node {name} Ready", lambda n=name: node_settled(core.read_node(n)), 60)
    return docs


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> None:
    """ServiceMonitor and PrometheusRule from prometheus-operator's published CRDs, and the
    cluster autoscaler's ProvisioningRequest (modelled on its published v1 API: see the file)."""
    import yaml

    dyn = cluster.dynamic()
    for path in sorted((HERE / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                apply_one(dyn, doc)
    ext = client.ApiextensionsV1Api(cluster.api())
    for name in (
        "servicemonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
        "provisioningrequests.autoscaling.x-k8s.io",
    ):
        wait_for(
            f"CRD {name} established",
            lambda n=name: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(n).status.conditions or ()
            ),
            30,
        )
    # discovery is cached per client: later clients see the new kinds


@pytest.fixture(scope="session")
def chart(cluster: Cluster, crds: None) -> list[dict[str, Any]]:
    """The chart rendered offline and applied server-side with strict field validation."""
    core = cluster.core()
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    docs = render(CHART_VALUES)
    dyn = cluster.dynamic()
    order = {"Namespace": 0, "PriorityClass": 1, "ServiceAccount": 2}
    for doc in sorted(docs, key=lambda d: order.get(d["kind"], 5)):
        apply_one(dyn, doc, dry_run=doc["kind"] in WORKLOAD_KINDS)
    for ns in TEAM_NS:
        wait_for(
            f"ServiceAccount default in {ns}",
            lambda n=ns: core.read_namespaced_service_account("default", n),
            30,
        )
    return docs


@pytest.fixture(scope="session")
def qm_api(cluster: Cluster, chart: list[dict[str, Any]]) -> client.ApiClient:
    """A client with a token of the chart's ServiceAccount: what web, worker and beat run as."""
    return token_client(cluster, NAMESPACE, SA)


#: Job options of the tests: short grace so a stopped pod goes within seconds
JOB_OPTIONS = JobOptions(termination_grace_s=2, ttl_seconds_after_finished=600, backoff_limit=0)


@pytest.fixture(scope="session")
def backend(qm_api: client.ApiClient, gpu_nodes: list[dict[str, Any]]) -> KubernetesBackend:
    return KubernetesBackend(
        core=client.CoreV1Api(qm_api),
        batch=client.BatchV1Api(qm_api),
        job_options=JOB_OPTIONS,
        pool_selectors=gpu_nodes_mod.POOL_SELECTORS,
        watch_namespaces=TEAM_NS,
        image_pull_timeout_s=5,
    )


@pytest.fixture(scope="session")
def watching(backend: KubernetesBackend) -> Iterator[KubernetesBackend]:
    """The backend with its watch running on the team namespaces (`status()` reads the cache)."""
    stop = threading.Event()
    backend.start_watching(stop, resync_s=3600)
    watcher = backend.watcher
    assert watcher is not None
    wait_for("the watch to sync", watcher.synced)
    yield backend
    stop.set()
