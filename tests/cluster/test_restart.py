"""An apiserver restart in the middle of a launch: the create reached etcd but its answer was
lost, so the launch is driven again and meets `409 Conflict` on the deterministic name, which
the backend adopts when the labels say it is the same attempt. The fake-based twin is
tests/k8s/test_backend.py's adoption test."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from portal.backends.base import Outcome
from portal.backends.kubernetes import KubernetesBackend
from portal.k8s.jobs import job_build, job_create
from portal.k8s.names import JobConflict
from tests.cluster.conftest import JOB_OPTIONS
from tests.cluster.kube import Cluster, wait_for
from tests.cluster.specs import launch_spec


def test_a_launch_lost_to_an_apiserver_restart_is_adopted_on_409(
    backend: KubernetesBackend, cluster: Cluster
) -> None:
    spec = launch_spec(node="a100-0", image="qm.test/ok")
    job = job_build(spec, JOB_OPTIONS, backend._node_facts(spec.node))
    batch = backend.batch
    created: list[object] = []

    real_create = batch.create_namespaced_job

    def create_then_lose_the_answer(ns: str, body: object, **kw: object) -> object:
        # The create is persisted, then the apiserver goes away before the client hears back.
        created.append(real_create(ns, body, **kw))
        restart = threading.Thread(target=cluster.script, args=("restart-apiserver",))
        restart.start()
        restart.join()
        raise ConnectionResetError("connection reset by peer")

    batch.create_namespaced_job = create_then_lose_the_answer  # type: ignore[method-assign]
    try:
        with pytest.raises(ConnectionResetError):
            job_create(batch, job)
    finally:
        del batch.create_namespaced_job
    assert len(created) == 1
    # the reconciler drives the launch again: 409 on the deterministic name, adopted
    backend.launch(spec)
    jobs = (
        cluster.batch()
        .list_namespaced_job(
            spec.namespace, label_selector=f"app.kubernetes.io/instance={spec.name}"
        )
        .items
    )
    assert [j.metadata.uid for j in jobs] == [created[0].metadata.uid]  # type: ignore[attr-defined]
    wait_for(
        "the adopted attempt to succeed",
        lambda: backend.status(spec.name, spec.namespace).outcome == Outcome.SUCCEEDED,
        30,
    )


def test_a_409_for_another_attempt_is_a_conflict_not_an_adoption(
    backend: KubernetesBackend,
) -> None:
    spec = launch_spec(node="a100-0", image="qm.test/ok")
    backend.launch(spec)
    other = replace(spec, attempt_id=spec.attempt_id + 100000)
    with pytest.raises(JobConflict, match="quartermaster.io/attempt-id"):
        backend.launch(other)
