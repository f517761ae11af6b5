"""Attempts launched by the Kubernetes backend, as the chart's ServiceAccount, through admission,
the Job controller and the real kube-scheduler, on the simulated GPU nodes; their states come
back through the backend's watch. The fake-based twins are in tests/k8s/test_backend.py."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from portal.backends.base import LaunchSpec, Outcome
from portal.backends.kubernetes import KubernetesBackend
from tests.cluster.kube import Cluster, wait_for
from tests.cluster.nodes import RESERVED_TAINT
from tests.cluster.specs import launch_spec


def outcomes(
    backend: KubernetesBackend, spec: LaunchSpec, until: Outcome, timeout_s: float = 30
) -> list[Outcome]:
    """The distinct outcomes the backend reports, in order, until `until` (or a terminal one)."""
    seen: list[Outcome] = []
    deadline = time.monotonic() + timeout_s
    terminal = {
        Outcome.SUCCEEDED,
        Outcome.FAILED,
        Outcome.OOM,
        Outcome.IMAGE_PULL,
        Outcome.NODE_LOST,
    }
    while time.monotonic() < deadline:
        got = backend.status(spec.name, spec.namespace).outcome
        if not seen or seen[-1] != got:
            seen.append(got)
        if got == until or (got in terminal and until in terminal):
            return seen
        time.sleep(0.05)
    w = backend.watcher
    streams = w.streams if w else None
    job = w.jobs.get((spec.namespace, spec.name)) if w else None
    raise AssertionError(
        f"{spec.name}: no {until} within {timeout_s}s; saw {seen}; streams {streams}; "
        f"cached job status {job.status if job else None}"
    )


def pod_of(cluster: Cluster, spec: LaunchSpec) -> client.V1Pod:
    def probe() -> client.V1Pod | None:
        pods = (
            cluster.core()
            .list_namespaced_pod(
                spec.namespace, label_selector=f"app.kubernetes.io/instance={spec.name}"
            )
            .items
        )
        return pods[0] if pods and pods[0].spec.node_name else None

    return wait_for(f"a bound pod of {spec.name}", probe)


def requests_of(pod: client.V1Pod) -> dict[str, str]:
    return dict(pod.spec.containers[0].resources.requests or {})


def test_a_whole_gpu_attempt_is_bound_to_the_chosen_node_runs_and_succeeds(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    spec = launch_spec(node="a100-1", grants=2)
    watcher = watching.watcher
    assert watcher is not None
    relists = sum(s.relists for s in watcher.streams.values())
    watching.launch(spec)
    pod = pod_of(cluster, spec)
    # the real scheduler bound it where the packer put it (a100-0 was just as free)
    assert pod.spec.node_name == "a100-1"
    assert requests_of(pod)["nvidia.com/gpu"] == "2"
    seen = outcomes(watching, spec, Outcome.SUCCEEDED)
    assert seen[-1] == Outcome.SUCCEEDED and Outcome.RUNNING in seen, seen
    assert seen.index(Outcome.RUNNING) < seen.index(Outcome.SUCCEEDED)
    # every state came through the watch: no list was needed
    assert sum(s.relists for s in watcher.streams.values()) == relists
    job = cluster.batch().read_namespaced_job(spec.name, spec.namespace)
    assert job.status.succeeded == 1


def test_a_mig_me_attempt_gets_the_renamed_resource_and_runs(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    spec = launch_spec(
        node="h100-mig-0", pool="h100-mig", profile_kind="mig", mig_profile="1g.10gb+me"
    )
    watching.launch(spec)
    pod = pod_of(cluster, spec)
    assert pod.spec.node_name == "h100-mig-0"
    assert requests_of(pod)["nvidia.com/mig-1g.10gb.me"] == "1"
    assert outcomes(watching, spec, Outcome.SUCCEEDED)[-1] == Outcome.SUCCEEDED


def test_a_mig_attempt_beside_a_whole_gpu_on_a_mixed_node(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    mig = launch_spec(
        node="h100-mig-0",
        pool="h100-mig",
        profile_kind="mig",
        mig_profile="3g.40gb",
        image="qm.test/sleep",
    )
    whole = launch_spec(node="h100-mig-0", pool="h100-mig", grants=1, image="qm.test/sleep")
    try:
        watching.launch(mig)
        watching.launch(whole)
        assert requests_of(pod_of(cluster, mig))["nvidia.com/mig-3g.40gb"] == "1"
        assert requests_of(pod_of(cluster, whole))["nvidia.com/gpu"] == "1"
        for s in (mig, whole):
            assert outcomes(watching, s, Outcome.RUNNING)[-1] == Outcome.RUNNING
    finally:
        for s in (mig, whole):
            watching.stop(s.name, s.namespace, grace_seconds=0)


def test_a_time_sliced_attempt_asks_for_one_shared_unit(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    spec = launch_spec(node="l4-shared-0", pool="l4-shared", profile_kind="shared")
    watching.launch(spec)
    pod = pod_of(cluster, spec)
    assert pod.spec.node_name == "l4-shared-0"
    assert requests_of(pod)["nvidia.com/gpu.shared"] == "1"
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["QUARTERMASTER_GPU_MEMORY_MIB"] == "5000"
    assert outcomes(watching, spec, Outcome.SUCCEEDED)[-1] == Outcome.SUCCEEDED


def test_a_tainted_pool_takes_only_attempts_that_tolerate_it(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    t = RESERVED_TAINT
    ok = launch_spec(
        node="a100-reserved-0", pool="reserved", tolerations=((t["key"], t["value"], t["effect"]),)
    )
    watching.launch(ok)
    assert pod_of(cluster, ok).spec.node_name == "a100-reserved-0"
    assert outcomes(watching, ok, Outcome.SUCCEEDED)[-1] == Outcome.SUCCEEDED

    refused = launch_spec(node="a100-reserved-0", pool="reserved", image="qm.test/sleep")
    try:
        watching.launch(refused)
        pod = _unschedulable(cluster, refused)
        assert "untolerated taint" in pod.status.conditions[0].message
        assert watching.status(refused.name, refused.namespace).outcome == Outcome.PENDING
    finally:
        watching.stop(refused.name, refused.namespace, grace_seconds=0)


def _unschedulable(cluster: Cluster, spec: LaunchSpec) -> Any:
    def probe() -> Any:
        for pod in (
            cluster.core()
            .list_namespaced_pod(
                spec.namespace, label_selector=f"app.kubernetes.io/instance={spec.name}"
            )
            .items
        ):
            for c in pod.status.conditions or ():
                if c.type == "PodScheduled" and c.reason == "Unschedulable":
                    pod.status.conditions = [c]
                    return pod
        return None

    return wait_for(f"{spec.name} unschedulable", probe)


def test_the_scheduler_counts_gpus_held_by_running_attempts(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    """Six of a100-0's eight GPUs are held; an attempt for three more does not fit there."""
    holder = launch_spec(node="a100-0", grants=6, image="qm.test/sleep")
    extra = launch_spec(node="a100-0", grants=3, image="qm.test/sleep")
    try:
        watching.launch(holder)
        assert outcomes(watching, holder, Outcome.RUNNING)[-1] == Outcome.RUNNING
        watching.launch(extra)
        pod = _unschedulable(cluster, extra)
        assert "Insufficient nvidia.com/gpu" in pod.status.conditions[0].message
    finally:
        for s in (holder, extra):
            watching.stop(s.name, s.namespace, grace_seconds=0)
