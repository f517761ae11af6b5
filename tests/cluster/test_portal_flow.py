"""The whole portal against the real control plane: a member submits, the tick admits on the
inventory read from the cluster, the Job is created as the chart's ServiceAccount, the real
scheduler binds its pod to the node the packer chose, and the reconciler brings the states
back. The simulated-backend twins are in tests/portal/tick/test_tick.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import portal.backends
from portal.backends.kubernetes import KubernetesBackend
from portal.models import GpuRequest
from portal.services.requests import gpu_request_submit
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.cluster.kube import Cluster, node_ready
from tests.cluster.nodes import POOL_SELECTORS
from tests.cluster.world import training_world

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(watching: KubernetesBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setattr(portal.backends, "_backend", lambda name: watching)
    yield training_world("a100", POOL_SELECTORS["a100"])


def _drive(req: GpuRequest, until: set[str], timeout_s: float = 40) -> list[str]:
    """Reconcile until the request reaches a state in `until`; the states seen, in order."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reconcile()
        req.refresh_from_db()
        if not seen or seen[-1] != req.state:
            seen.append(req.state)
        if req.state in until:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"request {req.pk} did not reach {until}; saw {seen}")


def _pods(cluster: Cluster, req: GpuRequest) -> list[Any]:
    attempt = req.attempts.get()
    return (
        cluster.core()
        .list_namespaced_pod(
            # Every pod of the attempt (a gang's pods each belong to their own Job).
            attempt.namespace,
            label_selector=f"quartermaster.io/attempt-id={attempt.pk}",
        )
        .items
    )


def test_a_submitted_request_runs_on_the_node_the_packer_chose(
    world: dict[str, Any], cluster: Cluster
) -> None:
    req = gpu_request_submit(
        user=world["user"],
        team=world["team"],
        workload_class=world["cls"],
        pool=world["pool"],
        image="qm.test/ok",
        command=["python", "train.py"],
        count=2,
        cpu_milli=4000,
        estimated_runtime_s=60,
    )
    run_tick()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.ADMITTED
    seen = _drive(req, {GpuRequest.State.SUCCEEDED, GpuRequest.State.FAILED})
    assert seen[-1] == GpuRequest.State.SUCCEEDED, seen
    assert GpuRequest.State.RUNNING in seen
    attempt = req.attempts.get()
    [pod] = _pods(cluster, req)
    assert pod.spec.node_name == attempt.nodes[0]
    assert pod.spec.containers[0].resources.requests["nvidia.com/gpu"] == "2"


def test_a_gang_runs_one_pod_on_each_of_its_nodes(world: dict[str, Any], cluster: Cluster) -> None:
    req = gpu_request_submit(
        user=world["user"],
        team=world["team"],
        workload_class=world["cls"],
        pool=world["pool"],
        image="qm.test/ok",
        command=["torchrun", "train.py"],
        count=8,
        pods=2,
        cpu_milli=4000,
        estimated_runtime_s=60,
    )
    run_tick()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.ADMITTED, req.state
    attempt = req.attempts.get()
    assert sorted(attempt.nodes) == ["a100-0", "a100-1"]
    seen = _drive(req, {GpuRequest.State.SUCCEEDED, GpuRequest.State.FAILED})
    assert seen[-1] == GpuRequest.State.SUCCEEDED, seen
    pods = _pods(cluster, req)
    assert sorted(p.spec.node_name for p in pods) == ["a100-0", "a100-1"]
    assert all(p.spec.containers[0].resources.requests["nvidia.com/gpu"] == "8" for p in pods)


def test_a_request_on_a_node_that_goes_not_ready_is_requeued(
    world: dict[str, Any], cluster: Cluster
) -> None:
    from tests.cluster.kube import merge_patch_node, wait_for
    from tests.cluster.test_failures import NOT_READY

    core = cluster.core()
    req = gpu_request_submit(
        user=world["user"],
        team=world["team"],
        workload_class=world["cls"],
        pool=world["pool"],
        image="qm.test/sleep",
        command=["python", "train.py"],
        count=1,
        cpu_milli=4000,
        estimated_runtime_s=600,
    )
    run_tick()
    seen = _drive(req, {GpuRequest.State.RUNNING})
    node = req.attempts.get().nodes[0]
    merge_patch_node(core, node, {"metadata": {"labels": {NOT_READY: "true"}}})
    try:
        # The node controller taints a NotReady node on its own schedule (slow on a loaded
        # machine); the eviction and the requeue follow within seconds of the taint.
        wait_for(
            f"the not-ready NoExecute taint on {node}",
            lambda: any(
                t.key == "node.kubernetes.io/not-ready" and t.effect == "NoExecute"
                for t in core.read_node(node).spec.taints or ()
            ),
            120,
        )
        seen += _drive(req, {GpuRequest.State.PENDING}, timeout_s=90)
        attempt = req.attempts.order_by("number").first()
        assert attempt is not None and attempt.state == "node_lost", attempt.state
    finally:
        merge_patch_node(core, node, {"metadata": {"labels": {NOT_READY: None}}})
        wait_for(f"{node} Ready", lambda: k8s_ready(core, node), 60)
        for a in req.attempts.all():
            watching = portal.backends.get_backend()
            watching.stop(a.workload_name, a.namespace, 0)


def k8s_ready(core: Any, node: str) -> bool:
    return node_ready(core.read_node(node))
