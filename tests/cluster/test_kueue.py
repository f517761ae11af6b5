"""Kueue beside the portal (docs/kubernetes.md, "Running beside Kueue"), on the real control plane.

Kueue's controller, built from its Go module by scripts/kueue, runs against the test API server
with `manageJobsWithoutQueueName: true` and a `managedJobsNamespaceSelector` that leaves out the
portal's team namespaces (the chart labels them `quartermaster.io/team-namespace`). Its
webhooks are not registered with the API server (no cert management, no webhook
configurations): Kueue then finds unlabelled Jobs by reconciling and suspends them, which is
what its webhook would have done at creation.

Shown: the portal's Jobs run, unsuspended; a Job Kueue admitted (queue name, ClusterQueue,
LocalQueue, ResourceFlavor) runs on a node the portal packs too, and its pod is foreign usage
there; a portal-style Job in a namespace Kueue manages is suspended, and the portal says so.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from portal.backends.base import SUSPENDED_BY_OTHERS, Outcome
from portal.backends.kubernetes import KubernetesBackend
from tests.cluster import nodes as gpu_nodes_mod
from tests.cluster.conftest import JOB_OPTIONS, REQUIRE
from tests.cluster.kube import ROOT, Cluster, apply_one, node_settled, wait_for
from tests.cluster.specs import launch_spec

KUEUE = ROOT / "scripts" / "kueue"
SHARED_NODE = "kueue-shared-0"
#: a namespace Kueue manages: not a team namespace
RESEARCH = "research"
KUEUE_NS = "kueue-system"
QUEUE = "research"
GROUP = "kueue.x-k8s.io"
KUEUE_GPUS = 3


def _script(*args: str) -> str:
    out = subprocess.run([str(KUEUE), *args], capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _self_signed(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=kueue-webhook-service.kueue-system.svc",
            "-keyout",
            str(directory / "tls.key"),
            "-out",
            str(directory / "tls.crt"),
        ],
        check=True,
        capture_output=True,
    )


def _configuration(webhook_port: int, cert_dir: Path, health_port: int) -> dict[str, Any]:
    """What docs/kubernetes.md recommends, plus what running outside a pod needs."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NS,
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {
            "matchExpressions": [
                {"key": "quartermaster.io/team-namespace", "operator": "DoesNotExist"},
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", KUEUE_NS],
                },
            ]
        },
        "internalCertManagement": {"enable": False},
        # served on loopback but never registered with the API server
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "leaderElection": {"leaderElect": False},
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
    }


def _etc(state: Path) -> Path:
    """Kueue reads its metrics certificate from the fixed /etc/kueue/metrics/certs when it does
    not manage certificates: it runs in its own mount namespace with this as /etc."""
    etc = state / "etc"
    etc.mkdir()
    for name in ("hosts", "resolv.conf", "nsswitch.conf", "passwd", "group"):
        if Path("/etc", name).exists():
            shutil.copy(Path("/etc", name), etc / name)
    _self_signed(etc / "kueue" / "metrics" / "certs")
    return etc


def _install_crds(cluster: Cluster) -> None:
    crd_dir = Path(_script("crd-dir"))
    dyn = cluster.dynamic()
    names = []
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                apply_one(dyn, doc)
                names.append(doc["metadata"]["name"])
    ext = client.ApiextensionsV1Api(cluster.api())
    for name in names:
        wait_for(
            f"CRD {name} established",
            lambda n=name: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(n).status.conditions or ()
            ),
            30,
        )


