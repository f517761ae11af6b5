"""A rollout in waves against the real control plane (docs/lifecycle.md): cordons and label
changes are patched on the Node objects and read back from the apiserver, the burn-in is a
Job pinned to its node, drained attempts are Jobs deleted after their last checkpoint. The
simulated-backend twin is tests/portal/lifecycle/test_lifecycle_rollout.py.

Three nodes of their own (`lc-0..2`, pool `lc`), removed at the end, so that the session's
other nodes keep their state. Node changes need `patch` on nodes, which the chart grants
only with `rbac.manageNodes`; the backend here uses the control plane's admin credentials.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

import portal.backends
from portal.backends.kubernetes import KubernetesBackend
from portal.lib import lifecycle
from portal.models import (
    Attempt,
    GpuRequest,
    Rollout,
    RolloutNode,
    ValidationRun,
)
from portal.services.checkpoints import attempt_checkpoint_record
from portal.services.requests import gpu_request_submit
from portal.services.rollouts import rollout_start, rollouts_advance
from portal.services.validations import validation_report
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.cluster.conftest import JOB_OPTIONS
from tests.cluster.kube import Cluster, node_ready, node_settled, wait_for
from tests.cluster.nodes import POOL, a100
from tests.cluster.world import training_world

pytestmark = pytest.mark.django_db(transaction=True)

NODES = ["lc-0", "lc-1", "lc-2"]
VALIDATION_NS = "qm-validation-test"
CONFIG = "qm-test-sharing"
GOOD = {"devices_visible": 8, "nccl_busbw_gbps": 231.5, "dcgm_diag": "pass", "warmup_s": 40}
BAD = {**GOOD, "nccl_busbw_gbps": 12.0}


@pytest.fixture
def lc(
    cluster: Cluster, chart: list[dict[str, Any]], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KubernetesBackend]:
    core = cluster.core()
    for name in NODES:
        core.create_node(a100(name, pool="lc"))
    for name in NODES:
        wait_for(f"node {name} Ready", lambda n=name: node_settled(core.read_node(n)), 60)
    try:
        core.create_namespace({"metadata": {"name": VALIDATION_NS}})
    except Exception:  # noqa: BLE001 - made by an earlier run of this test in the session
        pass
    backend = KubernetesBackend(
        core=core,
        batch=cluster.batch(),
        job_options=JOB_OPTIONS,
        pool_selectors={"lc": {POOL: "lc"}},
        image_pull_timeout_s=5,
        validation_image="qm.test/sleep",
    )
    monkeypatch.setattr(portal.backends, "_backend", lambda name: backend)
    settings.VALIDATION_NAMESPACE = VALIDATION_NS
    try:
        yield backend
    finally:
        # Leave nothing for the session's other tests: the team's GPU quota is shared.
        batch = cluster.batch()
        selector = "app.kubernetes.io/managed-by=quartermaster,quartermaster.io/pool=lc"
        for job in batch.list_namespaced_job("team-a", label_selector=selector).items:
            batch.delete_namespaced_job(
                job.metadata.name, "team-a", propagation_policy="Background", grace_period_seconds=0
            )
        for job in batch.list_namespaced_job(VALIDATION_NS).items:
            batch.delete_namespaced_job(
                job.metadata.name, VALIDATION_NS, propagation_policy="Background"
            )
        for ns in ("team-a", VALIDATION_NS):
            for pod in core.list_namespaced_pod(ns).items:
                if pod.spec.node_name in NODES:
                    core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
        wait_for(
            "the rollout test's pods gone",
            lambda: (
                not [
                    p
                    for ns in ("team-a", VALIDATION_NS)
                    for p in core.list_namespaced_pod(ns).items
                    if p.spec.node_name in NODES
                ]
            ),
            60,
        )
        for name in NODES:
            core.delete_node(name)

        # A busy machine can let a kwok heartbeat lapse meanwhile: leave every other node as
        # the session's later tests expect it, Ready and without the node controller's taints.
        def settled() -> bool:
            return all(
                node_ready(n)
                and not any(t.key.startswith("node.kubernetes.io/") for t in (n.spec.taints or ()))
                for n in core.list_node().items
            )

        wait_for("the other nodes Ready and untainted", settled, 90)


def _world() -> dict[str, Any]:
    world = training_world("lc", {POOL: "lc"})
    admin = get_user_model().objects.create_user("dave", password="pw-dave-123", is_staff=True)
    return {**world, "admin": admin}


def _step(until: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rollouts_advance()
        reconcile()
        if until():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _member(rollout: Rollout, node: str) -> RolloutNode:
    return RolloutNode.objects.select_related("validation").get(rollout=rollout, node__name=node)


def test_a_three_wave_rollout_halts_after_the_wave_with_a_failing_node(
    lc: KubernetesBackend, cluster: Cluster
) -> None:
    w = _world()
    core = cluster.core()
    reqs = [
        gpu_request_submit(
            user=w["user"],
            team=w["team"],
            workload_class=w["cls"],
            pool=w["pool"],
            image="qm.test/sleep",
            command=["python", "train.py"],
            count=8,
            cpu_milli=4000,
            estimated_runtime_s=3600,
        )
        for _ in range(2)
    ]
    run_tick()
    # They checkpoint (set after launch: a checkpoint PVC would wait for a provisioner here).
    GpuRequest.objects.filter(pk__in=[r.pk for r in reqs]).update(checkpoint_interval_s=600)
    attempts = {a.pk: a for a in Attempt.objects.filter(request__in=reqs)}
    assert len(attempts) == 2
    _step(
        lambda: all(a.state == "running" for a in Attempt.objects.filter(pk__in=attempts)),
        "both attempts running",
    )

    rollout = rollout_start(
        actor=w["admin"],
        pool=w["pool"],
        kind="device-plugin",
        target=CONFIG,
        canary_nodes=1,
        wave_percent=33,
    )
    assert rollout.waves == [["lc-0"], ["lc-1"], ["lc-2"]]
    reported: set[int] = set()

    def play_the_cluster() -> bool:
        """Checkpoint the attempts being drained, and report burn-in figures as pods would."""
        for m in RolloutNode.objects.filter(rollout=rollout).select_related("node", "validation"):
            if m.step == "draining":
                for a in Attempt.objects.filter(
                    state="running", allocations__device__node=m.node
                ).distinct():
                    attempt_checkpoint_record(a.pk, timezone.now())
            if m.step == "validating" and m.validation and m.validation.pk not in reported:
                job = cluster.batch().read_namespaced_job(m.validation.name, VALIDATION_NS)
                pod_spec = job.spec.template.spec
                assert pod_spec.node_selector == {"kubernetes.io/hostname": m.node.name}
                assert pod_spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}
                validation_report(run=m.validation, results=BAD if m.node.name == "lc-1" else GOOD)
                reported.add(m.validation.pk)
        rollout.refresh_from_db()
        return rollout.state != Rollout.State.RUNNING

    _step(play_the_cluster, "the rollout to stop", timeout_s=120)
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.HALTED, rollout.halt_reason
    assert "halted after wave 1" in rollout.halt_reason
    steps = {n: _member(rollout, n).step for n in NODES}
    assert steps == {"lc-0": "returned", "lc-1": "failed", "lc-2": "waiting"}

    # What the apiserver holds: the change on the nodes that got it, the cordon where it failed.
    seen = {n: core.read_node(n) for n in NODES}
    assert seen["lc-0"].metadata.labels.get(lifecycle.DEVICE_PLUGIN_CONFIG) == CONFIG
    assert not seen["lc-0"].spec.unschedulable
    assert seen["lc-1"].metadata.labels.get(lifecycle.DEVICE_PLUGIN_CONFIG) == CONFIG
    assert seen["lc-1"].spec.unschedulable is True
    assert lifecycle.DEVICE_PLUGIN_CONFIG not in (seen["lc-2"].metadata.labels or {})
    assert not seen["lc-2"].spec.unschedulable
    assert "NCCL" in _member(rollout, "lc-1").reason
    # The burn-in Jobs are gone once judged.
    wait_for(
        "the validation Jobs deleted",
        lambda: (
            not cluster.batch().list_namespaced_job(VALIDATION_NS).items
            or all(
                j.metadata.deletion_timestamp
                for j in cluster.batch().list_namespaced_job(VALIDATION_NS).items
            )
        ),
    )
    assert ValidationRun.objects.filter(state="failed").count() == 1

    # Every attempt the drain stopped had checkpointed: it resumes from there, nothing more lost.
    stopped = [a for m in rollout.members.all() for a in m.stopped_attempts]
    assert stopped, "the drain stopped no attempt"
    for a in Attempt.objects.filter(pk__in=stopped):
        assert a.last_checkpoint_at is not None
        assert a.state in ("stopping", "preempted")
