"""A gang as one JobSet: the manifest (valid against the vendored JobSet CRD's schema, its
Job against Kubernetes' own), and the backend's launch, adoption, status, logs and stop
against the in-memory fake with a JobSet store that plays the JobSet controller.

Real-cluster twin: tests/cluster/test_jobset.py (the CRD applied, the JobSet created)."""

from __future__ import annotations

import copy
import functools
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from portal.backends.base import GrantSpec, LaunchSpec, Outcome, PodLaunch
from portal.backends.kubernetes import KubernetesBackend
from portal.k8s.jobset import (
    JOB_INDEX,
    JOBSET_NAME,
    jobset_build,
    jobset_fits,
    jobset_installed,
    master_addr,
)
from portal.k8s.names import JobConflict
from tests.fakes.fake_k8s import FakeBatchV1Api, FakeCluster, api_error
from tests.k8s.builders import NS, OPTIONS, backend, cluster_with_nodes, spec
from tests.k8s.pss import restricted_violations
from tests.k8s.test_job_build import KUBE_VERSION

CRD = Path(__file__).resolve().parents[1] / "fixtures" / "jobset.x-k8s.io_jobsets.yaml"
NAME = "qm-42-1"
G0 = (GrantSpec(0, 1000), GrantSpec(1, 1000))
G1 = (GrantSpec(2, 1000), GrantSpec(3, 1000))


def gang(**kw: Any) -> LaunchSpec:
    return spec(pods=(PodLaunch(0, "gpu-a", G0), PodLaunch(1, "gpu-b", G1)), **kw)


@functools.cache
def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the CRD's structural schema does not declare (the API server would prune
    them silently): what kubernetes-validate's strict mode catches for built-in kinds."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None or extra is None:
                out.append(f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            out += unknown_fields(value, schema["items"], f"{path}[{i}]")
    return out


def validate_jobset(js: dict[str, Any]) -> None:
    body = {k: v for k, v in js.items() if k != "metadata"}
    jsonschema.validate(body, crd_schema())
    assert unknown_fields(body, crd_schema()) == []


def job_spec(js: dict[str, Any]) -> dict[str, Any]:
    [rj] = js["spec"]["replicatedJobs"]
    return rj["template"]["spec"]  # type: ignore[no-any-return]


def pod_spec(js: dict[str, Any]) -> dict[str, Any]:
    return job_spec(js)["template"]["spec"]  # type: ignore[no-any-return]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or ()}


# -- the manifest ------------------------------------------------------------------------


def test_the_jobset_validates_against_the_vendored_crd_schema() -> None:
    validate_jobset(jobset_build(gang(), OPTIONS))


def test_the_crd_check_catches_a_misspelt_field() -> None:
    bad = jobset_build(gang(), OPTIONS)
    bad["spec"]["replicatedJobs"][0]["replica"] = 2
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeNmae"] = "x"
    assert unknown_fields({"spec": bad["spec"]}, crd_schema()) == [
        ".spec.replicatedJobs[0].template.spec.template.spec.nodeNmae",
        ".spec.replicatedJobs[0].replica",
    ]


def test_its_job_validates_strictly_and_its_pod_is_restricted() -> None:
    js = jobset_build(gang(), OPTIONS)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{NAME}-pod-0", "namespace": NS},
        "spec": job_spec(js),
    }
    kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
    assert restricted_violations(pod_spec(js)) == []
    assert pod_spec(js)["automountServiceAccountToken"] is False


