"""Failures classified from the objects a real control plane makes: exit codes, image pulls and
OOM kills as a kubelet reports them (kwok stages), a node turned NotReady (the node lifecycle
controller taints it and evicts its pods), a stop that holds the devices until the pod is gone,
and a watch that falls behind etcd's compaction. The fake-based twins are in
tests/k8s/test_backend.py and tests/k8s/test_watch.py."""

from __future__ import annotations

import time

from kubernetes import client

from portal.backends.base import Outcome
from portal.backends.kubernetes import KubernetesBackend
from portal.k8s.status import condition
from portal.k8s.watch import WorkloadWatcher
from tests.cluster.kube import Cluster, merge_patch_node, node_ready, wait_for
from tests.cluster.specs import launch_spec
from tests.cluster.test_workloads import outcomes, pod_of

NOT_READY = "node-not-ready.stage.kwok.x-k8s.io"


def test_a_non_zero_exit_fails_the_attempt_with_its_code(watching: KubernetesBackend) -> None:
    spec = launch_spec(node="a100-0", image="qm.test/exit-3")
    watching.launch(spec)
    wait_for(
        "the attempt to fail",
        lambda: watching.status(spec.name, spec.namespace).outcome == Outcome.FAILED,
    )
    st = watching.status(spec.name, spec.namespace)
    assert (st.outcome, st.exit_code, st.reason) == (Outcome.FAILED, 3, "BackoffLimitExceeded")


def test_an_oom_kill_is_oom_and_fails_the_job_at_once(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    spec = launch_spec(node="a100-0", image="qm.test/oom")
    watching.launch(spec)
    wait_for("OOM", lambda: watching.status(spec.name, spec.namespace).outcome == Outcome.OOM)
    job = wait_for(
        "the Job to fail by its pod failure policy",
        lambda: condition(cluster.batch().read_namespaced_job(spec.name, spec.namespace), "Failed"),
    )
    assert job.reason == "PodFailurePolicy"


def test_an_image_that_cannot_be_pulled_is_pending_then_image_pull(
    watching: KubernetesBackend,
) -> None:
    spec = launch_spec(node="a100-0", image="qm.test/missing")
    try:
        watching.launch(spec)
        seen = outcomes(watching, spec, Outcome.IMAGE_PULL, timeout_s=30)
        assert seen[-1] == Outcome.IMAGE_PULL
        assert Outcome.PENDING in seen  # within image_pull_timeout_s it was only waiting
        st = watching.status(spec.name, spec.namespace)
        assert st.reason == "ErrImagePull" and "qm.test/missing" in st.message
    finally:
        watching.stop(spec.name, spec.namespace, grace_seconds=0)


def test_a_stopped_attempt_holds_its_devices_until_its_pod_is_gone(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    spec = launch_spec(node="a100-0", grants=2, image="qm.test/sleep")
    watching.launch(spec)
    assert outcomes(watching, spec, Outcome.RUNNING)[-1] == Outcome.RUNNING
    watching.stop(spec.name, spec.namespace, grace_seconds=30)
    held = wait_for(
        "the pod to be terminating",
        lambda: (st := watching.status(spec.name, spec.namespace)).reason == "Terminating" and st,
    )
    assert held.outcome == Outcome.RUNNING  # devices stay held while the pod stops
    pod = (
        cluster.core()
        .list_namespaced_pod(
            spec.namespace, label_selector=f"app.kubernetes.io/instance={spec.name}"
        )
        .items[0]
    )
    assert pod.metadata.deletion_timestamp is not None
    wait_for(
        "the Job and its pod to be gone",
        lambda: watching.status(spec.name, spec.namespace).outcome == Outcome.MISSING,
        30,
    )
    assert (
        not cluster.core()
        .list_namespaced_pod(
            spec.namespace, label_selector=f"app.kubernetes.io/instance={spec.name}"
        )
        .items
    )


def test_a_node_turned_not_ready_is_tainted_and_its_attempt_is_node_lost(
    watching: KubernetesBackend, cluster: Cluster
) -> None:
    core = cluster.core()
    spec = launch_spec(node="a100-1", image="qm.test/sleep")
    watching.launch(spec)
    assert outcomes(watching, spec, Outcome.RUNNING)[-1] == Outcome.RUNNING
    pod = pod_of(cluster, spec)
    merge_patch_node(core, "a100-1", {"metadata": {"labels": {NOT_READY: "true"}}})
    try:
        wait_for(
            "the not-ready NoExecute taint",
            lambda: any(
                t.key == "node.kubernetes.io/not-ready" and t.effect == "NoExecute"
                for t in core.read_node("a100-1").spec.taints or ()
            ),
            90,
        )
        inv = {n.name: n for n in watching.inventory()}
        assert inv["a100-1"].ready is False
        st = wait_for(
            "node lost",
            lambda: (
                (s := watching.status(spec.name, spec.namespace)).outcome == Outcome.NODE_LOST and s
            ),
            60,
        )
        assert st.reason == "DeletionByTaintManager"

        # The taint manager marks the pod (DisruptionTarget) before it deletes it, so the
        # attempt reads node-lost a moment before the deletion: wait for the pod to be gone,
        # failed, or (kwok on a busy machine) still listed with its deletion under way.
        def evicted() -> bool:
            left = {p.metadata.uid: p for p in core.list_namespaced_pod(spec.namespace).items}
            still = left.get(pod.metadata.uid)
            return (
                still is None
                or still.status.phase == "Failed"
                or still.metadata.deletion_timestamp is not None
            )

        wait_for("the taint manager to delete the pod", evicted, 30)
    finally:
        watching.stop(spec.name, spec.namespace, grace_seconds=0)
        merge_patch_node(core, "a100-1", {"metadata": {"labels": {NOT_READY: None}}})
        wait_for("a100-1 Ready again", lambda: node_ready(core.read_node("a100-1")), 60)
        wait_for(
            "the not-ready taint to go",
            lambda: (
                not any(
                    t.key.startswith("node.kubernetes.io/")
                    for t in core.read_node("a100-1").spec.taints or ()
                )
            ),
            60,
        )


def test_a_watch_behind_a_compaction_gets_410_and_relists_without_losing_anything(
    qm_api: client.ApiClient, cluster: Cluster, backend: KubernetesBackend
) -> None:
    watcher = WorkloadWatcher(
        client.CoreV1Api(qm_api), client.BatchV1Api(qm_api), ["team-b"], timeout_s=2
    )
    watcher.relist("team-b", "jobs")
    stream = watcher.streams[("team-b", "jobs")]
    old_rv = stream.resource_version
    spec = launch_spec(node="a100-0", namespace="team-b", image="qm.test/ok")
    backend.launch(spec)
    # etcd forgets the history, and a restarted apiserver's watch cache starts after it
    cluster.etcd_compact()
    cluster.script("restart-apiserver")
    assert stream.resource_version == old_rv
    watcher.watch_once("team-b", "jobs")
    assert stream.relists == 2  # the 410 Gone made it list again
    assert ("team-b", spec.name) in watcher.jobs
    assert int(stream.resource_version) > int(old_rv)
    # and it watches on from the new version
    watcher.watch_once("team-b", "jobs")
    assert stream.relists == 2
    t0 = time.monotonic()
    wait_for(
        "the job to complete",
        lambda: backend.status(spec.name, spec.namespace).outcome == Outcome.SUCCEEDED,
        30,
    )
    assert time.monotonic() - t0 < 30
