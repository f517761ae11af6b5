"""KubernetesBackend against the in-memory fake API: launch, adopt, stop, status, and
its answers to injected API faults.

Real-cluster twins: tests/cluster/test_workloads.py (launch, bind, run, succeed),
tests/cluster/test_failures.py (exit code, image pull, OOM, node lost, stop) and
tests/cluster/test_restart.py (409 adoption after an apiserver restart)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from kubernetes.client.exceptions import ApiException

from portal.backends.base import Outcome
from portal.k8s.names import READY_EXIT_BUSY, JobConflict
from tests.fakes.fake_k8s import FakeCluster
from tests.k8s.builders import NS, backend, cluster_with_nodes, spec

NAME = "qm-42-1"


@pytest.fixture
def cluster() -> FakeCluster:
    return cluster_with_nodes()


def launched(cluster: FakeCluster):  # noqa: ANN201
    b = backend(cluster)
    b.launch(spec())
    return b


def test_it_launches_one_job_in_the_team_namespace(cluster: FakeCluster) -> None:
    b = launched(cluster)
    assert list(cluster.jobs) == [(NS, NAME)]
    assert b.status(NAME, NS).outcome is Outcome.PENDING


def test_a_redelivered_launch_adopts_the_existing_job() -> None:
    """FI-03: create succeeded, the task died before the DB commit and is redelivered:
    the second create answers 409 and the Job is adopted; exactly one Job."""
    cluster = cluster_with_nodes()
    b = launched(cluster)
    b.launch(spec())
    assert len(cluster.jobs) == 1
    assert [kw["namespace"] for kw in cluster.calls_of("create_namespaced_job")] == [NS, NS]
    assert cluster.calls_of("read_namespaced_job")  # the 409 was checked, not blindly accepted


def test_a_409_for_another_attempt_is_a_conflict(cluster: FakeCluster) -> None:
    b = launched(cluster)
    with pytest.raises(JobConflict):
        b.launch(spec(attempt_id=99))


def test_a_create_answering_500_then_409_counts_as_created(cluster: FakeCluster) -> None:
    """FI-07: the API server created the Job but answered 500; the retry gets 409 and adopts it."""
    cluster.fail("create_namespaced_job", 500, create_then_fail=True)
    backend(cluster).launch(spec())
    assert len(cluster.jobs) == 1
    assert len(cluster.calls_of("create_namespaced_job")) == 2


def test_a_create_answering_500_without_creating_is_retried(cluster: FakeCluster) -> None:
    """FI-07: a 500 that created nothing is retried (bounded) and creates exactly one Job."""
    cluster.fail("create_namespaced_job", 500, times=2)
    backend(cluster).launch(spec())
    assert len(cluster.jobs) == 1
    assert len(cluster.calls_of("create_namespaced_job")) == 3


def test_a_create_failing_every_time_raises_after_bounded_tries(cluster: FakeCluster) -> None:
    """FI-07 / INV-11: the retry loop is bounded; the reconciler re-drives later."""
    cluster.fail("create_namespaced_job", 503, times=10)
    with pytest.raises(ApiException):
        backend(cluster).launch(spec())
    assert len(cluster.calls_of("create_namespaced_job")) == 3
    cluster.faults.clear()
    backend(cluster).launch(spec())
    assert len(cluster.jobs) == 1


def test_a_refused_create_is_not_retried(cluster: FakeCluster) -> None:
    cluster.fail("create_namespaced_job", 403)
    with pytest.raises(ApiException):
        backend(cluster).launch(spec())
    assert len(cluster.calls_of("create_namespaced_job")) == 1


def test_stop_deletes_with_grace_in_foreground_and_a_missing_job_is_fine(
    cluster: FakeCluster,
) -> None:
    b = launched(cluster)
    b.stop(NAME, NS, grace_seconds=120)
    body = cluster.calls_of("delete_namespaced_job")[0]["body"]
    assert body.grace_period_seconds == 120 and body.propagation_policy == "Foreground"
    assert not cluster.jobs
    b.stop(NAME, NS)  # already gone: no error
    assert b.status(NAME, NS).outcome is Outcome.MISSING


def test_a_stopped_job_holds_its_devices_until_the_pod_is_gone(cluster: FakeCluster) -> None:
    """FI-10 / INV-8: after stop, the pod is Terminating; status stays RUNNING (devices held)
    until the pod is gone, then the attempt can be released."""
    cluster.slow_deletions = True
    b = launched(cluster)
    cluster.run_pod(cluster.start_pod(NS, NAME))
    b.stop(NAME, NS, grace_seconds=30)
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.RUNNING and st.reason == "Terminating"
    cluster.finish_deletions()
    cluster.jobs.pop((NS, NAME))
    assert b.status(NAME, NS).outcome is Outcome.MISSING


def test_running_then_succeeded(cluster: FakeCluster) -> None:
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    assert b.status(NAME, NS).outcome is Outcome.PENDING
    cluster.run_pod(pod)
    assert b.status(NAME, NS).outcome is Outcome.RUNNING
    cluster.complete_job(NS, NAME)
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.SUCCEEDED and st.exit_code == 0


def test_a_failed_job_reports_its_exit_code(cluster: FakeCluster) -> None:
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.run_pod(pod)
    cluster.terminate(pod, 3)
    for _ in range(3):
        cluster.reconcile_job(NS, NAME)
        for p in cluster.pods_of(NS, NAME):
            if p.status.phase == "Pending":
                cluster.run_pod(p)
                cluster.terminate(p, 3)
    cluster.reconcile_job(NS, NAME)
    st = b.status(NAME, NS)
    assert (
        st.outcome is Outcome.FAILED and st.reason == "BackoffLimitExceeded" and st.exit_code == 3
    )
    assert len(cluster.pods_of(NS, NAME)) == 3  # backoffLimit 2: one pod and two replacements


def test_deadline_exceeded_is_a_failure(cluster: FakeCluster) -> None:
    b = launched(cluster)
    cluster.run_pod(cluster.start_pod(NS, NAME))
    cluster.fail_job(NS, NAME, "DeadlineExceeded", "Job was active longer than specified deadline")
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.FAILED and st.reason == "DeadlineExceeded"


def test_node_lost_after_taint_manager_eviction(cluster: FakeCluster) -> None:
    """FI-09: node NotReady past the toleration; the taint manager deletes the pod
    (DisruptionTarget/DeletionByTaintManager) -> NODE_LOST once the pod is gone; the node
    is not packed (inventory says not ready)."""
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.run_pod(pod)
    cluster.node_not_ready("gpu-a")
    cluster.tick(300)
    cluster.disrupt(pod, "DeletionByTaintManager")
    # still Terminating on the unreachable node: the device stays held (INV-8)
    assert b.status(NAME, NS).outcome is Outcome.RUNNING
    cluster.finish_pod_deletion(pod)
    assert (
        cluster.reconcile_job(NS, NAME) == "replaced"
    )  # Ignore rule: does not count against backoffLimit
    # The old pod is gone and its replacement is Pending: a direct read cannot tell why any
    # more; the watcher keeps the final state of the deleted pod (test_watch.py) and says NODE_LOST.
    assert b.status(NAME, NS).outcome is Outcome.PENDING
    assert not {n.name: n for n in b.inventory()}["gpu-a"].ready


def test_node_lost_classification_from_the_pod() -> None:
    """FI-09: a failed pod with DisruptionTarget/DeletionByTaintManager or NodeLost is NODE_LOST."""
    cluster = cluster_with_nodes()
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.run_pod(pod)
    cluster.disrupt(pod, "DeletionByTaintManager", delete=False)
    cluster.fail_pod(pod, "", "")
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.NODE_LOST and st.reason == "DeletionByTaintManager"


def test_a_pod_stuck_terminating_on_an_unreachable_node() -> None:
    """FI-10: a pod stuck Terminating keeps its devices held (RUNNING/Terminating) until its
    grace period plus 60 s passed; then NODE_LOST, so the attempt is released once."""
    cluster = cluster_with_nodes()
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.run_pod(pod)
    cluster.node_not_ready("gpu-a")
    cluster.disrupt(pod, "DeletionByTaintManager")  # deletionTimestamp = now + 30 s grace
    for seconds in (0, 30, 60, 89):
        st = b.status(NAME, NS)
        assert (st.outcome, st.reason) == (Outcome.RUNNING, "Terminating"), seconds
        cluster.now = pod.metadata.creation_timestamp + timedelta(seconds=seconds + 1)
    cluster.tick(5)
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.NODE_LOST
    assert b.status(NAME, NS).outcome is Outcome.NODE_LOST  # stable: released once by the caller


def test_image_pull_backoff_past_the_ready_timeout() -> None:
    """FI-11: ImagePullBackOff is PENDING until IMAGE_PULL_TIMEOUT_SECONDS, then IMAGE_PULL
    (a user-facing failure, no requeue) with the reason in the message."""
    cluster = cluster_with_nodes()
    b = backend(cluster, image_pull_timeout_s=600)
    b.launch(spec(image="nvcr.io/nvidia/pytorch:no-such-tag"))
    pod = cluster.start_pod(NS, NAME)
    cluster.wait_container(pod, "ErrImagePull", "manifest unknown")
    assert b.status(NAME, NS).outcome is Outcome.PENDING
    cluster.wait_container(pod, "ImagePullBackOff", "Back-off pulling image")
    cluster.tick(599)
    st = b.status(NAME, NS)
    assert (st.outcome, st.reason) == (Outcome.PENDING, "ImagePullBackOff")
    cluster.tick(2)
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.IMAGE_PULL and st.reason == "ImagePullBackOff"
    assert "no-such-tag" in st.message


def test_invalid_image_name_fails_at_once_and_config_errors_after_the_timeout() -> None:
    cluster = cluster_with_nodes()
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.wait_container(pod, "InvalidImageName")
    assert b.status(NAME, NS).outcome is Outcome.IMAGE_PULL
    cluster.wait_container(
        pod, "CreateContainerConfigError", "container has runAsNonRoot and image will run as root"
    )
    assert b.status(NAME, NS).outcome is Outcome.PENDING
    cluster.tick(601)
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.FAILED and "runAsNonRoot" in st.message


def test_oom_killed() -> None:
    """FI-12: OOMKilled, exit 137 -> OOM (not requeued); the FailJob rule on 137 ends the Job
    without replacement pods."""
    cluster = cluster_with_nodes()
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.run_pod(pod)
    cluster.terminate(pod, 137, "OOMKilled")
    assert cluster.reconcile_job(NS, NAME) == "failed"
    assert len(cluster.pods_of(NS, NAME)) == 1
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.OOM and st.exit_code == 137 and "memory" in st.message


def test_preempted_by_the_scheduler() -> None:
    """FI-13: DisruptionTarget/PreemptionByScheduler -> PREEMPTED (requeue, not charged) once the
    pod is terminal; the Ignore rule keeps the failure out of backoffLimit."""
    cluster = cluster_with_nodes()
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.run_pod(pod)
    cluster.disrupt(pod, "PreemptionByScheduler", delete=False)
    cluster.fail_pod(pod, "", "")
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.PREEMPTED and st.reason == "PreemptionByScheduler"
    assert cluster.reconcile_job(NS, NAME) == "replaced"
    assert b.status(NAME, NS).outcome is Outcome.PREEMPTED  # the old pod still tells why


@pytest.mark.parametrize("reason", ["EvictionByEvictionAPI", "TerminationByKubelet"])
def test_evicted(reason: str) -> None:
    """FI-13: evictions (drain, kubelet pressure) are PREEMPTED too, never the user's fault."""
    cluster = cluster_with_nodes()
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.run_pod(pod)
    cluster.disrupt(pod, reason, delete=False)
    cluster.fail_pod(pod, "Evicted" if reason == "TerminationByKubelet" else "")
    assert b.status(NAME, NS).outcome is Outcome.PREEMPTED


