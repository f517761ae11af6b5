"""Device packer: where a request's devices go.

`ClusterState` is the mutable free-capacity view of a set of nodes. The
scheduling core asks it for a placement (`find`), then commits (`take`) or
gives back (`give`) capacity; nothing else touches its counters.

This is first fit in node order; policies are selected by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from scheduling.types import (
    WHOLE_GPU_MILLI,
    DeviceGrant,
    MigInstance,
    Node,
    Partitioning,
    Placement,
    PodPlacement,
    ProfileKind,
    Shape,
)

DEFAULT_POLICY = "firstfit"
POLICIES = ("firstfit",)

# Memory-slot size and allowed starts per MIG profile class (ECOSYSTEM.md §4.1).
_MIG_GEOMETRY: dict[str, tuple[int, tuple[int, ...]]] = {
    "1g1": (1, (0, 1, 2, 3, 4, 5, 6)),
    "1g2": (2, (0, 2, 4, 6)),
    "2g": (2, (0, 2, 4)),
    "3g": (4, (0, 4)),
    "4g": (4, (0,)),
    "7g": (8, (0,)),
}


def mig_geometry(profile: str, device_memory_mib: int) -> tuple[int, tuple[int, ...]]:
    """Return (size in memory slots, allowed starts) of a MIG profile on a device."""
    compute = profile.split(".", 1)[0]
    if compute == "1g":
        mem_gb = int("".join(c for c in profile.split(".", 1)[1] if c.isdigit()) or 0)
        # A 1g profile with two memory slots has about a quarter of the device's memory.
        slot_gb = device_memory_mib / 1024 / 8
        return _MIG_GEOMETRY["1g2" if mem_gb > slot_gb * 1.5 else "1g1"]
    return _MIG_GEOMETRY[compute]


@dataclass(slots=True)
class _DeviceFree:
    milli: int
    memory_mib: int
    slices: int
    #: MIG: memory slots in use (bitmask of 8)
    mig_used: int = 0
    #: MIG with a fixed layout: instances not handed out
    mig_free: list[MigInstance] = field(default_factory=list)


@dataclass(slots=True)
class _NodeFree:
    node: Node
    cpu_milli: int
    memory_mib: int
    devices: list[_DeviceFree]


def _tolerates(node: Node, shape: Shape) -> bool:
    for taint in node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(t.key == taint.key and t.value in ("", taint.value) for t in shape.tolerations):
            return False
    return True


class ClusterState:
    """Free capacity of a set of nodes; placements are found here and committed here."""

    def __init__(self, nodes: Iterable[Node], policy: str = DEFAULT_POLICY) -> None:
        if policy not in POLICIES and policy != "default":
            raise ValueError(f"unknown packing policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.policy = policy
        self._nodes: dict[str, _NodeFree] = {}
        for node in nodes:
            self._nodes[node.name] = _NodeFree(
                node=node,
                cpu_milli=node.cpu_milli,
                memory_mib=node.memory_mib,
                devices=[
                    _DeviceFree(
                        milli=WHOLE_GPU_MILLI,
                        memory_mib=d.memory_mib,
                        slices=d.replicas,
                        mig_free=list(d.mig_instances),
                    )
                    for d in node.devices
                ],
            )

    @property
    def nodes(self) -> Sequence[Node]:
        return [n.node for n in self._nodes.values()]

    def schedulable(self, node: Node) -> bool:
        return node.ready and not node.cordoned

    def find(self, shape: Shape, accept: Callable[[Node], bool] | None = None) -> Placement | None:
        """Return a placement for `shape` on nodes that `accept` allows, or None. Commits nothing."""
        pods: list[PodPlacement] = []
        used: set[str] = set()
        for _ in range(shape.pods):
            pod = None
            for free in self._nodes.values():
                if free.node.name in used:
                    continue
                if accept is not None and not accept(free.node):
                    continue
                pod = self._fit_node(free, shape)
                if pod is not None:
                    break
            if pod is None:
                return None
            pods.append(pod)
            used.add(pod.node)
        return Placement(pods=tuple(pods))

    def _fit_node(self, free: _NodeFree, shape: Shape) -> PodPlacement | None:
        node = free.node
        if not self.schedulable(node) or not _tolerates(node, shape):
            return None
        if free.cpu_milli < shape.cpu_milli or free.memory_mib < shape.memory_mib:
            return None
        grants: list[DeviceGrant] = []
        for spec, dev in zip(node.devices, free.devices, strict=True):
            if len(grants) == shape.count:
                break
            if not spec.healthy or (shape.gpu_models and spec.model not in shape.gpu_models):
                continue
            grant = self._fit_device(node.name, spec.index, spec, dev, shape)
            if grant is not None:
                grants.append(grant)
        if len(grants) < shape.count:
            return None
        return PodPlacement(node.name, tuple(grants), shape.cpu_milli, shape.memory_mib)

    def _fit_device(self, node: str, index: int, spec, dev: _DeviceFree, shape: Shape) -> DeviceGrant | None:  # type: ignore[no-untyped-def]
        if shape.kind is ProfileKind.WHOLE:
            if spec.partitioning is Partitioning.MIG or dev.milli < WHOLE_GPU_MILLI or dev.mig_used:
                return None
            return DeviceGrant(node, index, WHOLE_GPU_MILLI, spec.memory_mib)
        if shape.kind is ProfileKind.SHARED:
            if spec.partitioning is Partitioning.MIG or dev.slices < 1:
                return None
            if dev.milli < shape.milli or dev.memory_mib < shape.gpu_memory_mib:
                return None
            return DeviceGrant(node, index, shape.milli, shape.gpu_memory_mib)
        if spec.partitioning is not Partitioning.MIG:
            return None
        if spec.mig_instances:
            for inst in dev.mig_free:
                if inst.profile == shape.mig_profile:
                    return DeviceGrant(node, index, 0, 0, inst)
            return None
        size, starts = mig_geometry(shape.mig_profile, spec.memory_mib)
        for start in starts:
            mask = ((1 << size) - 1) << start
            if not dev.mig_used & mask:
                return DeviceGrant(node, index, 0, 0, MigInstance(shape.mig_profile, start, size))
        return None

    def take(self, placement: Placement) -> None:
        """Commit a placement's capacity."""
        self._apply(placement, -1)

    def give(self, placement: Placement) -> None:
        """Return a placement's capacity."""
        self._apply(placement, +1)

    def _apply(self, placement: Placement, sign: int) -> None:
        for pod in placement.pods:
            free = self._nodes.get(pod.node)
            if free is None:
                continue
            free.cpu_milli += sign * pod.cpu_milli
            free.memory_mib += sign * pod.memory_mib
            for g in pod.grants:
                dev = free.devices[g.device]
                if g.mig is not None:
                    mask = ((1 << g.mig.size) - 1) << g.mig.start
                    if sign < 0:
                        dev.mig_used |= mask
                        if g.mig in dev.mig_free:
                            dev.mig_free.remove(g.mig)
                    else:
                        dev.mig_used &= ~mask
                        if g.mig in free.node.devices[g.device].mig_instances:
                            dev.mig_free.append(g.mig)
                    continue
                dev.milli += sign * g.milli
                dev.memory_mib += sign * g.gpu_memory_mib
                if g.milli < WHOLE_GPU_MILLI:
                    dev.slices += sign
