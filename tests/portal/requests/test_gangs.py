"""A gang of N pods runs N pods, each on its node, all or nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from portal.backends.base import GrantSpec, LaunchRefused, Outcome, PodLaunch, WorkloadStatus
from portal.k8s.jobs import job_to_dict
from portal.models import (
    Allocation,
    Attempt,
    DeviceProfile,
    GpuRequest,
    Pool,
    SimulatedWorkload,
    WorkloadClass,
)
from portal.services.attempts import attempt_observe, launch_spec
from portal.services.requests import gpu_request_cancel
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import make_world, submit
from tests.fakes.fake_k8s import FakeCluster
from tests.k8s.builders import a100_node, backend, spec

# --- the portal and the simulated backend ------------------------------------------------


def _shift(names: list[str], seconds: float) -> None:
    for w in SimulatedWorkload.objects.filter(name__in=names):
        SimulatedWorkload.objects.filter(pk=w.pk).update(
            starts_at=w.starts_at - timedelta(seconds=seconds),
            ends_at=w.ends_at - timedelta(seconds=seconds),
        )


@pytest.mark.django_db(transaction=True)
def test_a_two_by_eight_gang_runs_two_eight_gpu_pods_on_its_two_nodes() -> None:
    w = make_world()
    req = submit(w.bob, w.vision, count=8, pods=2, cpu_milli=16000, memory_mib=65536)
    run_tick()
    attempt = req.attempts.get()
    assert len(attempt.nodes) == 2 and len(set(attempt.nodes)) == 2
    assert Allocation.objects.filter(attempt=attempt, active=True).count() == 16

    launch = launch_spec(attempt)
    members = launch.members()
    assert [m.node for m in members] == attempt.nodes
    assert [len(m.grants) for m in members] == [8, 8]
    assert [m.name for m in members] == [f"{attempt.workload_name}-0", f"{attempt.workload_name}-1"]

    workloads = {w.name: w for w in SimulatedWorkload.objects.all()}
    assert sorted(workloads) == sorted(m.name for m in members)
    for rank, m in enumerate(members):
        sim = workloads[m.name]
        assert sim.node == attempt.nodes[rank]
        assert sim.spec["devices"] == list(range(8))
        env = sim.spec["env"]
        assert env["WORLD_SIZE"] == "2" and env["RANK"] == str(rank)
        assert (
            env["MASTER_ADDR"] == f"{attempt.workload_name}-0.{attempt.workload_name}.qm-vision.svc"
        )
        assert (env["PET_NNODES"], env["PET_NODE_RANK"]) == ("2", str(rank))
        assert env["PET_NPROC_PER_NODE"] == "8"
        assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"]

    # Started all or nothing: running once both pods run.
    _shift([members[1].name], -60)  # pod 1 starts a minute late
    _shift([members[0].name], 5)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.ADMITTED
    _shift([members[1].name], 65)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.RUNNING

    # Stopped all or nothing: cancelling stops both pods; devices held until both are gone.
    gpu_request_cancel(user=w.bob, gpu_request=req)
    assert SimulatedWorkload.objects.filter(stopped_at__isnull=False).count() == 2
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.CANCELLED
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()


@pytest.mark.django_db(transaction=True)
def test_one_failed_pod_stops_the_whole_gang_then_fails_it() -> None:
    w = make_world()
    req = submit(w.bob, w.vision, count=4, pods=2)
    run_tick()
    attempt = req.attempts.get()
    names = [m.name for m in launch_spec(attempt).members()]
    _shift(names, 5)
    reconcile()
    # Pod 1 fails with exit 3 while pod 0 runs on.
    SimulatedWorkload.objects.filter(name=names[1]).update(exit_code=3)
    w1 = SimulatedWorkload.objects.get(name=names[1])
    SimulatedWorkload.objects.filter(pk=w1.pk).update(ends_at=w1.starts_at)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.STOPPING and attempt.stop_reason == "gang:failed"
    assert SimulatedWorkload.objects.get(name=names[0]).stopped_at is not None
    assert Allocation.objects.filter(attempt=attempt, active=True).count() == 8
    # While a pod still runs (say, Terminating on Kubernetes) the gang holds its devices.
    still = WorkloadStatus(attempt.workload_name, attempt.namespace, Outcome.FAILED, active_pods=1)
    assert attempt_observe(attempt_id=attempt.pk, status=still) == "stopping"
    assert Allocation.objects.filter(attempt=attempt, active=True).count() == 8
    reconcile()
    attempt.refresh_from_db()
    req.refresh_from_db()
    assert attempt.state == Attempt.State.FAILED and "pod 1" in attempt.end_reason
    assert req.state == GpuRequest.State.FAILED
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()


@pytest.mark.django_db
def test_the_form_and_the_api_accept_pods_cpu_and_memory() -> None:
    w = make_world()
    page = Client()
    page.force_login(w.bob)
    r = page.post(
        "/requests/new/",
        {
            "team": w.vision.pk,
            "workload_class": WorkloadClass.objects.get(name="training").pk,
            "pool": Pool.objects.get(name="a100-train").pk,
            "profile": DeviceProfile.objects.get(name="whole").pk,
            "count": 8,
            "pods": 2,
            "cpu_milli": 32000,
            "memory_mib": 131072,
            "image": "registry.example.com/vision/train:1",
            "checkpoint_interval_s": 0,
            "max_runtime_s": 0,
            "estimated_runtime_s": 3600,
            "priority": 0,
        },
    )
    assert r.status_code == 302, r.content[:3000]
    req = GpuRequest.objects.get()
    assert (req.pods, req.count, req.cpu_milli, req.memory_mib) == (2, 8, 32000, 131072)
    api = APIClient()
    api.force_authenticate(w.bob)
    r = api.post(
        "/api/v1/requests/",
        {
            "team": "vision",
            "workload_class": "training",
            "pool": "a100-train",
            "image": "registry.example.com/vision/train:1",
            "count": 8,
            "pods": 2,
            "cpu_milli": 32000,
            "memory_mib": 131072,
        },
        format="json",
    )
    assert r.status_code == 201 and r.json()["pods"] == 2
    r = api.post(
        "/api/v1/requests/",
        {
            "team": "vision",
            "workload_class": "training",
            "image": "registry.example.com/x:1",
            "pods": 0,
        },
        format="json",
    )
    assert r.status_code == 400 and "pods" in r.json()["errors"]


# --- Kubernetes: one Job per pod under one headless Service -------------------------------


def _gang_spec() -> Any:
    g = (GrantSpec(0, 1000), GrantSpec(1, 1000))
    return spec(node="gpu-a", grants=g, pods=(PodLaunch(0, "gpu-a", g), PodLaunch(1, "gpu-b", g)))


def test_kubernetes_launches_a_gang_as_one_job_per_pod_owned_by_a_headless_service() -> None:
    cluster = FakeCluster()
    cluster.add_node(a100_node("gpu-a"))
    cluster.add_node(a100_node("gpu-b"))
    b = backend(cluster)
    gang = _gang_spec()
    b.launch(gang)
    svc = cluster.services[("team-a", "qm-42-1")]
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    assert svc.spec.selector == {"quartermaster.io/gang": "qm-42-1"}
    assert sorted(k[1] for k in cluster.jobs) == ["qm-42-1-0", "qm-42-1-1"]
    for rank, node in enumerate(("gpu-a", "gpu-b")):
        job = job_to_dict(cluster.jobs[("team-a", f"qm-42-1-{rank}")])
        assert job["metadata"]["ownerReferences"][0]["kind"] == "Service"
        assert job["metadata"]["ownerReferences"][0]["uid"] == svc.metadata.uid
        pod = job["spec"]["template"]["spec"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [node]
        assert pod["hostname"] == f"qm-42-1-{rank}" and pod["subdomain"] == "qm-42-1"
        main = next(c for c in pod["containers"] if c["name"] == "main")
        env = {e["name"]: e["value"] for e in main["env"]}
        assert env["WORLD_SIZE"] == "2" and env["RANK"] == str(rank)
        assert env["MASTER_ADDR"] == "qm-42-1-0.qm-42-1.team-a.svc"
        assert main["resources"]["limits"]["nvidia.com/gpu"] == "2"
        init = next(c for c in pod["initContainers"] if c["name"] == "wait-for-device")
        init_env = {e["name"]: e["value"] for e in init["env"]}
        assert init_env["QM_READY_URL"].endswith(f"/attempts/7/ready?rank={rank}")
        assert job["metadata"]["labels"]["quartermaster.io/rank"] == str(rank)
    # A relaunch adopts what exists.
    b.launch(gang)
    assert len(cluster.jobs) == 2

    # Started all or nothing.
    assert b.status("qm-42-1", "team-a", 2).outcome == Outcome.PENDING
    p0 = cluster.start_pod("team-a", "qm-42-1-0")
    cluster.run_pod(p0)
    assert b.status("qm-42-1", "team-a", 2).outcome == Outcome.PENDING
    p1 = cluster.start_pod("team-a", "qm-42-1-1")
    cluster.run_pod(p1)
    assert b.status("qm-42-1", "team-a", 2).outcome == Outcome.RUNNING
    # One pod evicted: the gang reports it, so the portal stops the rest.
    cluster.fail_pod(p1, "Evicted", "node pressure")
    st = b.status("qm-42-1", "team-a", 2)
    assert st.outcome == Outcome.PREEMPTED and st.message.startswith("pod 1")
    assert st.active_pods == 1  # pod 0 still runs: the portal stops it before ending the gang
    # Stopped all or nothing.
    b.stop("qm-42-1", "team-a", 30, 2)
    assert not cluster.jobs and not cluster.services
    assert b.status("qm-42-1", "team-a", 2).outcome == Outcome.MISSING


def test_a_refused_gang_member_creates_nothing() -> None:
    cluster = FakeCluster()
    cluster.add_node(a100_node("gpu-a"))
    b = backend(cluster)
    gang = replace(_gang_spec(), name="QM bad")
    with pytest.raises(LaunchRefused):
        b.launch(gang)
    assert not cluster.jobs and not cluster.services


@pytest.mark.django_db(transaction=True)
def test_a_failed_gang_names_the_error_line_of_the_pod_that_failed() -> None:
    """Pod 1 fails while pod 0 runs: the summary quotes pod 1's error line, not the SIGTERM
    line of pod 0, which the portal stopped afterwards."""
    w = make_world()
    req = submit(w.bob, w.vision, count=8, pods=2, cpu_milli=16000, memory_mib=65536)
    run_tick()
    attempt = req.attempts.get()
    first, second = (f"{attempt.workload_name}-{r}" for r in range(2))
    _shift([first, second], 30)
    SimulatedWorkload.objects.filter(name=second).update(exit_code=3)
    sim = SimulatedWorkload.objects.get(name=second)
    SimulatedWorkload.objects.filter(name=second).update(
        ends_at=sim.starts_at + timedelta(seconds=20)
    )
    reconcile()  # pod 1 failed: the portal stops pod 0
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.STOPPING
    reconcile()  # pod 0 gone: the attempt ends as pod 1 ended
    req.refresh_from_db()
    attempt.refresh_from_db()
    assert req.state == GpuRequest.State.FAILED
    error = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert error in req.status_message, req.status_message
    assert attempt.end_reason == f"the workload failed in pod 1: {error} (exit code 3)"
    assert "rank 1 of 2" in attempt.log_tail  # the failed pod's log is the one kept
    assert "SIGTERM" not in attempt.log_tail