def test_kubelet_eviction_without_condition() -> None:
    cluster = cluster_with_nodes()
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.fail_pod(pod, "Evicted", "The node was low on resource: memory.")
    assert b.status(NAME, NS).outcome is Outcome.PREEMPTED


@pytest.mark.parametrize("reason", ["UnexpectedAdmissionError", "OutOfnvidia.com/gpu"])
def test_device_admission_errors_are_bounded(reason: str) -> None:
    """FI-16: the kubelet refuses the pod (UnexpectedAdmissionError / OutOfnvidia.com/gpu): an
    infrastructure failure (DEVICE_ERROR); the Job makes at most backoffLimit replacement pods."""
    cluster = cluster_with_nodes()
    b = launched(cluster)
    cluster.start_pod(NS, NAME)
    for _ in range(10):
        for pod in cluster.pods_of(NS, NAME):
            if pod.status.phase == "Pending":
                cluster.fail_pod(pod, reason, "Allocate failed due to no healthy devices present")
        if cluster.reconcile_job(NS, NAME) == "failed":
            break
    pods = cluster.pods_of(NS, NAME)
    assert len(pods) == 1 + 2  # backoffLimit 2
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.DEVICE_ERROR and st.reason == reason
    assert cluster.job(NS, NAME).spec.ttl_seconds_after_finished == 86400