def test_a_gang_is_one_replicated_job_of_one_pod_per_rank() -> None:
    js = jobset_build(gang(), OPTIONS)
    assert (js["apiVersion"], js["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert js["metadata"]["name"] == NAME
    [rj] = js["spec"]["replicatedJobs"]
    assert (rj["name"], rj["replicas"]) == ("pod", 2)
    assert (job_spec(js)["completions"], job_spec(js)["parallelism"]) == (1, 1)
    # The Job controller names an Indexed Job's pod <job>-<index>: MASTER_ADDR's host.
    assert job_spec(js)["completionMode"] == "Indexed"
    assert "ttlSecondsAfterFinished" not in job_spec(js)
    assert js["spec"]["ttlSecondsAfterFinished"] == OPTIONS.ttl_seconds_after_finished
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert js["spec"]["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    # The controller sets hostname and subdomain; the pod's own would fight it.
    assert "hostname" not in pod_spec(js) and "subdomain" not in pod_spec(js)
    labels = job_spec(js)["template"]["metadata"]["labels"]
    assert labels["quartermaster.io/gang"] == NAME
    assert labels["app.kubernetes.io/instance"] == NAME
    assert "quartermaster.io/rank" not in labels
    grants = json.loads(js["metadata"]["annotations"]["quartermaster.io/grants"])
    assert [[g["device"] for g in rank] for rank in grants] == [[0, 1], [2, 3]]


def test_rank_comes_from_the_job_index_and_rank_0_is_the_master() -> None:
    js = jobset_build(gang(), OPTIONS)
    [main] = pod_spec(js)["containers"]
    e = env_of(main)
    index = {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX}']"}}
    assert e["RANK"] == e["PET_NODE_RANK"] == index
    assert master_addr(gang()) == f"{NAME}-pod-0-0.{NAME}.{NS}.svc"
    assert e["MASTER_ADDR"] == e["PET_MASTER_ADDR"] == master_addr(gang())
    assert (e["WORLD_SIZE"], e["PET_NNODES"], e["PET_NPROC_PER_NODE"]) == ("2", "2", "2")
    assert e["MASTER_PORT"] == "29500"


def test_the_gang_is_pinned_to_the_packers_nodes_one_pod_per_node() -> None:
    js = jobset_build(gang(), OPTIONS)
    affinity = pod_spec(js)["affinity"]
    [term] = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a", "gpu-b"]}
    ]
    [anti] = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == {
        "labelSelector": {"matchLabels": {"quartermaster.io/gang": NAME}},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert "nodeName" not in pod_spec(js)


def test_the_readiness_check_names_the_node_the_pod_landed_on() -> None:
    js = jobset_build(gang(), OPTIONS)
    [ready] = pod_spec(js)["initContainers"]
    names = [e["name"] for e in ready["env"]]
    # $(QM_NODE_NAME) expands only from a variable defined before it.
    assert names.index("QM_NODE_NAME") < names.index("QM_READY_URL")
    e = env_of(ready)
    assert e["QM_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert e["QM_READY_URL"] == (
        "http://qm-web.quartermaster.svc:8000/api/v1/agent/attempts/7/ready?node=$(QM_NODE_NAME)"
    )


@pytest.mark.parametrize(
    "pods",
    [
        (PodLaunch(0, "gpu-a", G0), PodLaunch(1, "gpu-a", G1)),  # two pods on one node
        (PodLaunch(0, "gpu-a", G0), PodLaunch(1, "gpu-b", G1[:1])),  # different sizes
    ],
)
def test_a_gang_one_template_cannot_serve_stays_jobs(pods: tuple[PodLaunch, ...]) -> None:
    s = spec(pods=pods)
    assert not jobset_fits(s, OPTIONS)
    with pytest.raises(ValueError, match="as Jobs"):
        jobset_build(s, OPTIONS)


# -- detection ---------------------------------------------------------------------------


class Discovery:
    """The CustomObjectsApi's discovery: the resources a group version serves, or an error."""

    def __init__(self, answer: list[str] | ApiException) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str]] = []

    def get_api_resources(self, group: str, version: str) -> client.V1APIResourceList:
        self.calls.append((group, version))
        if isinstance(self.answer, ApiException):
            raise self.answer
        return client.V1APIResourceList(
            group_version=f"{group}/{version}",
            resources=[
                client.V1APIResource(
                    name=n, kind="JobSet", namespaced=True, singular_name="", verbs=["get"]
                )
                for n in self.answer
            ],
        )


ASKED = [("jobset.x-k8s.io", "v1alpha2")]


def test_discovery_finds_jobsets_or_not() -> None:
    found = Discovery(["jobsets", "jobsets/status"])
    assert jobset_installed(found) is True
    assert found.calls == ASKED
    assert jobset_installed(Discovery(api_error(404))) is False
    assert jobset_installed(Discovery([])) is False
    with pytest.raises(ApiException):
        jobset_installed(Discovery(api_error(403)))


# -- the backend -------------------------------------------------------------------------


class FakeJobSets(Discovery):
    """CustomObjectsApi over JobSets, and enough of the JobSet controller: `reconcile`
    makes each rank's Job from the replicated Job's template, labelled as it does."""

    def __init__(self, cluster: FakeCluster, discovery: Any = None) -> None:
        super().__init__(["jobsets"] if discovery is None else discovery)
        self.cluster = cluster
        self.store: dict[tuple[str, str], dict[str, Any]] = {}
        self.deletes: list[dict[str, Any]] = []

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        key = (namespace, body["metadata"]["name"])
        if key in self.store:
            raise api_error(409, "AlreadyExists")
        self.store[key] = copy.deepcopy(body)
        return self.store[key]

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        if (namespace, name) not in self.store:
            raise api_error(404, "NotFound")
        return copy.deepcopy(self.store[(namespace, name)])

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **kw: Any
    ) -> None:
        if (namespace, name) not in self.store:
            raise api_error(404, "NotFound")
        self.deletes.append({"name": name, **kw})
        del self.store[(namespace, name)]

    def reconcile(self, namespace: str, name: str) -> list[str]:
        js = self.store[(namespace, name)]
        [rj] = js["spec"]["replicatedJobs"]
        made = []
        for index in range(rj["replicas"]):
            job_name = f"{name}-{rj['name']}-{index}"
            body = copy.deepcopy(rj["template"])
            tags = {JOBSET_NAME: name, JOB_INDEX: str(index)}
            for meta in (body.setdefault("metadata", {}), body["spec"]["template"]["metadata"]):
                meta.setdefault("labels", {}).update(tags)
                meta.setdefault("annotations", {}).update(tags)
            body["metadata"].update(name=job_name, namespace=namespace)
            job = client.ApiClient()._ApiClient__deserialize(body, "V1Job")  # noqa: SLF001
            job.api_version, job.kind = "batch/v1", "Job"
            FakeBatchV1Api(self.cluster).create_namespaced_job(namespace, job)
            made.append(job_name)
        return made

    def condition(self, namespace: str, name: str, type_: str, **kw: str) -> None:
        status = self.store[(namespace, name)].setdefault("status", {})
        status.setdefault("conditions", []).append({"type": type_, "status": "True", **kw})


