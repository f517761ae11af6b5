"""A request's shape: the one builder of `scheduling.types.Shape` for the portal.

The submit form and the API turn a device profile into shape fields
(`profile_fields`), the submit service checks and normalizes them (`normalize`),
and the preview, the snapshot and the models build the core's `Shape` from them
(`shape_build`, `request_shape`), so a request is the same shape everywhere.

Plain functions over plain values (or any object with a request's fields): this
module imports no model, so models, selectors, services and the tick may all use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from scheduling import types as st

WHOLE, MIG, SHARED = (k.value for k in st.ProfileKind)
KINDS = tuple(k.value for k in st.ProfileKind)
#: devices per pod a request may ask for
MAX_GPUS_PER_NODE = 16
#: pods a gang may span
MAX_PODS = 64

#: a request's fields that its shape is built from, as `shape_build` takes them: the one list
#: that the submit form, the submit service, the preview and the tick's snapshot read
DEVICE_FIELDS = (
    "profile_kind",
    "mig_profile",
    "milli",
    "gpu_memory_mib",
    "count",
    "pods",
    "cpu_milli",
    "memory_mib",
)
#: the same and the request's kind (serving replicas are spread)
SHAPE_FIELDS = (*DEVICE_FIELDS, "kind")


class ShapeError(ValueError):
    """A shape field that is out of range; `field` names it for a form or a 400."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class ProfileLike(Protocol):
    kind: str
    mig_profile: str
    milli: int
    gpu_memory_mib: int


def profile_fields(profile: ProfileLike) -> dict[str, Any]:
    """The shape fields a device profile stands for (the form's and the API's `profile`)."""
    return {
        "profile_kind": profile.kind,
        "mig_profile": profile.mig_profile,
        "milli": profile.milli,
        "gpu_memory_mib": profile.gpu_memory_mib,
    }


def normalize(
    profile_kind: str, mig_profile: str = "", milli: int = 1000, gpu_memory_mib: int = 0
) -> tuple[str, str, int, int]:
    """Check a profile and keep only what its kind uses: (kind, mig profile, milli, memory cap).

    A whole GPU is 1000 milli with no memory cap; a shared slice keeps its milli
    (1-999) and cap; a MIG instance keeps its profile name. Raises ShapeError.
    """
    if profile_kind not in KINDS:
        raise ShapeError("profile_kind", f"Choose one of {', '.join(KINDS)}.")
    if profile_kind == SHARED and (not isinstance(milli, int) or not 1 <= milli <= 999):
        raise ShapeError("milli", "A shared slice takes between 1 and 999 milli-GPU.")
    if profile_kind == MIG and not mig_profile:
        raise ShapeError("mig_profile", "Choose a MIG profile.")
    return _kept(profile_kind, mig_profile, milli, gpu_memory_mib)


def _kept(
    kind: str, mig_profile: str, milli: int, gpu_memory_mib: int
) -> tuple[str, str, int, int]:
    if kind == SHARED:
        return SHARED, "", milli, gpu_memory_mib
    if kind == MIG:
        return MIG, mig_profile, 1000, 0
    return WHOLE, "", 1000, 0


def check_counts(count: int, pods: int) -> None:
    """Devices per pod and pods per gang within bounds. Raises ShapeError."""
    if not 1 <= count <= MAX_GPUS_PER_NODE:
        raise ShapeError("count", f"Ask for between 1 and {MAX_GPUS_PER_NODE} devices per node.")
    if not 1 <= pods <= MAX_PODS:
        raise ShapeError("pods", f"A gang spans between 1 and {MAX_PODS} nodes.")


def taints(raw: Iterable[Mapping[str, str]]) -> tuple[st.Taint, ...]:
    """A node's or a pool's taints (as stored: [{"key", "value", "effect"}]) for the core."""
    return tuple(st.Taint(t["key"], t.get("value", ""), t.get("effect", "NoSchedule")) for t in raw)


def tolerations(pools: Iterable[Any]) -> tuple[st.Taint, ...]:
    """What a request tolerates: the taints of the pools that may serve it.

    Taints keep other workloads off a pool; they are not a barrier for the pool's
    own users. Sorted, so that equal sets are equal shapes.
    """
    found = {t for p in pools for t in taints(p.taints)}
    return tuple(sorted(found, key=lambda t: (t.key, t.value, t.effect)))


def shape_build(
    *,
    profile_kind: str,
    mig_profile: str = "",
    milli: int = 1000,
    gpu_memory_mib: int = 0,
    count: int = 1,
    pods: int = 1,
    cpu_milli: int = 1000,
    memory_mib: int = 4096,
    tolerations: tuple[st.Taint, ...] = (),
    kind: str = "batch",
) -> st.Shape:
    """The core's Shape of a request with these fields, keeping what its kind uses.

    Serving replicas (`kind` "serving") are placed with the `spread` policy.

    Builds, never refuses: the submit service checked the fields (`normalize`).
    """
    profile_kind, mig_profile, milli, gpu_memory_mib = _kept(
        profile_kind, mig_profile, milli, gpu_memory_mib
    )
    return st.Shape(
        kind=st.ProfileKind(profile_kind),
        count=count,
        milli=milli,
        gpu_memory_mib=gpu_memory_mib,
        mig_profile=mig_profile,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        tolerations=tolerations,
        pods=pods,
        placement="spread" if kind == "serving" else "",
    )


def request_shape(r: Any, tolerations: tuple[st.Taint, ...] = ()) -> st.Shape:
    """The Shape of a stored request (a GpuRequest, or anything with its fields)."""
    return shape_build(
        **{f: getattr(r, f) for f in DEVICE_FIELDS},
        tolerations=tolerations,
        kind=getattr(r, "kind", "batch"),
    )