def test_device_busy_at_start_is_a_device_error() -> None:
    """FI-15: the readiness init container finds the device not free (a stray process, or a
    critical Xid since) and exits 75: the Job fails at once, the attempt is a device error and
    is requeued elsewhere."""
    cluster = cluster_with_nodes()
    b = launched(cluster)
    pod = cluster.start_pod(NS, NAME)
    cluster.terminate(pod, READY_EXIT_BUSY, container="wait-for-device")
    assert cluster.reconcile_job(NS, NAME) == "failed"
    st = b.status(NAME, NS)
    assert st.outcome is Outcome.DEVICE_ERROR and st.reason == "DeviceBusy"


def test_launch_reads_the_node_for_its_hostname_label() -> None:
    cluster = cluster_with_nodes()
    cluster.nodes["gpu-a"].metadata.labels["kubernetes.io/hostname"] = "ip-10-0-0-7"
    b = backend(cluster)
    b.launch(spec())
    terms = cluster.job(NS, NAME).spec.template.spec.affinity.node_affinity
    expr = terms.required_during_scheduling_ignored_during_execution.node_selector_terms[
        0
    ].match_expressions[0]
    assert expr.values == ["ip-10-0-0-7"]


def test_it_loads_no_kubeconfig_until_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from portal.backends.kubernetes import KubernetesBackend

    loaded: list[str] = []
    monkeypatch.setattr(
        "kubernetes.config.load_incluster_config", lambda: loaded.append("in-cluster")
    )
    monkeypatch.setattr(
        "kubernetes.config.load_kube_config", lambda **kw: loaded.append("kubeconfig")
    )
    b = KubernetesBackend(in_cluster=True)
    assert loaded == []
    assert b.core is not None and b.batch is not None
    assert loaded == ["in-cluster"]
    assert KubernetesBackend(kubeconfig="/tmp/none").core is not None
    assert loaded == ["in-cluster", "kubeconfig"]


