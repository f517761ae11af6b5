"""The handover set's generated parts (docs/lifecycle.md): the first-stage cluster audit
(`manage.py audit_cluster`) and the Mermaid cluster diagram (`manage.py cluster_diagram`),
both read from the inventory the portal holds, or the diagram from a simulated-cluster file."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Min, Sum
from django.utils import timezone

from portal.backends.base import InventoryNode
from portal.lib import lifecycle
from portal.models import Attempt, Device, GpuRequest, Node, Pool


@dataclass(frozen=True)
class DiagramNode:
    name: str
    pool: str
    gpus: int
    model: str
    partitioning: str
    interconnect: str
    driver: str
    cordoned: bool = False


def nodes_from_db() -> list[DiagramNode]:
    counts = dict(
        Device.objects.values("node_id").annotate(n=Count("id")).values_list("node_id", "n")
    )
    models = dict(Device.objects.values_list("node_id", "model"))
    parts = dict(Device.objects.values_list("node_id", "partitioning"))
    return [
        DiagramNode(
            n.name,
            n.pool.name,
            counts.get(n.pk, 0),
            models.get(n.pk, n.pool.gpu_model),
            parts.get(n.pk, n.pool.partitioning),
            n.interconnect,
            (n.software or {}).get("driver", ""),
            n.cordoned,
        )
        for n in Node.objects.select_related("pool").order_by("pool__name", "name")
    ]


def nodes_from_inventory(inventory: Iterable[InventoryNode]) -> list[DiagramNode]:
    return [
        DiagramNode(
            n.name,
            n.pool,
            len(n.devices),
            n.devices[0].model if n.devices else "",
            n.devices[0].partitioning if n.devices else "",
            n.interconnect,
            lifecycle.node_software(n.labels)["driver"],
            n.cordoned,
        )
        for n in sorted(inventory, key=lambda n: (n.pool, n.name))
    ]


def _id(name: str) -> str:
    return "n_" + "".join(c if c.isalnum() else "_" for c in name)


def mermaid(nodes: list[DiagramNode], *, portal_label: str = "Quartermaster") -> str:
    """A Mermaid flowchart: the portal and its scheduler, a subgraph per pool, a box per node
    with its GPUs, partitioning, interconnect and driver; drift shows as a dashed box."""
    by_pool: dict[str, list[DiagramNode]] = defaultdict(list)
    for n in nodes:
        by_pool[n.pool].append(n)
    lines = [
        "flowchart LR",
        f'  portal["{portal_label}<br/>web · worker · beat"]',
        '  db[("PostgreSQL")]',
        '  redis[("Redis")]',
        "  portal --- db",
        "  portal --- redis",
    ]
    drifted: list[str] = []
    for pool, members in sorted(by_pool.items()):
        drivers = Counter(n.driver for n in members)
        common = max(drivers, key=lambda d: (drivers[d], d))
        gpus = sum(n.gpus for n in members)
        lines.append(f'  subgraph {_id("pool_" + pool)}["pool {pool}: {gpus} GPUs"]')
        for n in members:
            note = f"driver {n.driver}" if n.driver else "driver not labelled"
            if n.driver != common:
                note += " (drift)"
                drifted.append(n.name)
            state = "<br/>cordoned" if n.cordoned else ""
            lines.append(
                f'    {_id(n.name)}["{n.name}<br/>{n.gpus}× {n.model}<br/>'
                f'{n.partitioning} · {n.interconnect}<br/>{note}{state}"]'
            )
        lines.append("  end")
        lines.append(f"  portal -->|Jobs, labels| {_id('pool_' + pool)}")
    lines += [f"  style {_id(name)} stroke-dasharray: 5 5" for name in drifted]
    return "\n".join(lines) + "\n"


def audit(now: Any = None) -> dict[str, Any]:
    """The first-stage audit: hardware, drivers, current usage per team, who needs what."""
    now = now or timezone.now()
    pools = list(Pool.objects.order_by("name"))
    hardware = []
    drivers: dict[str, dict[str, dict[str, int]]] = {}
    for p in pools:
        nodes = list(p.nodes.all())
        devices = Device.objects.filter(node__pool=p)
        hardware.append(
            {
                "pool": p.name,
                "lifecycle": p.lifecycle,
                "model": p.gpu_model,
                "memory_mib": p.gpu_memory_mib,
                "partitioning": p.partitioning,
                "interconnect": p.interconnect,
                "nodes": len(nodes),
                "gpus": devices.count(),
                "unhealthy": devices.filter(healthy=False, foreign=False).count()
                + devices.filter(quarantined=True).count(),
                "cordoned_nodes": sum(1 for n in nodes if n.cordoned),
            }
        )
        drivers[p.name] = {
            lifecycle.SOFTWARE_TITLES[f]: dict(
                Counter((n.software or {}).get(f, "") or "not labelled" for n in nodes)
            )
            for f in lifecycle.SOFTWARE_FIELDS
        }
    usage = [
        {
            "team": r["request__team__name"],
            "pool": r["pool__name"],
            "gpu_milli": r["milli"],
            "attempts": r["n"],
        }
        for r in Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES)
        .values("request__team__name", "pool__name")
        .annotate(milli=Sum("gpus_milli"), n=Count("id"))
        .order_by("request__team__name", "pool__name")
    ]
    pending = []
    for r in (
        GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
        .values("team__name", "pool__name", "profile_kind", "mig_profile", "workload_class__name")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .order_by("team__name", "pool__name", "profile_kind")
    ):
        reqs = GpuRequest.objects.filter(
            state=GpuRequest.State.PENDING,
            team__name=r["team__name"],
            pool__name=r["pool__name"],
            profile_kind=r["profile_kind"],
            mig_profile=r["mig_profile"],
            workload_class__name=r["workload_class__name"],
        )
        gpus = sum(q.gpus_milli for q in reqs)
        pending.append(
            {
                "team": r["team__name"],
                "pool": r["pool__name"] or "any production pool",
                "profile": r["mig_profile"] or r["profile_kind"],
                "class": r["workload_class__name"],
                "requests": r["n"],
                "gpu_milli": gpus,
                "oldest_wait_s": int((now - r["oldest"]).total_seconds()),
            }
        )
    return {"hardware": hardware, "drivers": drivers, "usage": usage, "pending": pending}


def audit_text(data: dict[str, Any]) -> str:
    out = ["# Cluster audit (first stage)", "", "## Hardware", ""]
    out.append(
        "| pool | lifecycle | GPU | partitioning | interconnect | nodes | GPUs | unhealthy | cordoned nodes |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|")
    for h in data["hardware"]:
        out.append(
            f"| {h['pool']} | {h['lifecycle']} | {h['model']} ({h['memory_mib'] // 1024} GiB) | "
            f"{h['partitioning']} | {h['interconnect']} | {h['nodes']} | {h['gpus']} | "
            f"{h['unhealthy']} | {h['cordoned_nodes']} |"
        )
    out += ["", "## Drivers and GPU software", ""]
    for pool, fields in data["drivers"].items():
        parts = []
        for title, versions in fields.items():
            shown = ", ".join(f"{v} ×{n}" for v, n in sorted(versions.items()))
            flag = " **drift**" if len(versions) > 1 else ""
            parts.append(f"{title}: {shown}{flag}")
        out.append(f"- {pool}: " + "; ".join(parts))
    out += ["", "## Current usage per team", ""]
    if not data["usage"]:
        out.append("Nothing runs.")
    for u in data["usage"]:
        out.append(
            f"- {u['team']} on {u['pool']}: {u['gpu_milli'] / 1000:g} GPUs in {u['attempts']} attempt(s)"
        )
    out += ["", "## Who needs what (pending)", ""]
    if not data["pending"]:
        out.append("Nothing waits.")
    for p in data["pending"]:
        out.append(
            f"- {p['team']}: {p['requests']} {p['class']} request(s) for {p['profile']} on "
            f"{p['pool']}, {p['gpu_milli'] / 1000:g} GPUs, oldest waiting {p['oldest_wait_s'] // 60} min"
        )
    return "\n".join(out) + "\n"
