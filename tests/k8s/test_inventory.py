"""Inventory from Node objects: GFD labels, allocatable, taints, readiness, pools.

Fast unit tests on the in-memory fake; the real-cluster twins (the same kinds of node on
kwok, read through kube-apiserver) are in tests/cluster/test_inventory.py."""

from __future__ import annotations

from portal.k8s import names
from portal.k8s.inventory import pool_for_labels
from tests.fakes.fake_k8s import FakeCluster, foreign_pod, gpu_node
from tests.k8s.builders import a100_node, backend, cluster_with_nodes, mig_node, spec


def inv(cluster: FakeCluster, **kw):  # noqa: ANN201
    return {n.name: n for n in backend(cluster, **kw).inventory()}


def test_it_reads_exclusive_node_from_labels_and_allocatable() -> None:
    nodes = inv(cluster_with_nodes())
    node = nodes["gpu-a"]
    assert node.pool == "a100"
    assert node.cpu_milli == 64000 and node.memory_mib == 512 * 1024
    assert len(node.devices) == 8
    assert {d.model for d in node.devices} == {"NVIDIA-A100-SXM4-80GB"}
    assert {d.memory_mib for d in node.devices} == {81920}
    assert all(d.healthy and d.partitioning == "exclusive" for d in node.devices)
    assert node.ready and not node.cordoned


def test_it_packs_from_allocatable_never_capacity() -> None:
    """FI-15: the device plugin marks a GPU unhealthy after Xid 79 and allocatable
    drops below capacity; the inventory shows one device unhealthy, so it is not packed."""
    cluster = FakeCluster()
    cluster.add_node(
        a100_node(allocatable={"nvidia.com/gpu": "7"}, capacity={"nvidia.com/gpu": "8"})
    )
    devices = inv(cluster)["gpu-a"].devices
    assert len(devices) == 8
    assert sum(d.healthy for d in devices) == 7


def test_it_subtracts_pods_it_did_not_create() -> None:
    cluster = cluster_with_nodes()
    cluster.add_pod(
        foreign_pod("notebook", "gpu-a", {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "3"})
    )
    cluster.add_pod(foreign_pod("done", "gpu-a", {"nvidia.com/gpu": "4"}, phase="Succeeded"))
    node = inv(cluster)["gpu-a"]
    assert sum(d.healthy for d in node.devices) == 5
    # shown as held by others, not as broken: the three GPUs after the free ones
    assert [d.index for d in node.devices if d.foreign] == [5, 6, 7]
    assert node.cpu_milli == 62000
    assert node.memory_mib == 512 * 1024 - 8 * 1024


def test_a_device_plugin_fault_is_not_foreign_and_foreign_pods_take_the_rest() -> None:
    cluster = FakeCluster()
    cluster.add_node(
        a100_node(allocatable={"nvidia.com/gpu": "7"}, capacity={"nvidia.com/gpu": "8"})
    )
    cluster.add_pod(foreign_pod("kueue-job", "gpu-a", {"nvidia.com/gpu": "2"}))
    devices = inv(cluster)["gpu-a"].devices
    assert [(d.healthy, d.foreign) for d in devices] == [(True, False)] * 5 + [
        (False, True)
    ] * 2 + [(False, False)]


def test_it_does_not_subtract_its_own_pods() -> None:
    """Quartermaster's own attempts are counted by DB allocations, not a second time here."""
    cluster = cluster_with_nodes()
    b = backend(cluster)
    b.launch(spec())
    cluster.run_pod(cluster.start_pod("team-a", "qm-42-1"))
    assert sum(d.healthy for d in inv(cluster)["gpu-a"].devices) == 8


def test_it_reads_pods_per_namespace_when_not_allowed_cluster_wide() -> None:
    cluster = cluster_with_nodes()
    cluster.pod_read_namespaces = {"team-a", "other"}
    cluster.add_pod(foreign_pod("notebook", "gpu-a", {"nvidia.com/gpu": "1"}))
    nodes = inv(cluster, pod_namespaces=["team-a", "other"])
    assert sum(d.healthy for d in nodes["gpu-a"].devices) == 7
    assert not cluster.calls_of("list_pod_for_all_namespaces")


def test_it_reports_taints_readiness_and_cordon() -> None:
    cluster = FakeCluster()
    cluster.add_node(
        a100_node(
            taints=[("nvidia.com/gpu", "", "NoSchedule"), ("pool", "a100", "NoSchedule")],
            unschedulable=True,
        )
    )
    cluster.add_node(a100_node("gpu-b", ready=False))
    nodes = inv(cluster)
    assert nodes["gpu-a"].taints == (
        ("nvidia.com/gpu", "", "NoSchedule"),
        ("pool", "a100", "NoSchedule"),
    )
    assert nodes["gpu-a"].cordoned and nodes["gpu-a"].ready
    assert not nodes["gpu-b"].ready


