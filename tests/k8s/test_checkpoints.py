"""Checkpoint storage on Kubernetes: a PVC per request, mounted by every attempt (docs/checkpoints.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import kubernetes_validate
import pytest

from portal.backends.base import GrantSpec, PodLaunch
from portal.k8s.jobs import checkpoint_pvc_build, job_build, job_to_dict
from portal.k8s.names import L_REQUEST, JobConflict
from portal.lib.readiness import attempt_token
from tests.fakes.fake_k8s import FakeCluster, apis
from tests.k8s.builders import NS, OPTIONS, backend, cluster_with_nodes, spec
from tests.k8s.pss import restricted_violations
from tests.k8s.test_job_build import KUBE_VERSION, container, env, pod

CKPT = spec(checkpoint_interval_s=600)


def job(s: Any = CKPT, options: Any = OPTIONS) -> dict[str, Any]:
    return job_to_dict(job_build(s, options, None))


def test_a_checkpointing_attempt_mounts_its_requests_claim_and_is_told_where() -> None:
    j = job()
    volumes = {v["name"]: v for v in pod(j)["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "qm-ckpt-42"}
    mounts = {m["name"]: m["mountPath"] for m in container(j)["volumeMounts"]}
    assert mounts["checkpoints"] == "/checkpoints"
    e = env(container(j))
    assert e["QM_CHECKPOINT_INTERVAL_S"] == "600"
    assert e["QM_CHECKPOINT_DIR"] == "/checkpoints"
    assert e["QM_CHECKPOINT_URL"] == (
        "http://qm-web.quartermaster.svc:8000/api/v1/attempts/7/checkpoint"
    )
    assert e["QM_ATTEMPT_TOKEN"] == attempt_token("test-key", NS, "qm-42-1", 7)
    assert "QM_RESUME" not in e
    # The user's own variables are still there; the readiness container gets nothing new.
    assert e["EPOCHS"] == "3"
    assert "QM_CHECKPOINT_DIR" not in env(container(j, "wait-for-device"))
    kubernetes_validate.validate(j, KUBE_VERSION, strict=True)
    assert restricted_violations(pod(j)) == []


def test_a_retry_after_preemption_resumes_from_the_same_claim() -> None:
    retry = replace(CKPT, name="qm-42-2", attempt_id=8, attempt_number=2, resume=True)
    j = job(retry)
    assert pod(j)["volumes"][-1]["persistentVolumeClaim"]["claimName"] == "qm-ckpt-42"
    e = env(container(j))
    assert e["QM_RESUME"] == "1"
    assert e["QM_CHECKPOINT_URL"].endswith("/api/v1/attempts/8/checkpoint")
    assert e["QM_ATTEMPT_TOKEN"] == attempt_token("test-key", NS, "qm-42-2", 8)


def test_an_attempt_without_checkpoints_gets_no_claim_and_no_checkpoint_env() -> None:
    j = job(spec())
    assert [v["name"] for v in pod(j)["volumes"]] == ["dshm"]
    assert not [k for k in env(container(j)) if k.startswith("QM_")]


def test_the_report_url_can_be_set_apart_from_the_readiness_check() -> None:
    options = replace(OPTIONS, portal_url="", checkpoint_portal_url="http://qm.example/")
    e = env(container(job(options=options)))
    assert e["QM_CHECKPOINT_URL"] == "http://qm.example/api/v1/attempts/7/checkpoint"
    # Without any URL the workload checkpoints but cannot report: no token handed out.
    e = env(container(job(options=replace(OPTIONS, portal_url=""))))
    assert "QM_CHECKPOINT_URL" not in e and "QM_ATTEMPT_TOKEN" not in e
    assert e["QM_CHECKPOINT_DIR"] == "/checkpoints"


def test_the_claim_has_the_configured_class_and_size_and_no_owner() -> None:
    options = replace(OPTIONS, checkpoint_storage_class="fast-rwo", checkpoint_size="200Gi")
    pvc = job_to_dict(checkpoint_pvc_build(CKPT, options))
    assert pvc["metadata"]["name"] == "qm-ckpt-42" and pvc["metadata"]["namespace"] == NS
    assert "ownerReferences" not in pvc["metadata"]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "fast-rwo",
        "resources": {"requests": {"storage": "200Gi"}},
    }
    assert pvc["metadata"]["labels"][L_REQUEST] == "42"
    kubernetes_validate.validate(pvc, KUBE_VERSION, strict=True)
    # No class set: the cluster's default class, not an empty one.
    assert "storageClassName" not in job_to_dict(checkpoint_pvc_build(CKPT, OPTIONS))["spec"]


def test_a_gangs_claim_is_shared_by_pods_on_several_nodes() -> None:
    gang = replace(
        CKPT,
        pods=(
            PodLaunch(0, "gpu-a", (GrantSpec(0, 1000),)),
            PodLaunch(1, "gpu-b", (GrantSpec(0, 1000),)),
        ),
    )
    pvc = job_to_dict(checkpoint_pvc_build(gang, OPTIONS))
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for member in gang.members():
        j = job(member)
        assert pod(j)["volumes"][-1]["persistentVolumeClaim"]["claimName"] == "qm-ckpt-42"
        # Every pod of the gang presents the attempt's token (named after the gang).
        assert env(container(j))["QM_ATTEMPT_TOKEN"] == attempt_token("test-key", NS, "qm-42-1", 7)


@pytest.fixture
def cluster() -> FakeCluster:
    return cluster_with_nodes()


def test_launch_creates_the_claim_once_and_every_attempt_mounts_it(cluster: FakeCluster) -> None:
    b = backend(cluster)
    b.launch(CKPT)
    assert list(cluster.pvcs) == [(NS, "qm-ckpt-42")]
    b.stop("qm-42-1", NS)
    cluster.finish_deletions()
    # The Job is gone; the claim is not: it belongs to the request.
    assert (NS, "qm-42-1") not in cluster.jobs and (NS, "qm-ckpt-42") in cluster.pvcs
    b.launch(replace(CKPT, name="qm-42-2", attempt_id=8, attempt_number=2, resume=True))
    assert list(cluster.pvcs) == [(NS, "qm-ckpt-42")]
    assert len(cluster.calls_of("create_namespaced_persistent_volume_claim")) == 2
    assert cluster.calls_of("read_namespaced_persistent_volume_claim")  # adopted after 409
    claim = cluster.job(NS, "qm-42-2").spec.template.spec.volumes[-1].persistent_volume_claim
    assert claim.claim_name == "qm-ckpt-42"


def test_a_claim_of_another_request_is_a_conflict(cluster: FakeCluster) -> None:
    core, _ = apis(cluster)
    foreign = checkpoint_pvc_build(replace(CKPT, request_id=43), OPTIONS)
    foreign.metadata.name = "qm-ckpt-42"
    core.create_namespaced_persistent_volume_claim(NS, foreign)
    with pytest.raises(JobConflict):
        backend(cluster).launch(CKPT)
    assert (NS, "qm-42-1") not in cluster.jobs


def test_checkpoints_delete_removes_the_claim_and_tolerates_its_absence(
    cluster: FakeCluster,
) -> None:
    b = backend(cluster)
    b.launch(CKPT)
    b.checkpoints_delete(42, NS)
    assert cluster.pvcs == {}
    b.checkpoints_delete(42, NS)  # already gone: fine
    assert len(cluster.calls_of("delete_namespaced_persistent_volume_claim")) == 2


def test_no_claim_for_a_request_without_checkpoints(cluster: FakeCluster) -> None:
    backend(cluster).launch(spec())
    assert cluster.pvcs == {}
