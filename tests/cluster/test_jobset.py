"""A gang with the JobSet CRD applied (the vendored jobset.x-k8s.io v0.8.1 CRD in
tests/fixtures): one JobSet, admitted by the real API server against the CRD's schema and
the chart's RBAC; without K8S_GANG_API=jobset-or-auto, still N Jobs and a Service.

The JobSet controller is not run here (it is a separate operator with its own webhooks).
The test does its part, as it does: it creates each rank's Job from the replicated Job's
template, labelled and annotated with the JobSet's name and the job index, owned by the
JobSet; the real Job controller, kube-scheduler and kwok then run the pods. It writes the
JobSet's status, and the backend reads its outcome from that. The fake-based twin is
tests/k8s/test_jobset.py.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from portal.backends.base import GrantSpec, LaunchSpec, Outcome, PodLaunch
from portal.backends.kubernetes import KubernetesBackend
from portal.k8s.jobset import (
    GROUP,
    JOB_INDEX,
    JOBSET_NAME,
    PLURAL,
    VERSION,
    jobset_build,
    jobset_installed,
    master_addr,
)
from tests.cluster.conftest import JOB_OPTIONS
from tests.cluster.kube import Cluster, apply_one, can_i, wait_for
from tests.cluster.nodes import POOL_SELECTORS
from tests.cluster.specs import launch_spec

CRD = Path(__file__).resolve().parents[1] / "fixtures" / "jobset.x-k8s.io_jobsets.yaml"
CRD_NAME = "jobsets.jobset.x-k8s.io"


@pytest.fixture(scope="module")
def jobset_crd(cluster: Cluster, chart: list[dict[str, Any]]) -> Iterator[None]:
    """The JobSet CRD for this module only: the other cluster tests' gangs are Jobs."""
    apply_one(cluster.dynamic(), yaml.safe_load(CRD.read_text()))
    ext = client.ApiextensionsV1Api(cluster.api())
    wait_for(
        f"CRD {CRD_NAME} established",
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(CRD_NAME).status.conditions or ()
        ),
        30,
    )
    # Established is written before discovery serves the new group: the backend asks
    # discovery, so wait for that too (a slow apiserver answered "jobs" in between).
    wait_for(
        f"{PLURAL} served by discovery",
        lambda: jobset_installed(client.CustomObjectsApi(cluster.api())),
        30,
    )
    yield
    ext.delete_custom_resource_definition(CRD_NAME)

    def gone() -> bool:
        try:
            ext.read_custom_resource_definition(CRD_NAME)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(f"CRD {CRD_NAME} deleted", gone, 60)


def make_backend(qm_api: client.ApiClient, gang_api: str = "auto") -> KubernetesBackend:
    """A backend of its own: the session's keeps what it found before the CRD came."""
    return KubernetesBackend(
        core=client.CoreV1Api(qm_api),
        batch=client.BatchV1Api(qm_api),
        custom=client.CustomObjectsApi(qm_api),
        job_options=JOB_OPTIONS,
        pool_selectors=POOL_SELECTORS,
        image_pull_timeout_s=5,
        gang_api=gang_api,
    )


def gang() -> LaunchSpec:
    base = launch_spec(node="a100-0")
    return replace(
        base,
        pods=(
            PodLaunch(0, "a100-0", (GrantSpec(0, 1000),)),
            PodLaunch(1, "a100-1", (GrantSpec(0, 1000),)),
        ),
    )


def play_the_jobset_controller(cluster: Cluster, js: dict[str, Any]) -> list[str]:
    """What the JobSet controller does first: one Job per index of the replicated Job,
    labelled and annotated as it does, owned by the JobSet (the headless Service too)."""
    meta = js["metadata"]
    ns, name = meta["namespace"], meta["name"]
    [rj] = js["spec"]["replicatedJobs"]
    batch, core = cluster.batch(), cluster.core()
    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "name": name,
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": name, "ownerReferences": [owner]},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {JOBSET_NAME: name},
            },
        },
    )
    names = []
    for index in range(rj["replicas"]):
        job = copy.deepcopy(rj["template"])
        tags = {JOBSET_NAME: name, JOB_INDEX: str(index)}
        for m in (
            job.setdefault("metadata", {}),
            job["spec"]["template"].setdefault("metadata", {}),
        ):
            m.setdefault("labels", {}).update(tags)
            m.setdefault("annotations", {}).update(tags)
        job["metadata"].update(
            name=f"{name}-{rj['name']}-{index}", namespace=ns, ownerReferences=[owner]
        )
        # The controller sets each pod's DNS name under the JobSet's Service.
        pod = job["spec"]["template"]["spec"]
        pod["subdomain"] = name
        batch.create_namespaced_job(ns, job)
        names.append(job["metadata"]["name"])
    return names


def test_without_the_crd_auto_launches_gangs_as_jobs(
    qm_api: client.ApiClient, chart: list[dict[str, Any]]
) -> None:
    """First in this module: before `jobset_crd` applies the CRD (the other cluster tests
    run without it)."""
    assert make_backend(qm_api).gang_api_in_use() == "jobs"