def test_it_synthesises_the_mig_layout_from_mixed_resources() -> None:
    node = inv(cluster_with_nodes())["gpu-mig"]
    assert len(node.devices) == 2
    for d in node.devices:
        assert d.partitioning == "mig" and d.healthy
        layout = [(m.profile, m.start, m.size) for m in d.mig_instances]
        assert layout == [
            ("1g.10gb", 0, 1),
            ("1g.10gb", 1, 1),
            ("2g.20gb", 2, 2),
            ("3g.40gb", 4, 4),
        ]


def test_it_reads_mig_single_strategy() -> None:
    cluster = FakeCluster()
    cluster.add_node(
        gpu_node(
            "gpu-s",
            labels={
                "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb",
                "nvidia.com/gpu.memory": "4864",
                "nvidia.com/gpu.count": "14",
                "nvidia.com/mig.strategy": "single",
                "nvidia.com/mig.config.state": "success",
                "quartermaster.io/pool": "a100-1g",
            },
            allocatable={"nvidia.com/gpu": "14"},
        )
    )
    node = inv(cluster)["gpu-s"]
    assert len(node.devices) == 2
    assert [len(d.mig_instances) for d in node.devices] == [7, 7]
    assert node.devices[0].model == "A100-SXM4-40GB" and node.devices[0].memory_mib == 40960


def test_it_keeps_mig_nodes_out_of_packing_until_state_is_success() -> None:
    """FI-17: mig.config.state pending / failed -> no MIG instance is offered; the
    state stays in the node's labels for the GPUMIGConfigFailed alert metric."""
    for state in ("pending", "rebooting", "failed"):
        cluster = FakeCluster()
        cluster.add_node(mig_node(state=state))
        node = inv(cluster)["gpu-mig"]
        assert all(not d.healthy and d.mig_instances == () for d in node.devices), state
        assert node.labels["nvidia.com/mig.config.state"] == state
    cluster = FakeCluster()
    cluster.add_node(mig_node(state="success"))
    assert all(d.healthy and d.mig_instances for d in inv(cluster)["gpu-mig"].devices)


def test_it_reads_time_slicing_replicas() -> None:
    cluster = cluster_with_nodes()
    cluster.add_pod(foreign_pod("chat", "gpu-ts", {"nvidia.com/gpu.shared": "1"}))
    node = inv(cluster)["gpu-ts"]
    assert [d.partitioning for d in node.devices] == ["time-slicing"] * 4
    assert node.devices[0].model == "NVIDIA-L40S"
    assert [d.replicas for d in node.devices] == [4, 4, 4, 3]


def test_it_matches_pools_by_selector_most_specific_first() -> None:
    selectors = {
        "gpu": {"nvidia.com/gpu.present": "true"},
        "a100": {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        },
        "empty": {},
    }
    nodes = inv(cluster_with_nodes(), pool_selectors=selectors)
    assert nodes["gpu-a"].pool == "a100"
    assert nodes["gpu-mig"].pool == "gpu"
    assert pool_for_labels({"x": "1"}, selectors) is None


def test_it_leaves_out_nodes_in_no_pool_without_gpus_or_for_vms() -> None:
    cluster = cluster_with_nodes()
    cluster.add_node(
        gpu_node(
            "cpu-1", labels={"quartermaster.io/pool": "a100", "nvidia.com/gpu.present": "false"}
        )
    )
    cluster.add_node(
        a100_node("gpu-vm", labels={"nvidia.com/gpu.workload.config": "vm-passthrough"})
    )
    cluster.add_node(gpu_node("gpu-x", allocatable={"nvidia.com/gpu": "1"}))
    assert sorted(inv(cluster)) == ["gpu-a", "gpu-mig", "gpu-ts"]


def test_it_marks_a_not_ready_node() -> None:
    """FI-09 (inventory side): a node that went NotReady is reported not ready, so it is not packed."""
    cluster = cluster_with_nodes()
    cluster.node_not_ready("gpu-a")
    node = inv(cluster)["gpu-a"]
    assert not node.ready
    assert ("node.kubernetes.io/unreachable", "", "NoExecute") in node.taints


def _from_cluster_nodes(doc: dict) -> object:  # type: ignore[type-arg]
    return gpu_node(
        doc["metadata"]["name"],
        labels=doc["metadata"]["labels"],
        allocatable=doc["status"]["allocatable"],
        capacity=doc["status"]["capacity"],
    )


