"""A serving workload on a real apiserver, as the chart's ServiceAccount: a Deployment of
replicas on the nodes the core chose, through the Deployment and ReplicaSet controllers and
the real kube-scheduler; ready replicas make it running; a revision change rolls it over."""

from __future__ import annotations

from dataclasses import replace

from kubernetes import client

from portal.backends.base import GrantSpec, Outcome, PodLaunch, ServingSpec
from portal.backends.kubernetes import KubernetesBackend
from portal.k8s.serving import L_REVISION
from tests.cluster.conftest import TEAM_NS
from tests.cluster.kube import Cluster, can_i, wait_for
from tests.cluster.specs import launch_spec


def test_the_chart_lets_the_portal_manage_serving_deployments(qm_api: client.ApiClient) -> None:
    for ns in TEAM_NS:
        for verb in ("create", "get", "patch", "delete"):
            assert can_i(qm_api, verb, "deployments", ns, group="apps"), (verb, ns)
        assert not can_i(qm_api, "update", "deployments", ns, group="apps")


def test_replicas_run_on_the_chosen_nodes_and_roll_over(
    backend: KubernetesBackend, cluster: Cluster
) -> None:
    base = launch_spec(node="a100-0", workload_class="inference")
    spec = replace(
        base,
        max_runtime_s=0,
        pods=(
            PodLaunch(0, "a100-0", (GrantSpec(0, 1000),)),
            PodLaunch(1, "a100-1", (GrantSpec(0, 1000),)),
        ),
        serving=ServingSpec("llama", "r1", "vllm", 0.5),
    )
    backend.launch(spec)
    core = cluster.core()
    selector = f"app.kubernetes.io/instance={spec.name}"

    def bound(revision: str) -> list[client.V1Pod] | None:
        pods = [
            p
            for p in core.list_namespaced_pod(spec.namespace, label_selector=selector).items
            if p.spec.node_name
            and p.metadata.deletion_timestamp is None
            and p.metadata.labels.get(L_REVISION) == revision
        ]
        return pods if len(pods) == 2 else None

    pods = wait_for("two bound replicas", lambda: bound("r1"), 60)
    assert sorted(p.spec.node_name for p in pods) == ["a100-0", "a100-1"]
    wait_for(
        "the workload running",
        lambda: backend.status(spec.name, spec.namespace, pods=2).outcome is Outcome.RUNNING,
        60,
    )
    backend.rollout(spec.name, spec.namespace, 2, "r2")
    wait_for("two replicas of r2", lambda: bound("r2"), 90)
    backend.stop(spec.name, spec.namespace, pods=2)
    wait_for(
        "the Deployment gone",
        lambda: backend.status(spec.name, spec.namespace, pods=2).outcome is Outcome.MISSING,
        60,
    )
