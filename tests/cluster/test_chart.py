"""The chart applied to a real apiserver: strict server-side apply, Pod Security `restricted`
on team namespaces, ResourceQuota on GPUs, and the ValidatingAdmissionPolicy's CEL compiled
and enforced. The offline twins (rendering, kubernetes-validate, CEL by reading) are in
tests/chart/test_chart.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import DynamicApiError

from portal.k8s.jobs import job_build
from tests.chart.chart import NAMESPACE, kinds, one
from tests.cluster.conftest import CHART_VALUES, JOB_OPTIONS, WORKLOAD_KINDS
from tests.cluster.kube import Cluster, apply_one, wait_for
from tests.cluster.specs import launch_spec

FULL = "qm-quartermaster"


def _job(ns: str, **pod: Any) -> dict[str, Any]:
    """A Job as someone with kubectl in a team namespace might write it."""
    spec = {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "main",
                "image": "qm.test/ok",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }
    spec.update(pod)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "by-hand", "namespace": ns},
        "spec": {"template": {"spec": spec}},
    }


def test_every_manifest_is_accepted_by_strict_server_side_apply(
    cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    """The fixture applied all of it (workloads as dryRun=All); here: it is really there."""
    dyn = cluster.dynamic()
    for doc in chart:
        if doc["kind"] in WORKLOAD_KINDS:
            continue
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        ns = doc["metadata"].get("namespace", NAMESPACE) if res.namespaced else None
        got = res.get(name=doc["metadata"]["name"], namespace=ns)
        assert got.metadata.name == doc["metadata"]["name"]
    assert {d["kind"] for d in chart} >= {"ServiceMonitor", "PrometheusRule", "Deployment"}


def test_strict_field_validation_rejects_an_unknown_field(
    cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    cm = copy.deepcopy(one(chart, "ConfigMap", f"{FULL}-config"))
    cm["datta"] = {"X": "1"}
    # server-side apply types the patch against the schema: an undeclared field is refused
    with pytest.raises(DynamicApiError, match=r"\.datta: field not declared in schema"):
        apply_one(cluster.dynamic(), cm, dry_run=True)


def test_crd_kinds_validate_against_their_published_schema(
    cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    [sm] = kinds(chart, "ServiceMonitor")
    bad = copy.deepcopy(sm)
    bad["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(DynamicApiError, match=r"intervall: field not declared in schema"):
        apply_one(cluster.dynamic(), bad, dry_run=True)
    [rule] = kinds(chart, "PrometheusRule")
    got = (
        cluster.dynamic()
        .resources.get(api_version="monitoring.coreos.com/v1", kind="PrometheusRule")
        .get(name=rule["metadata"]["name"], namespace=NAMESPACE)
    )
    assert [g["name"] for g in got.spec.groups] == [g["name"] for g in rule["spec"]["groups"]]


def test_team_namespaces_enforce_pod_security_restricted(
    cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    ns = cluster.core().read_namespace("team-a")
    assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="root-pod"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="qm.test/ok")]),
    )
    with pytest.raises(ApiException) as exc:
        cluster.core().create_namespaced_pod("team-a", pod, dry_run="All")
    assert exc.value.status == 403
    message = json.loads(exc.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message
    assert "runAsNonRoot != true" in message


def test_the_admission_policy_rejects_a_job_that_breaks_it(
    cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    dyn = cluster.dynamic()
    wait_for(
        "the ValidatingAdmissionPolicy to be type-checked",
        lambda: (
            dyn.resources.get(
                api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicy"
            )
            .get(name=f"{FULL}-workload-guard")
            .status
        ),
    )
    env_all = _job("team-a")
    env_all["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    ]
    cases = {
        "NVIDIA_* environment variables are not allowed": env_all,
        "spec.nodeName is not allowed": _job("team-a", nodeName="a100-0"),
        "hostPath volumes are not allowed": _job(
            "team-a", volumes=[{"name": "h", "hostPath": {"path": "/dev"}}]
        ),
    }

    def enforced() -> bool:
        # A type-checked policy is not yet enforced everywhere: the apiserver picks the
        # policy and its binding up from its informers a moment later.
        try:
            apply_one(dyn, cases["spec.nodeName is not allowed"], dry_run=True)
        except DynamicApiError as exc:
            return exc.status == 422
        return False

    wait_for("the ValidatingAdmissionPolicy to be enforced", enforced, 30)
    for message, job in cases.items():
        with pytest.raises(DynamicApiError) as exc:
            apply_one(dyn, job, dry_run=True)
        assert exc.value.status == 422
        assert message in exc.value.summary() or message in str(exc.value)
        assert f"{FULL}-workload-guard" in str(exc.value)
    # The same Job outside a team namespace is not the policy's business.
    apply_one(dyn, _job("default", nodeName="a100-0"), dry_run=True)


def test_a_job_quartermaster_builds_passes_every_admission_check(
    cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    job = job_build(launch_spec(namespace="team-a", node="a100-0"), JOB_OPTIONS)
    created = cluster.batch().create_namespaced_job("team-a", job, dry_run="All")
    assert created.metadata.name == job.metadata.name


def test_the_resource_quota_counts_gpu_requests(
    cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    quota = cluster.core().read_namespaced_resource_quota("quartermaster-quota", "team-b")
    assert quota.spec.hard == {"requests.nvidia.com/gpu": "1"}
    wait_for(
        "quota status",
        lambda: (
            cluster.core()
            .read_namespaced_resource_quota("quartermaster-quota", "team-b")
            .status.hard
        ),
    )
    spec = launch_spec(namespace="team-b", node="a100-0", grants=2)
    job = job_build(spec, JOB_OPTIONS)
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="two-gpus"), spec=job.spec.template.spec)
    with pytest.raises(ApiException) as exc:
        cluster.core().create_namespaced_pod("team-b", pod, dry_run="All")
    assert exc.value.status == 403
    assert "exceeded quota: quartermaster-quota" in exc.value.body
    assert "requests.nvidia.com/gpu" in exc.value.body
    a_quota = CHART_VALUES["teams"][0]["quota"]
    assert (
        cluster.core().read_namespaced_resource_quota("quartermaster-quota", "team-a").spec.hard
        == a_quota
    )


def test_the_admission_policy_lets_the_job_controller_update_a_bound_pod(
    watching: Any, cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    """Every pod the scheduler bound has spec.nodeName; the Job controller then updates it to
    remove its tracking finalizer. A policy that refused nodeName on UPDATE kept every Job in
    team namespaces from completing (found here, invisible to the offline tests)."""
    from portal.backends.base import Outcome

    spec = launch_spec(namespace="team-a", node="a100-0")
    watching.launch(spec)
    wait_for(
        "the Job to complete",
        lambda: watching.status(spec.name, spec.namespace).outcome == Outcome.SUCCEEDED,
        30,
    )
    pods = (
        cluster.core()
        .list_namespaced_pod("team-a", label_selector=f"app.kubernetes.io/instance={spec.name}")
        .items
    )
    assert [p.metadata.finalizers for p in pods] == [None]
    # and a pod created with nodeName is still refused
    with pytest.raises(DynamicApiError, match="spec.nodeName is not allowed"):
        apply_one(
            cluster.dynamic(),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "pinned", "namespace": "team-a"},
                "spec": _job("team-a", nodeName="a100-0")["spec"]["template"]["spec"],
            },
            dry_run=True,
        )