def test_it_offers_me_profiles_and_the_whole_gpus_of_a_mixed_node() -> None:
    """`+me` instances are advertised as `mig-1g.10gb.me`; a GPU not in MIG mode is
    `nvidia.com/gpu` beside them. Real-cluster twin: tests/cluster/test_inventory.py."""
    from collections import Counter

    from tests.cluster.nodes import h100_mixed

    cluster = FakeCluster()
    cluster.add_node(_from_cluster_nodes(h100_mixed("h100-mig-0")))
    node = inv(cluster)["h100-mig-0"]
    assert [d.partitioning for d in node.devices] == ["exclusive", "mig", "mig", "mig"]
    assert [d.index for d in node.devices] == [0, 1, 2, 3]
    assert all(d.healthy for d in node.devices)
    profiles = Counter(m.profile for d in node.devices for m in d.mig_instances)
    assert profiles == {"1g.10gb": 15, "1g.10gb+me": 1, "2g.20gb": 1, "3g.40gb": 1}


def test_it_refuses_time_shared_mig_instances() -> None:
    """Renamed (`.shared`) or labelled time-sliced MIG resources are not packed: a share is
    not an instance."""
    cluster = FakeCluster()
    cluster.add_node(
        mig_node(
            labels={"nvidia.com/mig-1g.10gb.sharing-strategy": "time-slicing"},
            allocatable={"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb.shared": "8"},
        )
    )
    node = inv(cluster)["gpu-mig"]
    profiles = {m.profile for d in node.devices for m in d.mig_instances}
    assert profiles == {"3g.40gb", "2g.20gb"}


def test_it_maps_mig_profiles_and_resource_names_both_ways() -> None:
    assert names.mig_resource("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert names.mig_resource("3g.40gb") == "nvidia.com/mig-3g.40gb"
    assert names.mig_profile_of("nvidia.com/mig-1g.10gb.me") == "1g.10gb+me"
    assert names.mig_profile_of("nvidia.com/mig-3g.40gb") == "3g.40gb"
    assert names.mig_profile_of("nvidia.com/mig-1g.10gb.shared") is None
    assert names.mig_profile_of("nvidia.com/mig-1g.10gb.me.shared") is None
    assert names.mig_profile_of("nvidia.com/gpu") is None


def _mixed_node(name: str, product: str, memory: str, resources: dict[str, str]):  # noqa: ANN202
    return gpu_node(
        name,
        labels={
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.memory": memory,
            "nvidia.com/gpu.count": "1",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config.state": "success",
            "quartermaster.io/pool": "mig",
        },
        allocatable=resources,
    )


def test_it_lays_out_a_4_slice_gpu_on_its_own_geometry() -> None:
    cluster = FakeCluster()
    cluster.add_node(
        _mixed_node(
            "a30",
            "NVIDIA-A30",
            "24576",
            {"nvidia.com/mig-2g.12gb": "1", "nvidia.com/mig-1g.6gb": "2"},
        )
    )
    (device,) = inv(cluster)["a30"].devices
    layout = [(m.profile, m.start, m.size) for m in device.mig_instances]
    # all four slices used: a 7-slice geometry would have put the 2g at start 4
    assert layout == [("1g.6gb", 0, 1), ("1g.6gb", 1, 1), ("2g.12gb", 2, 2)]


def test_it_gives_an_unknown_mig_gpu_no_guessed_layout(caplog) -> None:  # noqa: ANN001
    cluster = FakeCluster()
    cluster.add_node(
        _mixed_node("gb300", "NVIDIA-GB300", "284208", {"nvidia.com/mig-3g.139gb": "2"})
    )
    with caplog.at_level("WARNING"):
        (device,) = inv(cluster)["gb300"].devices
    assert device.partitioning == "mig" and device.mig_instances == ()
    assert "unknown MIG GPU NVIDIA-GB300: not scheduled as MIG" in caplog.text


def test_it_maps_the_rtx_pro_6000_profile_variants_to_resource_names() -> None:
    for profile in ("1g.24gb+gfx", "1g.24gb+me.all", "1g.24gb-me", "2g.48gb"):
        assert names.mig_profile_of(names.mig_resource(profile)) == profile


def test_it_reads_a_hami_node_as_shared_gpus() -> None:
    cluster = FakeCluster()
    cluster.add_node(
        gpu_node(
            "hami-0",
            labels={
                "nvidia.com/gpu.product": "NVIDIA-L40S",
                "nvidia.com/gpu.memory": "46068",
                "nvidia.com/gpu.count": "2",
                "quartermaster.io/pool": "l40s-hami",
            },
            allocatable={
                "nvidia.com/gpu": "20",
                "nvidia.com/gpumem": "92136",
                "nvidia.com/gpucores": "200",
            },
        )
    )
    devices = inv(cluster)["hami-0"].devices
    # two GPUs of ten vGPUs each (HAMi's split count), not twenty whole GPUs
    assert [(d.partitioning, d.replicas, d.memory_mib) for d in devices] == [
        ("time-slicing", 10, 46068),
        ("time-slicing", 10, 46068),
    ]
