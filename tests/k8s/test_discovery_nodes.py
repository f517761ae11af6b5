"""Discovery on Kubernetes: every node with NVIDIA GPUs, pool label or not."""

from __future__ import annotations

from tests.fakes.fake_k8s import gpu_node
from tests.k8s.builders import a100_node, backend, cluster_with_nodes


def test_it_lists_gpu_nodes_with_their_labels_even_outside_any_pool() -> None:
    cluster = cluster_with_nodes()
    cluster.add_node(a100_node("gpu-loose", labels={"quartermaster.io/pool": ""}))
    cluster.add_node(gpu_node("cpu-only"))
    found = {n.name: n for n in backend(cluster).gpu_nodes()}
    assert sorted(found) == ["gpu-a", "gpu-loose", "gpu-mig", "gpu-ts"]
    assert found["gpu-mig"].gpus == 2
    assert found["gpu-mig"].labels["nvidia.com/mig.config"] == "all-balanced"
    assert found["gpu-ts"].labels["nvidia.com/gpu.replicas"] == "4"
    # inventory keeps to pooled nodes; discovery does not
    assert "gpu-loose" not in {n.name for n in backend(cluster).inventory()}
