"""Inventory: Node objects (GPU Feature Discovery labels, allocatable, taints, readiness,
cordon) into `InventoryNode`s, minus what pods Quartermaster did not create already hold."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from portal.backends.base import (
    DiscoveredNode,
    InventoryDevice,
    InventoryMig,
    InventoryNode,
)
from portal.k8s.names import (
    ACTIVE_SELECTOR,
    GPU,
    GPU_SHARED,
    HAMI_MEMORY,
    L_MANAGED_BY,
    LABEL_COUNT,
    LABEL_HOSTNAME,
    LABEL_INTERCONNECT,
    LABEL_MEMORY,
    LABEL_MIG_STATE,
    LABEL_MIG_STRATEGY,
    LABEL_POOL,
    LABEL_PRODUCT,
    LABEL_REPLICAS,
    LABEL_SHARING,
    LABEL_WORKLOAD_CONFIG,
    MANAGED_BY,
    MIG_PREFIX,
    TERMINAL_PHASES,
    mig_profile_of,
    quantity,
    to_int,
)
from scheduling import mig

log = logging.getLogger(__name__)


def nodes_list_gpu(core: Any, label_selector: str | None = None) -> list[Any]:
    """Every Node (optionally by label selector); GPU-less nodes drop out later."""
    kwargs = {"label_selector": label_selector} if label_selector else {}
    return list(core.list_node(**kwargs).items)


def gpu_nodes_discovered(nodes: Iterable[Any]) -> list[DiscoveredNode]:
    """Nodes with an NVIDIA resource or GPU Feature Discovery's product label, sorted by name."""
    out = []
    for node in nodes:
        labels = dict(node.metadata.labels or {})
        capacity = dict(node.status.capacity or {}) if node.status else {}
        gpus = sum(
            int(str(v))
            for k, v in capacity.items()
            if k.startswith("nvidia.com/") and str(v).isdigit()
        )
        if not gpus and "nvidia.com/gpu.product" not in labels:
            continue
        taints = tuple(
            (t.key, t.value or "", t.effect)
            for t in ((node.spec.taints if node.spec else None) or [])
        )
        count = labels.get("nvidia.com/gpu.count", "")
        out.append(
            DiscoveredNode(
                name=node.metadata.name,
                labels=labels,
                gpus=int(count) if count.isdigit() else gpus,
                taints=taints,
            )
        )
    return sorted(out, key=lambda n: n.name)


def pods_list_active(core: Any, namespaces: Sequence[str] | None = None) -> list[Any]:
    """Non-terminal pods: cluster-wide when `namespaces` is None, else from those namespaces."""
    selector = ACTIVE_SELECTOR
    if namespaces is None:
        return list(core.list_pod_for_all_namespaces(field_selector=selector).items)
    pods: list[Any] = []
    for ns in namespaces:
        pods.extend(core.list_namespaced_pod(ns, field_selector=selector).items)
    return pods


def pool_for_labels(
    labels: Mapping[str, str], pool_selectors: Mapping[str, Mapping[str, str]]
) -> str | None:
    """Return the pool whose selector matches the labels.

    1. a selector matches when every one of its labels has exactly that value;
       an empty selector matches nothing (it would grab every node);
    2. of several matches, the selector with the most labels wins;
    3. then the pool name, for deterministic ties.
    """
    matches = [
        (-len(sel), name)
        for name, sel in pool_selectors.items()
        if sel and all(labels.get(k) == str(v) for k, v in sel.items())
    ]
    return min(matches)[1] if matches else None