@pytest.fixture
def cluster() -> FakeCluster:
    return cluster_with_nodes()


def jobset_backend(cluster: FakeCluster, **kw: Any) -> tuple[KubernetesBackend, FakeJobSets]:
    jobsets = FakeJobSets(cluster, kw.pop("discovery", None))
    kw.setdefault("gang_api", "auto")
    return backend(cluster, custom=jobsets, **kw), jobsets


def started(cluster: FakeCluster, jobsets: FakeJobSets) -> list[client.V1Pod]:
    pods = []
    for node, job in zip(("gpu-b", "gpu-a"), jobsets.reconcile(NS, NAME), strict=True):
        pods.append(cluster.start_pod(NS, job, node=node))
    return pods


def test_auto_launches_a_gang_as_one_jobset_where_the_crd_is_served(
    cluster: FakeCluster,
) -> None:
    b, jobsets = jobset_backend(cluster)
    assert b.gang_api_in_use() == "jobset"
    b.launch(gang())
    assert list(jobsets.store) == [(NS, NAME)]
    assert cluster.jobs == {} and cluster.services == {}
    # Asked once, at the first question: the answer is kept.
    b.launch(gang())
    assert jobsets.calls == ASKED


def test_auto_launches_jobs_where_the_crd_is_not_served(cluster: FakeCluster) -> None:
    b, jobsets = jobset_backend(cluster, discovery=[])
    assert b.gang_api_in_use() == "jobs"
    b.launch(gang())
    assert jobsets.store == {}
    assert sorted(cluster.jobs) == [(NS, f"{NAME}-0"), (NS, f"{NAME}-1")]


