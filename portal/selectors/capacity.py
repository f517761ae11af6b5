"""The capacity map: pools, nodes and devices with what holds each slot; offered device profiles."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from portal.lib import words
from portal.models import (
    DEVICE_FAULTS,
    Allocation,
    Attempt,
    Device,
    DeviceCondition,
    DeviceProfile,
    Node,
    Pool,
    heartbeat_stale_before,
    usable_q,
)


def offered_profiles(pool: Pool | None = None) -> QuerySet[DeviceProfile]:
    """Device profiles some pool really offers (the named one, or any production pool)."""
    pools = Pool.offering(pool)
    offered = [
        p.pk
        for p in DeviceProfile.objects.all()
        if any(x.offers(p.kind, p.mig_profile) for x in pools)
    ]
    return DeviceProfile.objects.filter(pk__in=offered).order_by("kind", "name")


def team_hue(name: str) -> int:
    """A stable colour (HSL hue) per team for the capacity map."""
    return int(hashlib.sha1(name.encode()).hexdigest()[:4], 16) % 360


@dataclass
class Cell:
    """One slot of one device as the map draws it."""

    label: str
    status: str  # free, allocated, fragmented, quarantined, foreign, unhealthy, stale, cordoned
    team: str = ""
    request_id: int | None = None
    width: int = 1  # in eighths for MIG, shares for time-slicing
    hue: int = 0


@dataclass
class DeviceView:
    index: int
    model: str
    partitioning: str
    healthy: bool
    health_reason: str
    utilization_pct: int
    memory_used_mib: int
    memory_mib: int
    cells: list[Cell] = field(default_factory=list)
    #: DeviceCondition value: usable, quarantined, foreign, unhealthy, stale, not_ready, cordoned
    condition: str = "usable"
    quarantined: bool = False
    pk: int = 0


@dataclass
class NodeView:
    node: Node
    devices: list[DeviceView] = field(default_factory=list)


def _slot_milli(slot: str, replicas: int) -> int:
    """GPU milli one Allocation slot stands for (see Allocation's docstring)."""
    if slot.startswith("m"):
        return 1000 // 8
    if slot.startswith("s"):
        return 1000 // max(1, replicas)
    return 1000


def pool_summaries(now: datetime | None = None) -> list[dict[str, Any]]:
    """Per pool: devices by condition, allocated and free GPU milli (four grouped queries).

    Free counts usable devices only (`Device.objects.usable`, the one rule the
    tick and the metrics use too): a quarantined, unhealthy or stale device, or
    one on a cordoned node, is never free.
    """
    now = now or timezone.now()
    pools = list(Pool.objects.all())
    devices = {
        r["node__pool_id"]: r
        for r in Device.objects.values("node__pool_id").annotate(
            n=Count("id"),
            # n_-prefixed: an annotation named like a field would shadow it in the filters.
            n_quarantined=Count("id", filter=Q(quarantined=True)),
            n_unhealthy=Count(
                "id",
                filter=Q(quarantined=False)
                & ((Q(healthy=False) & Q(foreign=False)) | Q(agent_healthy=False)),
            ),
            n_foreign=Count("id", filter=Q(quarantined=False, foreign=True, agent_healthy=True)),
            n_stale=Count("id", filter=Q(node__last_heartbeat__lt=heartbeat_stale_before(now))),
            n_usable=Count("id", filter=usable_q(now)),
        )
    }
    nodes = {
        r["pool_id"]: r
        for r in Node.objects.values("pool_id").annotate(
            n=Count("id"),
            cordoned=Count("id", filter=Q(cordoned=True)),
            not_ready=Count("id", filter=Q(ready=False)),
        )
    }
    held = dict(
        Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES)
        .values("pool_id")
        .annotate(s=Sum("gpus_milli"))
        .values_list("pool_id", "s")
    )
    taken_on_usable: dict[int, int] = defaultdict(int)
    for pool_id, slot, replicas in Allocation.objects.filter(
        usable_q(now, "device__"), active=True
    ).values_list("device__node__pool_id", "slot", "device__replicas"):
        taken_on_usable[pool_id] += _slot_milli(slot, replicas)
    out = []
    for p in pools:
        d = devices.get(p.pk, {})
        n = nodes.get(p.pk, {})
        total = d.get("n", 0) * 1000
        out.append(
            {
                "pool": p,
                "nodes": n.get("n", 0),
                "cordoned": n.get("cordoned", 0),
                "not_ready": n.get("not_ready", 0),
                "devices": d.get("n", 0),
                "quarantined": d.get("n_quarantined", 0),
                "unhealthy": d.get("n_unhealthy", 0),
                "foreign": d.get("n_foreign", 0),
                "stale": d.get("n_stale", 0),
                "usable": d.get("n_usable", 0),
                "total_milli": total,
                "allocated_milli": held.get(p.pk) or 0,
                "free_milli": max(0, d.get("n_usable", 0) * 1000 - taken_on_usable[p.pk]),
            }
        )
    return out