def test_discovery_finds_the_crd_once_applied(qm_api: client.ApiClient, jobset_crd: None) -> None:
    assert make_backend(qm_api).gang_api_in_use() == "jobset"
    for verb in ("create", "get", "delete"):
        assert can_i(qm_api, verb, PLURAL, "team-a", group=GROUP), verb
    assert not can_i(qm_api, "update", PLURAL, "team-a", group=GROUP)


def test_the_api_server_accepts_the_jobset_strictly(cluster: Cluster, jobset_crd: None) -> None:
    js = jobset_build(gang(), JOB_OPTIONS)
    custom = client.CustomObjectsApi(cluster.api())
    # Strict field validation against the CRD's schema: an unknown field is an error.
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "team-a", PLURAL, js, dry_run="All", field_validation="Strict"
    )
    js["spec"]["replicatedJobs"][0]["replica"] = 2
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "team-a", PLURAL, js, dry_run="All", field_validation="Strict"
        )
    assert "replica" in str(refused.value.body)


def test_a_gang_is_one_jobset_whose_status_the_backend_reads(
    qm_api: client.ApiClient, cluster: Cluster, gpu_nodes: list[dict[str, Any]], jobset_crd: None
) -> None:
    backend = make_backend(qm_api)
    spec = gang()
    backend.launch(spec)
    backend.launch(spec)  # a redelivered launch adopts it
    custom = client.CustomObjectsApi(cluster.api())
    js = custom.get_namespaced_custom_object(GROUP, VERSION, spec.namespace, PLURAL, spec.name)
    [rj] = js["spec"]["replicatedJobs"]
    assert (rj["name"], rj["replicas"]) == ("pod", 2)
    assert rj["template"]["spec"]["completions"] == rj["template"]["spec"]["parallelism"] == 1
    assert (
        cluster.batch()
        .list_namespaced_job(
            spec.namespace, label_selector=f"app.kubernetes.io/instance={spec.name}"
        )
        .items
        == []
    )
    # The JobSet exists, its Jobs do not yet: starting.
    assert backend.status(spec.name, spec.namespace, pods=2).outcome is Outcome.PENDING

    play_the_jobset_controller(cluster, js)
    core = cluster.core()

    def bound() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(
            spec.namespace, label_selector=f"{JOBSET_NAME}={spec.name}"
        ).items
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else None

    pods = wait_for("both ranks' pods bound", bound, 60)
    # One pod on each of the packer's nodes (the anti-affinity), whichever rank is where.
    assert sorted(p.spec.node_name for p in pods) == ["a100-0", "a100-1"]
    # Rank 0's DNS name is MASTER_ADDR: the Indexed Job names its pod, the subdomain is the
    # JobSet's (its headless Service).
    rank0 = next(p for p in pods if p.metadata.annotations[JOB_INDEX] == "0")
    assert (rank0.spec.hostname, rank0.spec.subdomain) == (f"{spec.name}-pod-0-0", spec.name)
    assert master_addr(spec) == f"{spec.name}-pod-0-0.{spec.name}.{spec.namespace}.svc"
    env = {e.name: e for e in rank0.spec.containers[0].env}
    assert env["MASTER_ADDR"].value == master_addr(spec)
    assert env["RANK"].value_from.field_ref.field_path == f"metadata.annotations['{JOB_INDEX}']"
    wait_for(
        "the gang running",
        lambda: backend.status(spec.name, spec.namespace, pods=2).outcome is Outcome.RUNNING,
        60,
    )
    assert backend.logs(spec.name, spec.namespace, pods=2, pod=1) == ""  # kwok prints nothing

    # The controller's verdict, on the status subresource.
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        spec.namespace,
        PLURAL,
        spec.name,
        {"status": {"terminalState": "Completed"}},
    )
    st = backend.status(spec.name, spec.namespace, pods=2)
    assert (st.outcome, st.exit_code) == (Outcome.SUCCEEDED, 0)

    backend.stop(spec.name, spec.namespace, grace_seconds=0, pods=2)
    wait_for(
        "the JobSet, its Jobs and pods gone",
        lambda: (
            backend.status(spec.name, spec.namespace, pods=2).outcome is Outcome.MISSING
            and not core.list_namespaced_pod(
                spec.namespace, label_selector=f"{JOBSET_NAME}={spec.name}"
            ).items
        ),
        90,
    )


def test_k8s_gang_api_jobs_keeps_a_gang_as_jobs_with_the_crd_applied(
    qm_api: client.ApiClient, cluster: Cluster, gpu_nodes: list[dict[str, Any]], jobset_crd: None
) -> None:
    backend = make_backend(qm_api, gang_api="jobs")
    spec = gang()
    backend.launch(spec)
    jobs = cluster.batch().list_namespaced_job(
        spec.namespace, label_selector=f"quartermaster.io/gang={spec.name}"
    )
    assert sorted(j.metadata.name for j in jobs.items) == [f"{spec.name}-0", f"{spec.name}-1"]
    custom = client.CustomObjectsApi(cluster.api())
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, spec.namespace, PLURAL)
    assert spec.name not in [j["metadata"]["name"] for j in listed["items"]]
    backend.stop(spec.name, spec.namespace, grace_seconds=0, pods=2)
    wait_for(
        "the gang's Jobs gone",
        lambda: backend.status(spec.name, spec.namespace, pods=2).outcome is Outcome.MISSING,
        60,
    )