def test_a_failed_discovery_launches_jobs_and_asks_again(cluster: FakeCluster) -> None:
    b, jobsets = jobset_backend(cluster, discovery=api_error(503))
    assert b.gang_api_in_use() == "jobs"
    jobsets.answer = ["jobsets"]
    assert b.gang_api_in_use() == "jobset"


def test_k8s_gang_api_jobs_never_asks(cluster: FakeCluster) -> None:
    b, jobsets = jobset_backend(cluster, gang_api="jobs")
    b.launch(gang())
    assert jobsets.store == {} and jobsets.calls == []
    with pytest.raises(ValueError, match="K8S_GANG_API"):
        jobset_backend(cluster, gang_api="jobsets")


def test_a_single_pod_stays_one_job(cluster: FakeCluster) -> None:
    b, jobsets = jobset_backend(cluster, gang_api="jobset")
    b.launch(spec())
    assert jobsets.store == {} and list(cluster.jobs) == [(NS, NAME)]


def test_a_gang_that_does_not_fit_one_template_is_jobs_with_status_and_stop(
    cluster: FakeCluster,
) -> None:
    b, jobsets = jobset_backend(cluster, gang_api="jobset")
    b.launch(spec(pods=(PodLaunch(0, "gpu-a", G0), PodLaunch(1, "gpu-a", G1))))
    assert jobsets.store == {} and len(cluster.jobs) == 2
    # No JobSet of that name: status and stop take the Jobs path.
    assert b.status(NAME, NS, pods=2).outcome is Outcome.PENDING
    b.stop(NAME, NS, pods=2)
    deleted = [c["name"] for c in cluster.calls_of("delete_namespaced_job")]
    assert deleted == [f"{NAME}-0", f"{NAME}-1"]
    assert [c["name"] for c in cluster.calls_of("delete_namespaced_service")] == [NAME]


def test_a_redelivered_launch_adopts_the_jobset_of_the_same_attempt(
    cluster: FakeCluster,
) -> None:
    b, jobsets = jobset_backend(cluster, gang_api="jobset")
    b.launch(gang())
    b.launch(gang())
    assert len(jobsets.store) == 1
    with pytest.raises(JobConflict):
        b.launch(replace(gang(), attempt_id=8))


def test_status_follows_the_jobset_its_jobs_and_pods(cluster: FakeCluster) -> None:
    b, jobsets = jobset_backend(cluster, gang_api="jobset")
    assert b.status(NAME, NS, pods=2).outcome is Outcome.MISSING
    b.launch(gang())
    # The controller has not made the Jobs yet: starting, not missing.
    st = b.status(NAME, NS, pods=2)
    assert (st.outcome, st.active_pods) == (Outcome.PENDING, 2)
    pods = started(cluster, jobsets)
    assert b.status(NAME, NS, pods=2).outcome is Outcome.PENDING
    cluster.run_pod(pods[0])
    assert b.status(NAME, NS, pods=2).outcome is Outcome.PENDING
    cluster.run_pod(pods[1])
    st = b.status(NAME, NS, pods=2)
    assert (st.outcome, st.active_pods) == (Outcome.RUNNING, 2)
    cluster.terminate(pods[1], 137, "OOMKilled")
    st = b.status(NAME, NS, pods=2)
    assert st.outcome is Outcome.OOM and st.message.startswith("pod 1:")


