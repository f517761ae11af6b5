"""Inventory read from the simulated GPU nodes through the real apiserver, as the chart's
ServiceAccount. The fake-based twins are in tests/k8s/test_inventory.py."""

from __future__ import annotations

from collections import Counter
from typing import Any

from portal.backends.base import InventoryNode
from portal.backends.kubernetes import KubernetesBackend
from tests.cluster.kube import Cluster, merge_patch_node, wait_for

MIB_ALLOC = 1048 * 1024


def _by_name(backend: KubernetesBackend) -> dict[str, InventoryNode]:
    return {n.name: n for n in backend.inventory()}


def test_it_reads_every_gpu_node_with_its_pool_cpu_and_memory(
    backend: KubernetesBackend, gpu_nodes: list[dict[str, Any]]
) -> None:
    inv = _by_name(backend)
    assert sorted(inv) == sorted(d["metadata"]["name"] for d in gpu_nodes)
    for n in inv.values():
        assert (n.cpu_milli, n.memory_mib, n.ready, n.cordoned) == (126000, MIB_ALLOC, True, False)
    assert {n: i.pool for n, i in inv.items()} == {
        "a100-0": "a100",
        "a100-1": "a100",
        "h100-mig-0": "h100-mig",
        "l4-shared-0": "l4-shared",
        "a100-reserved-0": "reserved",
    }
    assert inv["a100-reserved-0"].taints == (
        ("quartermaster.io/reserved", "research", "NoSchedule"),
    )
    assert inv["a100-0"].taints == ()


def test_whole_gpus_are_eight_healthy_a100s(backend: KubernetesBackend) -> None:
    a100 = _by_name(backend)["a100-0"]
    assert [(d.index, d.model, d.memory_mib, d.partitioning, d.healthy) for d in a100.devices] == [
        (i, "NVIDIA-A100-SXM4-80GB", 81920, "exclusive", True) for i in range(8)
    ]


def test_mixed_mig_node_offers_every_profile_including_me_and_its_whole_gpu(
    backend: KubernetesBackend,
) -> None:
    h100 = _by_name(backend)["h100-mig-0"]
    whole = [d for d in h100.devices if d.partitioning == "exclusive"]
    migs = [d for d in h100.devices if d.partitioning == "mig"]
    assert len(whole) == 1 and whole[0].healthy and whole[0].model == "NVIDIA-H100-80GB-HBM3"
    assert len(migs) == 3 and all(d.healthy for d in migs)
    assert sorted(d.index for d in h100.devices) == [0, 1, 2, 3]
    profiles = Counter(m.profile for d in migs for m in d.mig_instances)
    assert profiles == {"1g.10gb": 15, "1g.10gb+me": 1, "2g.20gb": 1, "3g.40gb": 1}


def test_time_sliced_l4_offers_four_shares_per_gpu(backend: KubernetesBackend) -> None:
    l4 = _by_name(backend)["l4-shared-0"]
    assert [(d.partitioning, d.replicas, d.healthy) for d in l4.devices] == [
        ("time-slicing", 4, True)
    ] * 4


def test_mig_config_state_is_required_only_when_configured(
    backend: KubernetesBackend, cluster: Cluster
) -> None:
    """Clusters without mig-manager have no `nvidia.com/mig.config.state` label."""
    core = cluster.core()
    label = "nvidia.com/mig.config.state"
    merge_patch_node(core, "h100-mig-0", {"metadata": {"labels": {label: None}}})
    try:
        wait_for(
            "the label to go",
            lambda: label not in (core.read_node("h100-mig-0").metadata.labels or {}),
        )
        backend.require_mig_state = True
        strict = _by_name(backend)["h100-mig-0"]
        assert not any(d.healthy for d in strict.devices if d.partitioning == "mig")
        backend.require_mig_state = False
        relaxed = _by_name(backend)["h100-mig-0"]
        assert all(d.healthy for d in relaxed.devices)
        assert sum(len(d.mig_instances) for d in relaxed.devices) == 18
    finally:
        backend.require_mig_state = True
        merge_patch_node(core, "h100-mig-0", {"metadata": {"labels": {label: "success"}}})