@pytest.fixture(scope="module")
def kueue(
    cluster: Cluster, chart: list[dict[str, Any]], gpu_nodes: list[dict[str, Any]]
) -> Iterator[subprocess.Popen[bytes]]:
    if subprocess.run([str(KUEUE), "built"], check=False).returncode != 0:
        why = f"Kueue is not built in {_script('bin-dir')}: run `scripts/kueue build`"
        if REQUIRE:
            pytest.fail(f"QM_REQUIRE_CLUSTER=1: {why}")
        pytest.skip(why)
    started = time.monotonic()
    _install_crds(cluster)
    core = cluster.core()
    for ns in (KUEUE_NS, RESEARCH):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    state = cluster.state / "kueue"
    state.mkdir()
    _self_signed(state / "webhook-certs")
    health = _free_port()
    config = state / "config.yaml"
    config.write_text(yaml.safe_dump(_configuration(_free_port(), state / "webhook-certs", health)))
    etc = _etc(state)
    binary = Path(_script("bin-dir")) / "kueue"
    log = (state / "kueue.log").open("wb")
    # A mount namespace of its own: /etc is replaced for this process only.
    # root: a mount namespace is enough; anyone else: a user namespace maps them to root in it
    unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "-r", "--mount"]
    proc = subprocess.Popen(
        [
            *unshare,
            "sh",
            "-c",
            'mount --bind "$1" /etc && shift && exec "$@"',
            "sh",
            str(etc),
            str(binary),
            f"--config={config}",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": cluster.kubeconfig},
    )

    def ready() -> bool:
        if proc.poll() is not None:
            tail = (state / "kueue.log").read_text()[-3000:]
            raise AssertionError(f"kueue exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for("Kueue's controller ready", ready, 90)
    print(f"\nKueue up in {time.monotonic() - started:.1f}s ({state})")
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def shared_node(cluster: Cluster, kueue: subprocess.Popen[bytes]) -> Iterator[str]:
    """An A100 node both the portal (pool a100) and Kueue's flavor select."""
    core = cluster.core()
    core.create_node(gpu_nodes_mod.a100(SHARED_NODE))
    wait_for(f"node {SHARED_NODE} Ready", lambda: node_settled(core.read_node(SHARED_NODE)), 60)
    yield SHARED_NODE
    core.delete_node(SHARED_NODE)


@pytest.fixture(scope="module")
def queues(cluster: Cluster, kueue: subprocess.Popen[bytes], shared_node: str) -> None:
    dyn = cluster.dynamic()
    v = f"{GROUP}/v1beta2"
    apply_one(
        dyn,
        {
            "apiVersion": v,
            "kind": "ResourceFlavor",
            "metadata": {"name": "shared-a100"},
            "spec": {"nodeLabels": {"kubernetes.io/hostname": shared_node}},
        },
    )
    apply_one(
        dyn,
        {
            "apiVersion": v,
            "kind": "ClusterQueue",
            "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "shared-a100",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "64"},
                                    {"name": "memory", "nominalQuota": "256Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "8"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    apply_one(
        dyn,
        {
            "apiVersion": v,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": RESEARCH},
            "spec": {"clusterQueue": QUEUE},
        },
    )
    custom = client.CustomObjectsApi(cluster.api())

    def active() -> bool:
        cq = custom.get_cluster_custom_object(GROUP, "v1beta2", "clusterqueues", QUEUE)
        return any(
            c["type"] == "Active" and c["status"] == "True"
            for c in cq.get("status", {}).get("conditions", [])
        )

    wait_for("the ClusterQueue active", active, 30)


def _kueue_job(name: str) -> client.V1Job:
    """A Job as Kueue's users write it: a queue name, created suspended (Kueue's webhook would
    suspend it; it is not registered here)."""
    return client.V1Job(
        metadata=client.V1ObjectMeta(
            name=name, namespace=RESEARCH, labels={"kueue.x-k8s.io/queue-name": QUEUE}
        ),
        spec=client.V1JobSpec(
            suspend=True,
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[
                        client.V1Container(
                            name="train",
                            image="qm.test/sleep",
                            resources=client.V1ResourceRequirements(
                                requests={
                                    "cpu": "2",
                                    "memory": "8Gi",
                                    "nvidia.com/gpu": str(KUEUE_GPUS),
                                },
                                limits={"nvidia.com/gpu": str(KUEUE_GPUS)},
                            ),
                        )
                    ],
                )
            ),
        ),
    )


def _running_pod(cluster: Cluster, namespace: str, selector: str) -> client.V1Pod:
    def probe() -> client.V1Pod | None:
        pods = cluster.core().list_namespaced_pod(namespace, label_selector=selector).items
        return next((p for p in pods if p.status.phase == "Running"), None)

    return wait_for(f"a running pod ({namespace}, {selector})", probe, 60)


def test_portal_jobs_run_and_a_kueue_job_on_a_shared_node_is_foreign_usage(
    cluster: Cluster, backend: KubernetesBackend, queues: None
) -> None:
    batch = cluster.batch()
    # Kueue's job: admitted by Kueue onto the shared node
    batch.create_namespaced_job(RESEARCH, _kueue_job("kueue-train"))
    pod = _running_pod(cluster, RESEARCH, "job-name=kueue-train")
    assert pod.spec.node_name == SHARED_NODE
    job = batch.read_namespaced_job("kueue-train", RESEARCH)
    assert job.spec.suspend is False, "Kueue admitted and resumed it"
    # the portal's job beside it on the same node, in a team namespace Kueue leaves alone
    # (backoff_limit 0 as the tests' Job options)
    assert JOB_OPTIONS.backoff_limit == 0
    portal = launch_spec(node=SHARED_NODE, grants=2, image="qm.test/sleep")
    # a portal-style Job where Kueue manages Jobs: Kueue suspends it
    control_backend = KubernetesBackend(
        core=cluster.core(),
        batch=batch,
        job_options=JOB_OPTIONS,
        pool_selectors=gpu_nodes_mod.POOL_SELECTORS,
        watch_namespaces=(RESEARCH,),
        image_pull_timeout_s=5,
    )
    control = launch_spec(node="a100-1", namespace=RESEARCH, image="qm.test/sleep")
    try:
        backend.launch(portal)
        control_backend.launch(control)
        suspended = wait_for(
            "Kueue to suspend the Job without a queue name",
            lambda: (
                st
                if (st := control_backend.status(control.name, RESEARCH)).reason
                == SUSPENDED_BY_OTHERS
                else None
            ),
            60,
        )
        assert suspended.outcome is Outcome.PENDING
        assert "suspended by" in suspended.message
        assert batch.read_namespaced_job(control.name, RESEARCH).spec.suspend is True
        # Kueue has reconciled Jobs since: the portal's is still running, never suspended
        wait_for(
            "the portal's attempt running",
            lambda: backend.status(portal.name, portal.namespace).outcome is Outcome.RUNNING,
            30,
        )
        assert not batch.read_namespaced_job(portal.name, portal.namespace).spec.suspend
        # the inventory: Kueue's 3 GPUs are foreign; the portal's own 2 are its books' business
        node = next(n for n in backend.inventory() if n.name == SHARED_NODE)
        assert node.pool == "a100"
        assert [d.index for d in node.devices if d.foreign] == [5, 6, 7]
        assert sum(d.healthy for d in node.devices) == 8 - KUEUE_GPUS
        assert node.cpu_milli == 126000 - 2000
    finally:
        backend.stop(portal.name, portal.namespace, grace_seconds=0)
        control_backend.stop(control.name, RESEARCH, grace_seconds=0)
        batch.delete_namespaced_job(
            "kueue-train", RESEARCH, propagation_policy="Background", grace_period_seconds=0
        )
