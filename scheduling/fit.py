"""The one rule for "can this shape fit here": every part of the core asks this module.

Two questions, for one pod of a `Shape` on one `Node`:

* **ever** (`can_ever_host`, `eligible_devices(..., now=False)`): could the node hold the
  pod if it were empty — taints tolerated (`NoSchedule`/`NoExecute`), enough CPU and host
  memory in total, and `count` devices that could give one unit each (a MIG request
  needs one device: several instances may share it). Readiness, cordons and device
  health are passing states and are ignored, so a request is never rejected that could
  run once a node comes back.
* **now** (`eligible_devices(..., now=True)`, `can_host_now`): the same on the node as it
  is — ready, not cordoned, healthy devices only. The packer (`scheduling.packer`) starts
  from this and then checks the free amounts exactly.

A device gives one unit of a shape when its model is allowed (`Shape.gpu_models`, empty =
any) and its partitioning serves the profile: `WHOLE` on a non-MIG device; `SHARED` on a
`TIME_SLICING` device with at least the slice's memory cap and a share of at most 1000;
`MIG` on a `MIG` device whose family (`scheduling.mig.family_for`) has the profile; a MIG
device of an unknown GPU serves no MIG shape (its geometry is never guessed).

`fits_free` answers "does one pod fit given what is held" from per-device held milli and
held CPU and memory — a necessary condition (a MIG instance needs only a device that is
not wholly taken; the packer decides the geometry). Reservations
(`reservation.Reservations.reserve`, `_drain_ms`) and preemption (`preemption._hopeless`)
use it; the replay's job filter uses `can_ever_host`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduling import mig
from scheduling.types import (
    WHOLE_GPU_MILLI,
    Device,
    Node,
    Partitioning,
    ProfileKind,
    Shape,
)

#: taint effects that keep a pod off a node unless it tolerates them
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def tolerates(node: Node, shape: Shape) -> bool:
    """Return whether the shape tolerates every blocking taint of the node."""
    for taint in node.taints:
        if taint.effect not in BLOCKING_EFFECTS:
            continue
        if not any(t.key == taint.key and t.value in ("", taint.value) for t in shape.tolerations):
            return False
    return True


def schedulable(node: Node) -> bool:
    """Return whether new work may land on the node now (ready and not cordoned)."""
    return node.ready and not node.cordoned


def mig_family(device: Device) -> mig.MigFamily | None:
    return mig.family_for(device.model, device.memory_mib)


def mig_profile(family: mig.MigFamily | None, name: str) -> mig.MigProfile | None:
    """The MIG profile by name in the device's family; None on an unknown GPU."""
    return family.profile(name) if family is not None else None


def device_serves(
    device: Device, shape: Shape, family: mig.MigFamily | None = None, *, now: bool = True
) -> bool:
    """Return whether the device could give one unit of the shape (free amounts aside).

    `family` is the device's MIG family when the caller has it cached; None looks it up.
    """
    if now and not device.healthy:
        return False
    if shape.gpu_models and device.model not in shape.gpu_models:
        return False
    if shape.kind is ProfileKind.WHOLE:
        return device.partitioning is not Partitioning.MIG
    if shape.kind is ProfileKind.SHARED:
        return (
            device.partitioning is Partitioning.TIME_SLICING
            and shape.milli <= WHOLE_GPU_MILLI
            and shape.gpu_memory_mib <= device.memory_mib
        )
    if device.partitioning is not Partitioning.MIG:
        return False
    fam = family if family is not None else mig_family(device)
    return mig_profile(fam, shape.mig_profile) is not None


def devices_needed(shape: Shape) -> int:
    """Devices one pod needs at least: `count`, but one for MIG (instances may share)."""
    if shape.count <= 0:
        return 0
    return 1 if shape.kind is ProfileKind.MIG else shape.count


def eligible_devices(
    node: Node,
    shape: Shape,
    families: Sequence[mig.MigFamily | None] | None = None,
    *,
    now: bool = True,
) -> tuple[bool, ...] | None:
    """Per device of the node, whether it may serve the shape; None when the node is out.

    Out: not schedulable (with `now`), a blocking taint not tolerated, less CPU or host
    memory in total than one pod asks, or fewer serving devices than `devices_needed`.
    A shape without devices (`count == 0`) gets `()` on a node that is not out.
    """
    if now and not schedulable(node):
        return None
    if not tolerates(node, shape):
        return None
    if node.cpu_milli < shape.cpu_milli or node.memory_mib < shape.memory_mib:
        return None
    if shape.count <= 0:
        return ()
    if families is None:
        flags = tuple(device_serves(d, shape, None, now=now) for d in node.devices)
    else:
        flags = tuple(
            device_serves(d, shape, f, now=now) for d, f in zip(node.devices, families, strict=True)
        )
    return flags if sum(flags) >= devices_needed(shape) else None


def can_ever_host(node: Node, shape: Shape) -> bool:
    """Return whether one pod of the shape fits the node when it is empty (see "ever")."""
    return eligible_devices(node, shape, now=False) is not None


def can_host_now(node: Node, shape: Shape) -> bool:
    """Return whether one pod of the shape fits the node, empty, as the node is now."""
    return eligible_devices(node, shape, now=True) is not None


def unit_room(shape: Shape) -> int:
    """Free milli a device needs for one unit: a whole device, the slice, or any (MIG)."""
    if shape.kind is ProfileKind.WHOLE:
        return WHOLE_GPU_MILLI
    return shape.milli if shape.kind is ProfileKind.SHARED else 1


def fits_free(
    node: Node,
    shape: Shape,
    flags: tuple[bool, ...],
    held: Mapping[int, int],
    cpu_held: int = 0,
    memory_held: int = 0,
) -> bool:
    """Return whether one pod fits given what is held (a necessary condition; see above).

    `flags` is `eligible_devices(node, shape)`; `held` the milli held per device index.
    """
    if node.cpu_milli - cpu_held < shape.cpu_milli:
        return False
    if node.memory_mib - memory_held < shape.memory_mib:
        return False
    need = unit_room(shape)
    room = sum(
        1
        for d, ok in zip(node.devices, flags, strict=False)
        if ok and WHOLE_GPU_MILLI - held.get(d.index, 0) >= need
    )
    return room >= devices_needed(shape)
