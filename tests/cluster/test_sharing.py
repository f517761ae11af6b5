"""A pool's sharing engine on the real control plane: a slice of a HAMi pool is admitted by
the tick on the inventory read from a kwok node that advertises HAMi's resources, and the
real scheduler binds its pod with HAMi's memory and compute requests. The unit twins are in
tests/k8s/test_job_build.py (the Job per engine)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import portal.backends
from portal.backends.kubernetes import KubernetesBackend
from portal.models import GpuRequest, Pool, Quota
from portal.services.nodes import inventory_sync
from portal.services.requests import gpu_request_submit
from portal.tick.run import run_tick
from tests.cluster.kube import Cluster, node_settled, wait_for
from tests.cluster.nodes import POOL, POOL_SELECTORS, l40s_hami
from tests.cluster.world import training_world

pytestmark = pytest.mark.django_db(transaction=True)

HAMI = "l40s-hami"
NODE = "l40s-hami-0"


@pytest.fixture
def hami_world(
    watching: KubernetesBackend, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    core = cluster.core()
    core.create_node(l40s_hami(NODE))
    try:
        wait_for(f"node {NODE} Ready", lambda: node_settled(core.read_node(NODE)), 60)
        monkeypatch.setattr(portal.backends, "_backend", lambda name: watching)
        monkeypatch.setattr(watching, "_pool_selectors", {**POOL_SELECTORS, HAMI: {POOL: HAMI}})
        world = training_world("a100", POOL_SELECTORS["a100"])
        pool = Pool.objects.create(
            name=HAMI,
            gpu_model="NVIDIA-L40S",
            gpu_memory_mib=46068,
            partitioning=Pool.Partitioning.TIME_SLICING,
            time_slicing_replicas=10,
            sharing_engine=Pool.SharingEngine.HAMI,
            node_selector={POOL: HAMI},
        )
        Quota.objects.create(team=world["team"], pool=pool, nominal_milli=4000)
        inventory_sync()
        yield {**world, "pool": pool}
    finally:
        core.delete_node(NODE)


def test_a_hami_slice_is_bound_with_hami_s_memory_and_compute_requests(
    hami_world: dict[str, Any], cluster: Cluster, watching: KubernetesBackend
) -> None:
    req = gpu_request_submit(
        user=hami_world["user"],
        team=hami_world["team"],
        workload_class=hami_world["cls"],
        pool=hami_world["pool"],
        profile_kind="shared",
        milli=250,
        gpu_memory_mib=8192,
        image="qm.test/sleep",
        command=["python", "serve.py"],
        cpu_milli=2000,
        estimated_runtime_s=60,
    )
    run_tick()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.ADMITTED, req.state
    attempt = req.attempts.get()
    assert attempt.nodes == [NODE]

    def bound() -> Any:
        pods = (
            cluster.core()
            .list_namespaced_pod(
                attempt.namespace, label_selector=f"quartermaster.io/attempt-id={attempt.pk}"
            )
            .items
        )
        return pods[0] if pods and pods[0].spec.node_name else None

    try:
        pod = wait_for("the slice's pod bound", bound, 30)
        assert pod.spec.node_name == NODE
        main = pod.spec.containers[0].resources
        for side in (main.requests, main.limits):
            assert side["nvidia.com/gpu"] == "1"
            assert side["nvidia.com/gpumem"] == "8192"
            assert side["nvidia.com/gpucores"] == "25"
    finally:
        watching.stop(attempt.workload_name, attempt.namespace, grace_seconds=0)