def capacity_nodes(nodes: Sequence[Node], now: datetime | None = None) -> list[NodeView]:
    """Node → device → slot cells for one page of nodes (two queries, whatever the page size)."""
    now = now or timezone.now()
    node_ids = [n.pk for n in nodes]
    by_id = {n.pk: n for n in nodes}
    by_node: dict[int, list[Device]] = defaultdict(list)
    for d in Device.objects.filter(node_id__in=node_ids).order_by("node_id", "index"):
        d.node = by_id[d.node_id]
        by_node[d.node_id].append(d)
    allocs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in Allocation.objects.filter(active=True, device__node_id__in=node_ids).values(
        "device_id",
        "slot",
        "mig_profile",
        "mig_start",
        "mig_size",
        "milli",
        "attempt__request_id",
        "attempt__request__team__name",
    ):
        allocs[a["device_id"]].append(dict(a))
    return [
        NodeView(n, [_device_view(d, allocs.get(d.pk, []), now) for d in by_node.get(n.pk, [])])
        for n in nodes
    ]


def _device_view(d: Device, allocs: list[dict[str, Any]], now: datetime) -> DeviceView:
    condition = d.condition(now)
    view = DeviceView(
        d.index,
        d.model,
        d.partitioning,
        condition not in DEVICE_FAULTS,
        d.health_reason,
        d.utilization_pct,
        d.memory_used_mib,
        d.memory_mib,
        condition=str(condition),
        quarantined=d.quarantined,
        pk=d.pk,
    )
    by_slot = {a["slot"]: a for a in allocs}

    def taken(a: dict[str, Any], label: str, width: int = 1) -> Cell:
        team = a["attempt__request__team__name"] or ""
        return Cell(label, "allocated", team, a["attempt__request_id"], width, team_hue(team))

    if d.partitioning == Pool.Partitioning.MIG:
        instances = d.mig_instances or [
            {"profile": a["mig_profile"], "start": a["mig_start"], "size": a["mig_size"]}
            for a in allocs
            if a["mig_start"] >= 0
        ]
        seen = set()
        for inst in sorted(instances, key=lambda m: int(m["start"])):
            key = int(inst["start"])
            if key in seen:
                continue
            seen.add(key)
            a = by_slot.get(f"m{key}")
            width = int(inst.get("size", 1))
            view.cells.append(
                taken(a, inst["profile"], width)
                if a
                else Cell(inst["profile"], "free", width=width)
            )
    elif d.partitioning == Pool.Partitioning.TIME_SLICING:
        for k in range(max(1, d.replicas)):
            a = by_slot.get(f"s{k}")
            label = f"{words.gpus(a['milli'])} GPU" if a else f"s{k}"
            view.cells.append(taken(a, label) if a else Cell(label, "free"))
    else:
        a = by_slot.get("gpu")
        view.cells.append(taken(a, "GPU") if a else Cell("GPU", "free"))
    partly_used = any(c.status == "allocated" for c in view.cells)
    # The usable-device rule decides: a device that may not take work has no free cell.
    unusable = {
        DeviceCondition.QUARANTINED: "quarantined",
        DeviceCondition.FOREIGN: "foreign",
        DeviceCondition.UNHEALTHY: "unhealthy",
        DeviceCondition.STALE: "stale",
        DeviceCondition.NOT_READY: "cordoned",
        DeviceCondition.CORDONED: "cordoned",
    }.get(condition)
    for c in view.cells:
        if c.status == "free":
            if unusable is not None:
                c.status = unusable
            elif partly_used:
                # Free, but next to someone else's work: no whole-device request can use it.
                c.status = "fragmented"
        elif condition in DEVICE_FAULTS:
            # Still held by work that runs on a faulty device: drawn as the fault.
            c.status = unusable or c.status
    return view
