"""The chart's RBAC on a real apiserver, exercised with a token of the chart's ServiceAccount
(what the web, worker and beat pods run as): enough for the backend, and nothing more."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from portal.k8s.jobs import job_build
from tests.chart.chart import NAMESPACE
from tests.cluster.conftest import JOB_OPTIONS, TEAM_NS
from tests.cluster.kube import Cluster, can_i
from tests.cluster.specs import launch_spec


def test_it_may_do_what_the_backend_does(qm_api: client.ApiClient) -> None:
    assert can_i(qm_api, "list", "nodes")
    assert can_i(qm_api, "watch", "nodes")
    # rbac.readPodsClusterWide (default): pods that hold GPUs anywhere are counted
    assert can_i(qm_api, "list", "pods")
    for ns in TEAM_NS:
        for verb in ("create", "get", "list", "watch", "delete"):
            assert can_i(qm_api, verb, "jobs", ns, group="batch"), (verb, ns)
        assert can_i(qm_api, "get", "pods", ns, group="")
        assert can_i(qm_api, "get", "pods/log", ns)


def test_it_cannot_read_secrets(qm_api: client.ApiClient) -> None:
    core = client.CoreV1Api(qm_api)
    for ns in (NAMESPACE, *TEAM_NS, "kube-system"):
        assert not can_i(qm_api, "get", "secrets", ns)
        with pytest.raises(ApiException) as exc:
            core.list_namespaced_secret(ns)
        assert exc.value.status == 403
    with pytest.raises(ApiException) as exc:
        core.list_secret_for_all_namespaces()
    assert exc.value.status == 403


def test_it_cannot_create_jobs_outside_team_namespaces(
    qm_api: client.ApiClient, cluster: Cluster
) -> None:
    batch = client.BatchV1Api(qm_api)
    for ns in ("default", NAMESPACE, "kube-system"):
        job = job_build(launch_spec(namespace=ns, node="a100-0"), JOB_OPTIONS)
        with pytest.raises(ApiException) as exc:
            batch.create_namespaced_job(ns, job)
        assert exc.value.status == 403, ns
    # and in a team namespace it can (dry run: nothing is left behind)
    job = job_build(launch_spec(namespace="team-a", node="a100-0"), JOB_OPTIONS)
    assert batch.create_namespaced_job("team-a", job, dry_run="All").metadata.name


def test_it_cannot_run_pods_exec_or_change_nodes(qm_api: client.ApiClient) -> None:
    denied: list[tuple[str, str, str, str]] = [
        ("create", "pods", "team-a", ""),
        ("create", "pods/exec", "team-a", ""),
        ("patch", "nodes", "", ""),
        ("delete", "nodes", "", ""),
        ("update", "jobs", "team-a", "batch"),
        ("create", "roles", "team-a", "rbac.authorization.k8s.io"),
        ("create", "serviceaccounts/token", NAMESPACE, ""),
        ("create", "namespaces", "", ""),
    ]
    allowed: list[Any] = [d for d in denied if can_i(qm_api, d[0], d[1], d[2], group=d[3])]
    assert allowed == []


def _may(cluster: Cluster, verb: str, resource: str, ns: str, sub: str = "", **who: Any) -> bool:
    """A SubjectAccessReview: whether a person (user and groups) may do this."""
    review = client.AuthorizationV1Api(cluster.api()).create_subject_access_review(
        client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, subresource=sub or None, namespace=ns
                ),
                **who,
            )
        )
    )
    return bool(review.status.allowed)


def test_a_teams_readers_read_its_pods_and_logs_and_nothing_else(
    cluster: Cluster, chart: list[dict[str, Any]]
) -> None:
    """teams[].readers (chart): the team's people use kubectl with their own credentials."""
    for who in (
        {"user": "alice@example.com"},
        {"user": "bob@example.com", "groups": ["team-a-researchers"]},
    ):
        for verb in ("get", "list", "watch"):
            assert _may(cluster, verb, "pods", "team-a", **who), (verb, who)
            assert _may(cluster, verb, "events", "team-a", **who), (verb, who)
        assert _may(cluster, "get", "pods", "team-a", "log", **who)
        assert not _may(cluster, "get", "pods", "team-b", "log", **who)
        assert not _may(cluster, "list", "pods", "team-b", **who)
        assert not _may(cluster, "create", "pods", "team-a", **who)
        assert not _may(cluster, "delete", "pods", "team-a", **who)
        assert not _may(cluster, "create", "pods", "team-a", "exec", **who)
        assert not _may(cluster, "get", "secrets", "team-a", **who)
    assert not _may(cluster, "list", "pods", "team-a", user="mallory@example.com")