def test_from_settings(settings) -> None:  # noqa: ANN001
    from portal.backends.kubernetes import KubernetesBackend

    settings.K8S_IN_CLUSTER = True
    settings.IMAGE_PULL_TIMEOUT_SECONDS = 123
    settings.K8S_PORTAL_URL = "http://qm-web:8000"
    settings.K8S_READY_IMAGE = "portal:1"
    settings.K8S_FAIL_EXIT_CODES = "137,3"
    settings.K8S_POD_NAMESPACES = ""
    settings.K8S_WATCH_NAMESPACES = "team-a,team-b"
    b = KubernetesBackend.from_settings()
    assert b.in_cluster and b.image_pull_timeout_s == 123
    assert b.job_options.fail_exit_codes == (137, 3)
    assert b.pod_namespaces is None and b.watch_namespaces == ["team-a", "team-b"]
    assert b.auto_watch and b.watch_inventory
    settings.K8S_WATCH_INVENTORY = False
    assert not KubernetesBackend.from_settings().watch_inventory
    assert b.job_options.portal_url == "http://qm-web:8000"
    assert (
        b.job_options.ready_token_key and settings.SECRET_KEY not in b.job_options.ready_token_key
    )


@pytest.mark.django_db
def test_pools_come_from_the_pool_rows_node_selectors() -> None:
    from portal.backends import kubernetes as kb
    from portal.models import Pool

    Pool.objects.create(
        name="a100",
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_memory_mib=81920,
        node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
    )
    Pool.objects.create(
        name="l40s",
        gpu_model="NVIDIA-L40S",
        gpu_memory_mib=46068,
        node_selector={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
    )
    cluster = cluster_with_nodes()
    nodes = {
        n.name: n.pool
        for n in backend(cluster, pool_selectors=kb._pool_selectors_from_db).inventory()
    }
    assert nodes == {"gpu-a": "a100", "gpu-ts": "l40s"}