def pod_requests(pod: Any) -> dict[str, Decimal]:
    """Effective requests of a pod: max(sum of containers, largest init container) + overhead."""
    total: dict[str, Decimal] = {}
    for c in pod.spec.containers or ():
        for k, v in _container_requests(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in pod.spec.init_containers or ():
        for k, v in _container_requests(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    for k, v in (pod.spec.overhead or {}).items():
        total[k] = total.get(k, Decimal(0)) + quantity(v)
    return total


def _container_requests(container: Any) -> dict[str, Decimal]:
    res = container.resources
    if res is None:
        return {}
    # Extended resources may be given as limits only; requests then default to limits.
    merged = dict(res.limits or {})
    merged.update(res.requests or {})
    return {k: quantity(v) for k, v in merged.items()}


def is_managed(obj: Any) -> bool:
    labels = obj.metadata.labels or {}
    return labels.get(L_MANAGED_BY) == MANAGED_BY


def _node_ready(node: Any) -> bool:
    for cond in node.status.conditions or ():
        if cond.type == "Ready":
            return bool(cond.status == "True")
    return False


def _model(labels: Mapping[str, str]) -> str:
    product = labels.get(LABEL_PRODUCT, "")
    product = product.removesuffix("-SHARED")
    return product.split("-MIG-", 1)[0] or "unknown"


def _spread_units(count: int, per_device: int, usable: int) -> list[int]:
    """Usable units per device: fill devices in index order with `usable` units.

    Node objects do not say *which* device lost a unit (to a foreign pod or to
    the device plugin's health check), only how many; the node agent reports
    the real device. So the last devices are the ones shown short.
    """
    return [max(0, min(per_device, usable - i * per_device)) for i in range(count)]


def node_inventory(
    node: Any,
    pods: Iterable[Any],
    pool: str,
    *,
    require_mig_state: bool = True,
) -> InventoryNode:
    """Describe one GPU node as the packer sees it.

    Capacity comes from `status.allocatable` (the device plugin lowers it when
    a device turns unhealthy), never `capacity`, minus the requests of
    non-terminal pods on the node that Quartermaster did not create. A node
    whose MIG state (`nvidia.com/mig.config.state`) is not `success` offers no
    MIG instance: its devices are marked unhealthy so nothing is packed there.
    """
    labels = dict(node.metadata.labels or {})
    name = node.metadata.name
    alloc = {k: quantity(v) for k, v in (node.status.allocatable or {}).items()}
    cap = {k: quantity(v) for k, v in (node.status.capacity or {}).items()}
    used: dict[str, Decimal] = {}
    for pod in pods:
        if pod.spec.node_name != name or is_managed(pod) or pod.status.phase in TERMINAL_PHASES:
            continue
        for k, v in pod_requests(pod).items():
            used[k] = used.get(k, Decimal(0)) + v

    def free(resource: str) -> int:
        return max(0, int(alloc.get(resource, Decimal(0)) - used.get(resource, Decimal(0))))

    cpu_milli = max(0, int((alloc.get("cpu", Decimal(0)) - used.get("cpu", Decimal(0))) * 1000))
    memory_mib = max(
        0, int((alloc.get("memory", Decimal(0)) - used.get("memory", Decimal(0))) / 2**20)
    )
    taints = tuple((t.key, t.value or "", t.effect) for t in (node.spec.taints or ()))
    return InventoryNode(
        name=name,
        pool=pool,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        devices=_devices(labels, alloc, cap, free, require_mig_state),
        labels=labels,
        taints=taints,
        ready=_node_ready(node),
        cordoned=bool(node.spec.unschedulable),
        interconnect=labels.get(LABEL_INTERCONNECT, "pcie"),
    )


def _time_shared_mig(labels: Mapping[str, str], resource: str) -> bool:
    """A MIG resource whose instances are time-sliced or MPS-shared: GFD labels its
    `<resource>.sharing-strategy` (and its allocatable counts replicas, not instances)."""
    return labels.get(f"{resource}.sharing-strategy", "none") not in ("none", "")


def _devices(
    labels: Mapping[str, str],
    alloc: Mapping[str, Decimal],
    cap: Mapping[str, Decimal],
    free: Callable[[str], int],
    require_mig_state: bool,
) -> tuple[InventoryDevice, ...]:
    model = _model(labels)
    memory = to_int(labels.get(LABEL_MEMORY))
    strategy = labels.get(LABEL_MIG_STRATEGY, "none")
    mig_all = sorted(k for k in alloc if k.startswith(MIG_PREFIX))
    mig_resources = [
        k for k in mig_all if mig_profile_of(k) is not None and not _time_shared_mig(labels, k)
    ]
    refused = [k for k in mig_all if k not in mig_resources]
    if refused:
        # Time-shared MIG is not packed: a share is not an instance, and the packer would
        # count replicas as instances (docs/kubernetes.md).
        log.warning(
            "node %s: time-shared MIG resources %s are not offered (not supported)",
            labels.get(LABEL_HOSTNAME, "?"),
            ", ".join(refused),
        )
    if strategy in ("single", "mixed") and (mig_resources or strategy == "single"):
        mig_ok = labels.get(LABEL_MIG_STATE) == "success" or not require_mig_state
        whole: tuple[InventoryDevice, ...] = ()
        if strategy == "mixed":
            # GPUs left out of MIG mode are advertised as nvidia.com/gpu beside the instances.
            n_whole = int(cap.get(GPU, alloc.get(GPU, Decimal(0))))
            whole = _whole_devices(n_whole, model, memory, alloc, free, first_index=0)
        migs = _mig_devices(
            labels, strategy, mig_resources, free, model, mig_ok, first_index=len(whole)
        )
        return whole + migs
    sharing = labels.get(LABEL_SHARING, "none")
    count = max(to_int(labels.get(LABEL_COUNT)), int(cap.get(GPU, Decimal(0))))
    hami = HAMI_MEMORY in alloc
    if GPU_SHARED in alloc or sharing in ("time-slicing", "mps") or hami:
        resource = GPU_SHARED if GPU_SHARED in alloc else GPU
        replicas = max(1, to_int(labels.get(LABEL_REPLICAS), 1))
        if hami and replicas == 1 and to_int(labels.get(LABEL_COUNT)):
            # HAMi advertises vGPUs (its split count per GPU) as nvidia.com/gpu
            replicas = max(1, int(cap.get(GPU, Decimal(0))) // to_int(labels.get(LABEL_COUNT)))
        count = to_int(labels.get(LABEL_COUNT)) or math.ceil(
            int(cap.get(resource, Decimal(0))) / replicas
        )
        units = _spread_units(count, replicas, free(resource))
        return tuple(
            InventoryDevice(
                index=i,
                model=model,
                memory_mib=memory,
                healthy=u > 0,
                partitioning="time-slicing",
                replicas=max(u, 1),
            )
            for i, u in enumerate(units)
        )
    return _whole_devices(count, model, memory, alloc, free, first_index=0)


def _whole_devices(
    count: int,
    model: str,
    memory: int,
    alloc: Mapping[str, Decimal],
    free: Callable[[str], int],
    first_index: int,
) -> tuple[InventoryDevice, ...]:
    """Whole GPUs: free ones first, then those foreign pods hold, then those the device
    plugin took out (allocatable below capacity). Only counts are known here; which device
    is shown foreign is settled against the portal's own bookings when stored
    (services.nodes.sync_inventory)."""
    usable = _spread_units(count, 1, free(GPU))
    allocatable = _spread_units(count, 1, int(alloc.get(GPU, Decimal(0))))
    return tuple(
        InventoryDevice(
            index=first_index + i,
            model=model,
            memory_mib=memory,
            healthy=u > 0,
            foreign=u == 0 and a > 0,
        )
        for i, (u, a) in enumerate(zip(usable, allocatable, strict=True))
    )


def _device_memory_from_product(product: str) -> int:
    match = re.search(r"(\d+)GB", product.split("-MIG-", 1)[0])
    return int(match.group(1)) * 1024 if match else 0


def _mig_devices(
    labels: Mapping[str, str],
    strategy: str,
    mig_resources: Sequence[str],
    free: Callable[[str], int],
    model: str,
    mig_ok: bool,
    first_index: int = 0,
) -> tuple[InventoryDevice, ...]:
    """MIG devices with a layout synthesised from per-profile counts.

    Node objects give how many instances of each profile are allocatable, not
    on which GPU or where; the layout below places them biggest first, each at
    its highest allowed start, which reproduces NVIDIA's default layouts
    (`all-balanced`, `all-1g.*`). The node agent reports the real placement.
    """
    product = labels.get(LABEL_PRODUCT, "")
    if strategy == "single":
        profile = product.split("-MIG-", 1)[1] if "-MIG-" in product else ""
        wanted = {profile: free(GPU)} if profile else {}
        device_memory = _device_memory_from_product(product) or to_int(labels.get(LABEL_MEMORY)) * 8
    else:
        wanted = {str(mig_profile_of(r)): free(r) for r in mig_resources}
        device_memory = to_int(labels.get(LABEL_MEMORY)) or _device_memory_from_product(product)
    # Under `mixed`, GPUs not in MIG mode are offered as whole devices (first_index of them).
    count = max(0, to_int(labels.get(LABEL_COUNT)) - first_index) if strategy == "mixed" else 0
    layouts: list[list[InventoryMig]] = [[] for _ in range(count)]
    order = sorted(wanted, key=lambda p: (-_compute(p), p))
    if wanted and mig.family_for(model, device_memory) is None:
        # no guessed geometry: the devices stay without instances, so nothing lands on them
        log.warning("%s", mig.unknown_gpu_message(model))
    for profile in order:
        prof = mig.profile_for(model, device_memory, profile)
        if prof is None:
            continue
        for n in range(wanted[profile]):
            _place(layouts, prof, n, grow=strategy == "single")
    if not mig_ok:
        layouts = [[] for _ in layouts]
    return tuple(
        InventoryDevice(
            index=first_index + i,
            model=model,
            memory_mib=device_memory,
            partitioning="mig",
            healthy=mig_ok,
            mig_instances=tuple(sorted(lay, key=lambda m: m.start)),
        )
        for i, lay in enumerate(layouts)
    )


def _compute(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def _place(
    layouts: list[list[InventoryMig]],
    prof: mig.MigProfile,
    n: int,
    grow: bool,
) -> None:
    """Put one instance on a device, trying device `n mod count` first (spread evenly)."""
    profile, size = prof.name, prof.slots
    slots = prof.gpu_slots
    count = len(layouts)
    for k in range(count):
        lay = layouts[(n + k) % count]
        used = 0
        for m in lay:
            used |= ((1 << m.size) - 1) << m.start
        if sum(_compute(m.profile) for m in lay) + prof.compute > prof.gpu_compute:
            continue
        for start in sorted(prof.starts, reverse=True):
            mask = ((1 << size) - 1) << start
            if start + size <= slots and not used & mask:
                lay.append(InventoryMig(profile=profile, start=start, size=size))
                return
    if grow:
        layouts.append([])
        _place(layouts, prof, len(layouts) - 1, grow=False)
    else:
        log.warning("MIG %s: %d instance(s) do not fit the synthesised layout", profile, 1)


def inventory_from_nodes(
    nodes: Iterable[Any],
    pods: Iterable[Any],
    pool_selectors: Mapping[str, Mapping[str, str]] | None,
    *,
    require_mig_state: bool = True,
) -> list[InventoryNode]:
    """InventoryNodes for every node that belongs to a pool, sorted by name.

    With `pool_selectors` None a node's pool is its `quartermaster.io/pool`
    label. Nodes in no pool, without any NVIDIA resource, or configured for VM
    passthrough (`nvidia.com/gpu.workload.config` other than `container`) are
    left out.
    """
    pods = list(pods)
    out: list[InventoryNode] = []
    for node in nodes:
        labels = node.metadata.labels or {}
        if pool_selectors is None:
            pool = labels.get(LABEL_POOL)
        else:
            pool = pool_for_labels(labels, pool_selectors)
        if not pool:
            continue
        if labels.get(LABEL_WORKLOAD_CONFIG, "container") != "container":
            continue
        resources = set(node.status.allocatable or {}) | set(node.status.capacity or {})
        if not any(r.startswith("nvidia.com/") for r in resources):
            continue
        out.append(node_inventory(node, pods, pool, require_mig_state=require_mig_state))
    return sorted(out, key=lambda n: n.name)


def node_facts(node: Any) -> dict[str, Any]:
    """What a launch needs to know about its node: hostname label and resource names."""
    labels = node.metadata.labels or {}
    return {
        "hostname": labels.get(LABEL_HOSTNAME, node.metadata.name),
        "resources": sorted((node.status.allocatable or {}).keys()),
        "mig_strategy": labels.get(LABEL_MIG_STRATEGY, "none"),
    }
