"""The simulated GPU nodes of the `cluster` tests, as GPU Feature Discovery and the device plugin
publish them.

kwok manages every Node annotated `kwok.x-k8s.io/node: fake`: it keeps the node Ready, renews
its lease and plays its pods' lifecycle (tests/cluster/kwok/kwok.yaml). The labels and the
`status.capacity`/`allocatable` below are what a real node of each kind carries; nothing else
(no Quartermaster label but the pool) is added.

- `a100-0`, `a100-1`: 8× A100-SXM4-80GB, whole GPUs, pool `a100`;
- `h100-mig-0`: 4× H100-80GB-HBM3 under the `mixed` MIG strategy: GPU 0 is not in MIG mode
  (one `nvidia.com/gpu`), GPU 1 is `all-balanced` (2× 1g.10gb, 2g.20gb, 3g.40gb), GPU 2 has the
  `1g.10gb+me` profile (advertised as `nvidia.com/mig-1g.10gb.me`) beside 6× 1g.10gb, GPU 3 is
  `all-1g.10gb` (7×); pool `h100-mig`;
- `l4-shared-0`: 4× L4 time-sliced 4 ways with `renameByDefault` (`nvidia.com/gpu.shared: 16`),
  pool `l4-shared`;
- `a100-reserved-0`: 8× A100-SXM4-80GB tainted `quartermaster.io/reserved=research:NoSchedule`,
  pool `reserved`.
"""

from __future__ import annotations

import copy
from typing import Any

KWOK = {"kwok.x-k8s.io/node": "fake"}
POOL = "quartermaster.io/pool"
RESERVED_TAINT = {"key": "quartermaster.io/reserved", "value": "research", "effect": "NoSchedule"}

#: what a kubelet reserves on a large GPU host (allocatable below capacity)
CPU, CPU_ALLOC = "128", "126"
MEM, MEM_ALLOC = "1056Gi", "1048Gi"

_COMMON = {
    "kubernetes.io/os": "linux",
    "kubernetes.io/arch": "amd64",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
    "nvidia.com/gpu.workload.config": "container",
    "nvidia.com/gpu.mode": "compute",
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "107",
    "nvidia.com/cuda.driver-version.revision": "02",
    "nvidia.com/cuda.driver-version.full": "550.107.02",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4",
    "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/gfd.timestamp": "1764547200",
}

# H100-80GB MIG profiles: (resource suffix, count, memory MiB, multiprocessors, gi slices,
# ci slices, copy engines, decoders, encoders, jpeg, ofa) as GFD labels them per profile.
_H100_MIG = [
    ("1g.10gb", 15, 9856, 16, 1, 1, 1, 0, 0, 0, 0),
    ("1g.10gb.me", 1, 9856, 16, 1, 1, 1, 1, 0, 1, 1),
    ("2g.20gb", 1, 20096, 32, 2, 2, 2, 2, 0, 2, 0),
    ("3g.40gb", 1, 40320, 60, 3, 3, 3, 3, 0, 3, 0),
]


def _node(
    name: str,
    labels: dict[str, str],
    extended: dict[str, str],
    *,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    capacity = {"cpu": CPU, "memory": MEM, "pods": "110", "ephemeral-storage": "3Ti", **extended}
    allocatable = {
        "cpu": CPU_ALLOC,
        "memory": MEM_ALLOC,
        "pods": "110",
        "ephemeral-storage": "2900Gi",
        **extended,
    }
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": dict(KWOK),
            "labels": {
                **_COMMON,
                "kubernetes.io/hostname": name,
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": capacity, "allocatable": allocatable},
    }
    return node


def a100(name: str, pool: str = "a100", **kw: Any) -> dict[str, Any]:
    return _node(
        name,
        {
            POOL: pool,
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/gpu.family": "ampere",
            "nvidia.com/gpu.compute.major": "8",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.machine": "DGX-A100",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.strategy": "none",
        },
        {"nvidia.com/gpu": "8"},
        **kw,
    )


def h100_mixed(name: str, pool: str = "h100-mig") -> dict[str, Any]:
    labels = {
        POOL: pool,
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "custom-config",
        "nvidia.com/mig.config.state": "success",
    }
    extended = {"nvidia.com/gpu": "1"}
    for suffix, count, mem, sms, gi, ci, copy_, dec, enc, jpeg, ofa in _H100_MIG:
        p = f"nvidia.com/mig-{suffix}"
        labels.update(
            {
                f"{p}.count": str(count),
                f"{p}.memory": str(mem),
                f"{p}.multiprocessors": str(sms),
                f"{p}.slices.gi": str(gi),
                f"{p}.slices.ci": str(ci),
                f"{p}.engines.copy": str(copy_),
                f"{p}.engines.decoder": str(dec),
                f"{p}.engines.encoder": str(enc),
                f"{p}.engines.jpeg": str(jpeg),
                f"{p}.engines.ofa": str(ofa),
                f"{p}.replicas": "1",
                f"{p}.sharing-strategy": "none",
                f"{p}.product": f"NVIDIA-H100-80GB-HBM3-MIG-{suffix}",
            }
        )
        extended[p] = str(count)
    return _node(name, labels, extended)


def l4_shared(name: str, pool: str = "l4-shared") -> dict[str, Any]:
    return _node(
        name,
        {
            POOL: pool,
            "nvidia.com/gpu.product": "NVIDIA-L4-SHARED",
            "nvidia.com/gpu.memory": "23034",
            "nvidia.com/gpu.count": "4",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
            "nvidia.com/gpu.family": "ada-lovelace",
            "nvidia.com/gpu.compute.major": "8",
            "nvidia.com/gpu.compute.minor": "9",
            "nvidia.com/mig.capable": "false",
            "nvidia.com/mps.capable": "false",
        },
        {"nvidia.com/gpu.shared": "16"},
    )


def l40s_hami(name: str, pool: str = "l40s-hami") -> dict[str, Any]:
    """2× L40S shared by HAMi: ten vGPUs each as `nvidia.com/gpu`, beside HAMi's
    `nvidia.com/gpumem` (MiB) and `nvidia.com/gpucores` (percent per GPU). Not in
    `all_nodes`: the sharing test adds it and takes it away."""
    return _node(
        name,
        {
            POOL: pool,
            "nvidia.com/gpu.product": "NVIDIA-L40S",
            "nvidia.com/gpu.memory": "46068",
            "nvidia.com/gpu.count": "2",
            "nvidia.com/mig.capable": "false",
        },
        {"nvidia.com/gpu": "20", "nvidia.com/gpumem": "92136", "nvidia.com/gpucores": "200"},
    )


def all_nodes() -> list[dict[str, Any]]:
    return [
        a100("a100-0"),
        a100("a100-1"),
        h100_mixed("h100-mig-0"),
        l4_shared("l4-shared-0"),
        a100("a100-reserved-0", pool="reserved", taints=[copy.deepcopy(RESERVED_TAINT)]),
    ]


#: the pools as Quartermaster is configured for them (Pool.node_selector)
POOL_SELECTORS = {
    "a100": {POOL: "a100"},
    "h100-mig": {POOL: "h100-mig"},
    "l4-shared": {POOL: "l4-shared"},
    "reserved": {POOL: "reserved"},
}