def test_the_jobsets_conditions_decide_success_and_failure(cluster: FakeCluster) -> None:
    b, jobsets = jobset_backend(cluster, gang_api="jobset")
    b.launch(gang())
    for pod in started(cluster, jobsets):
        cluster.run_pod(pod)
    jobsets.condition(NS, NAME, "Failed", reason="FailedJobs", message="job pod-1 failed")
    st = b.status(NAME, NS, pods=2)
    assert (st.outcome, st.reason, st.message) == (Outcome.FAILED, "FailedJobs", "job pod-1 failed")
    jobsets.store[(NS, NAME)]["status"] = {"terminalState": "Completed"}
    st = b.status(NAME, NS, pods=2)
    assert (st.outcome, st.exit_code) == (Outcome.SUCCEEDED, 0)


def test_logs_of_a_rank_read_that_ranks_pod(cluster: FakeCluster) -> None:
    b, jobsets = jobset_backend(cluster, gang_api="jobset")
    b.launch(gang())
    pods = started(cluster, jobsets)
    for rank, pod in enumerate(pods):
        cluster.run_pod(pod)
        cluster.pod_logs[(NS, pod.metadata.name)] = f"hello from rank {rank}\n"
    assert b.logs(NAME, NS, pods=2) == "hello from rank 0\n"
    assert b.logs(NAME, NS, pods=2, pod=1) == "hello from rank 1\n"
    cluster.record_event("Job", f"{NAME}-pod-1", NS, "FailedCreate", "exceeded quota", "Warning")
    cluster.tick(1)
    cluster.record_event("Pod", pods[0].metadata.name, NS, "Started", "Started container main")
    assert [(e.object, e.reason) for e in b.events(NAME, NS, pods=2)] == [
        (f"Job/{NAME}-pod-1", "FailedCreate"),
        (f"Pod/{pods[0].metadata.name}", "Started"),
    ]


def test_stop_deletes_the_jobset_in_the_foreground(cluster: FakeCluster) -> None:
    b, jobsets = jobset_backend(cluster, gang_api="jobset")
    b.launch(gang())
    b.stop(NAME, NS, grace_seconds=45, pods=2)
    assert jobsets.deletes == [
        {"name": NAME, "grace_period_seconds": 45, "propagation_policy": "Foreground"}
    ]
    assert b.status(NAME, NS, pods=2).outcome is Outcome.MISSING
    b.stop(NAME, NS, pods=2)  # gone already: fine


def test_status_reads_each_rank_from_the_watch_once_synced(cluster: FakeCluster) -> None:
    """The reconciler asks often: the ranks' Jobs and pods come from the watch's cache, so
    a status costs one GET (the JobSet), not one per rank."""
    from tests.k8s.test_watch import drive, watcher

    b, jobsets = jobset_backend(cluster, gang_api="jobset", watch_namespaces=[NS])
    w = watcher(cluster)
    b.watcher, b.watch_pid = w, os.getpid()
    drive(w)
    b.launch(gang())
    pods = started(cluster, jobsets)
    for pod in pods:
        cluster.run_pod(pod)
    drive(w)
    reads = (
        len(cluster.calls_of("read_namespaced_job")),
        len(cluster.calls_of("list_namespaced_pod")),
    )
    st = b.status(NAME, NS, pods=2)
    assert (st.outcome, st.active_pods) == (Outcome.RUNNING, 2)
    assert (
        len(cluster.calls_of("read_namespaced_job")),
        len(cluster.calls_of("list_namespaced_pod")),
    ) == reads
    cluster.terminate(pods[0], 137, "OOMKilled")
    drive(w)
    st = b.status(NAME, NS, pods=2)
    assert st.outcome is Outcome.OOM and st.message.startswith("pod 0:")


def test_a_jobset_being_deleted_counts_its_gone_ranks_as_gone(cluster: FakeCluster) -> None:
    """Foreground deletion keeps the JobSet until its Jobs are gone: a rank without its Job
    then has ended, not yet to start, so the stop is seen to finish (no active pods)."""
    b, jobsets = jobset_backend(cluster, gang_api="jobset")
    b.launch(gang())
    jobsets.store[(NS, NAME)]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    st = b.status(NAME, NS, pods=2)
    assert (st.outcome, st.active_pods) == (Outcome.MISSING, 0)
