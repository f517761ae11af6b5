"""Builders for the Kubernetes adapter's tests: specs, nodes and a wired-up backend."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from portal.backends.base import GrantSpec, LaunchSpec
from portal.backends.kubernetes import KubernetesBackend
from portal.k8s.jobs import JobOptions
from tests.fakes.fake_k8s import FakeCluster, apis, gpu_node

NS = "team-a"
OPTIONS = JobOptions(
    portal_url="http://qm-web.quartermaster.svc:8000",
    ready_image="ghcr.io/quartermaster/portal:0.1.0",
    ready_token_key="test-key",
)


def spec(**overrides: Any) -> LaunchSpec:
    """A whole-GPU training attempt on node gpu-a, two devices."""
    base = LaunchSpec(
        name="qm-42-1",
        namespace=NS,
        request_id=42,
        attempt_id=7,
        attempt_number=1,
        team="team-a",
        workload_class="training",
        priority_class="quartermaster-training",
        pool="a100",
        node="gpu-a",
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        command=("python", "train.py"),
        env=(("EPOCHS", "3"),),
        profile_kind="whole",
        grants=(GrantSpec(device=0, milli=1000), GrantSpec(device=1, milli=1000)),
        cpu_milli=8000,
        memory_mib=65536,
        tolerations=(("nvidia.com/gpu", "", "NoSchedule"), ("pool", "a100", "NoSchedule")),
        max_runtime_s=86400,
    )
    return replace(base, **overrides)


def mig_spec(profile: str = "3g.40gb", start: int = 4) -> LaunchSpec:
    return spec(
        name="qm-43-1",
        request_id=43,
        attempt_id=8,
        profile_kind="mig",
        node="gpu-mig",
        grants=(GrantSpec(device=0, milli=428, mig_profile=profile, mig_start=start),),
    )


def shared_spec() -> LaunchSpec:
    return spec(
        name="qm-44-1",
        request_id=44,
        attempt_id=9,
        profile_kind="shared",
        node="gpu-ts",
        workload_class="inference",
        priority_class="quartermaster-inference",
        grants=(GrantSpec(device=1, milli=250, gpu_memory_mib=10240),),
    )


def a100_node(name: str = "gpu-a", **kw: Any) -> Any:
    """8× A100-80GB, exclusive."""
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/mig.strategy": "none",
        "nvidia.com/gpu.sharing-strategy": "none",
        "quartermaster.io/pool": "a100",
        **kw.pop("labels", {}),
    }
    alloc = {"nvidia.com/gpu": "8", **kw.pop("allocatable", {})}
    return gpu_node(name, labels=labels, allocatable=alloc, **kw)


def mig_node(name: str = "gpu-mig", state: str = "success", **kw: Any) -> Any:
    """2× H100-80GB in MIG mixed, all-balanced: per GPU 1×3g.40gb, 1×2g.20gb, 2×1g.10gb."""
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "all-balanced",
        "nvidia.com/mig.config.state": state,
        "nvidia.com/mig-3g.40gb.count": "2",
        "quartermaster.io/pool": "h100-mig",
        **kw.pop("labels", {}),
    }
    alloc = {
        "nvidia.com/gpu": "0",
        "nvidia.com/mig-3g.40gb": "2",
        "nvidia.com/mig-2g.20gb": "2",
        "nvidia.com/mig-1g.10gb": "4",
        **kw.pop("allocatable", {}),
    }
    return gpu_node(name, labels=labels, allocatable=alloc, **kw)


def ts_node(name: str = "gpu-ts", **kw: Any) -> Any:
    """4× L40S, time-slicing with 4 replicas, renamed to nvidia.com/gpu.shared."""
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-L40S-SHARED",
        "nvidia.com/gpu.memory": "46068",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "quartermaster.io/pool": "l40s-shared",
        **kw.pop("labels", {}),
    }
    alloc = {"nvidia.com/gpu.shared": "16", **kw.pop("allocatable", {})}
    return gpu_node(name, labels=labels, allocatable=alloc, **kw)


def cluster_with_nodes() -> FakeCluster:
    cluster = FakeCluster()
    for node in (a100_node(), mig_node(), ts_node()):
        cluster.add_node(node)
    return cluster


def backend(cluster: FakeCluster, **kw: Any) -> KubernetesBackend:
    core, batch = apis(cluster)
    kw.setdefault("job_options", OPTIONS)
    # The fake serves no discovery: gangs are Jobs here (tests/k8s/test_jobset.py: JobSets).
    kw.setdefault("gang_api", "jobs")
    return KubernetesBackend(
        core=core, batch=batch, now=lambda: cluster.now, sleep=lambda s: None, **kw
    )
