"""Autoscaled pools: pending demand asks for nodes; idle added nodes are given back.

A pool marked `autoscaled` adds nodes of one shape (`node_gpus`, `node_cpu_milli`,
`node_memory_mib`, the pool's GPU) between `min_nodes` and `max_nodes`:

1. the tick's snapshot offers the nodes it may still add as `Snapshot.growth`, so a
   request only such a node could hold waits (`awaiting-nodes`) instead of being
   rejected;
2. `autoscale_step` (after each tick) turns the demand that no node has free
   (`no-capacity`, `awaiting-nodes`) into a `NodeProvision`: a gang asks for its nodes
   atomically, the rest pack onto as few nodes as their GPUs need, one ask per team
   (its ProvisioningRequests live in the team's namespace, where the pods that consume
   them run). While one names a request, its wait counts as `provisioning`
   (portal/tick/waits.py);
3. the backend provides: the Kubernetes backend creates a ProvisioningRequest
   (portal/k8s/provisioning.py) and the cluster autoscaler adds the nodes, which the
   inventory then finds; the simulated backend adds them itself once
   `SIMULATED_PROVISIONING_SECONDS` have passed;
4. nodes it added that hold nothing for `idle_release_s` are released (simulated; on
   Kubernetes the cluster autoscaler removes unneeded nodes itself).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from portal.models import Allocation, GpuRequest, Node, NodeProvision, Pool
from portal.services.nodes import inventory_sync
from scheduling import mig
from scheduling import types as st

#: a node the simulated backend added carries this label with its provision's name
ADDED_BY = "quartermaster.io/provision"
RELEASED = "quartermaster.io/released"
_DEMAND_CODES = ("no-capacity", "awaiting-nodes")


def _mig_instances(pool: Pool) -> tuple[st.MigInstance, ...]:
    if pool.partitioning != Pool.Partitioning.MIG:
        return ()
    family = mig.family_for(pool.gpu_model, pool.gpu_memory_mib)
    placed = mig.layout(family, list(pool.mig_layout)) if family is not None else None
    return tuple(placed or ())


def node_template(pool: Pool, name: str) -> st.Node:
    """A node the pool would add, as the core sees nodes."""
    migs = _mig_instances(pool)
    return st.Node(
        name=name,
        pool=pool.name,
        cpu_milli=pool.node_cpu_milli,
        memory_mib=pool.node_memory_mib,
        devices=tuple(
            st.Device(
                index=i,
                model=pool.gpu_model,
                memory_mib=pool.gpu_memory_mib,
                partitioning=st.Partitioning(pool.partitioning),
                replicas=pool.time_slicing_replicas,
                mig_instances=migs,
            )
            for i in range(pool.node_gpus)
        ),
        labels=tuple(
            sorted({"nvidia.com/gpu.product": pool.gpu_model, **pool.node_selector}.items())
        ),
        taints=tuple(
            st.Taint(t["key"], t.get("value", ""), t.get("effect", "NoSchedule"))
            for t in pool.taints
        ),
        interconnect=pool.interconnect,
    )


def _live(nodes: Iterable[st.Node]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for n in nodes:
        if dict(n.labels).get(RELEASED) != "true":
            counts[n.pool] += 1
    return counts


def growth(pools: Iterable[Pool], nodes: Iterable[st.Node]) -> tuple[st.Node, ...]:
    """The nodes autoscaled pools may still add (`Snapshot.growth`)."""
    scaled = [p for p in pools if p.autoscaled]
    if not scaled:
        return ()
    live = _live(nodes)
    out: list[st.Node] = []
    for p in scaled:
        out.extend(
            node_template(p, f"{p.name}-growth-{i}")
            for i in range(max(0, p.max_nodes - live[p.name]))
        )
    return tuple(out)


def provisioning_for(pools: Iterable[Pool]) -> set[str]:
    """Pending request ids (as the snapshot spells them) nodes are being added for."""
    if not any(p.autoscaled for p in pools):
        return set()
    out: set[str] = set()
    for ids in NodeProvision.objects.filter(state=NodeProvision.State.REQUESTED).values_list(
        "request_ids", flat=True
    ):
        out.update(str(i) for i in ids)
    return out


@dataclass(frozen=True)
class Ask:
    """Nodes to ask one pool for, and the requests they are for."""

    pool: Pool
    nodes: int
    atomic: bool
    request_ids: tuple[int, ...]
    #: the namespace of the team the requests are of ("": none named)
    namespace: str = ""


def _fits_node(pool: Pool, count: int, cpu: int, memory: int) -> bool:
    return count <= pool.node_gpus and cpu <= pool.node_cpu_milli and memory <= pool.node_memory_mib


def plan(pool: Pool, live_nodes: int, in_flight: int, demand: list[dict[str, Any]]) -> list[Ask]:
    """What to ask `pool` for: gangs atomically, one ask each; other requests together per
    team (teams in the order of their first request in the queue), on as few nodes as
    their devices need; never past `max_nodes`, at least `min_nodes`.

    A ProvisioningRequest's booking is consumed only by pods of its own namespace, so one
    ask never covers requests of two teams. `demand` rows carry their team's `namespace`.
    """
    room = max(0, pool.max_nodes - live_nodes - in_flight)
    asks: list[Ask] = []
    singles: dict[str, list[dict[str, Any]]] = {}
    for r in demand:
        if not _fits_node(pool, r["count"], r["cpu_milli"], r["memory_mib"]):
            continue
        if r["pods"] > 1:
            if r["pods"] <= room:
                asks.append(Ask(pool, r["pods"], True, (r["pk"],), r["namespace"]))
                room -= r["pods"]
        else:
            singles.setdefault(r["namespace"], []).append(r)
    for namespace, rows in singles.items():
        if not room:
            break
        devices = sum(r["count"] for r in rows)
        n = min(room, math.ceil(devices / max(1, pool.node_gpus)))
        # Those that the nodes asked for will hold, in queue order.
        taken, ids = 0, []
        for r in rows:
            if taken + r["count"] > n * pool.node_gpus:
                break
            taken += r["count"]
            ids.append(r["pk"])
        asks.append(Ask(pool, n, False, tuple(ids), namespace))
        room -= n
    short = pool.min_nodes - live_nodes - in_flight - sum(a.nodes for a in asks)
    if short > 0:
        asks.append(Ask(pool, min(short, room), False, ()))
    return [a for a in asks if a.nodes > 0]


def _demand(pool: Pool, named: set[int], now: datetime) -> list[dict[str, Any]]:
    where = Q(pool=pool)
    if pool.lifecycle == Pool.Lifecycle.PRODUCTION:
        where |= Q(pool__isnull=True)
    return [
        dict(r)
        for r in GpuRequest.objects.filter(
            where,
            state=GpuRequest.State.PENDING,
            status_code__in=_DEMAND_CODES,
        )
        .filter(Q(requeue_at__isnull=True) | Q(requeue_at__lte=now))
        .order_by(
            "queue_position",
            "created_at",
        )
        .values(
            "pk",
            "count",
            "pods",
            "cpu_milli",
            "memory_mib",
            "profile_kind",
            "mig_profile",
            namespace=F("team__namespace"),
        )
        if r["pk"] not in named and pool.offers(r["profile_kind"], r["mig_profile"])
    ]


def autoscale_step(now: datetime | None = None, backend: Any = None) -> dict[str, int]:
    """Ask for nodes where demand outgrows an autoscaled pool, finish what was asked,
    release idle added nodes. Returns counts of what it did."""
    from portal.backends import get_backend

    now = now or timezone.now()
    pools = list(Pool.objects.filter(autoscaled=True))
    counts = {"asked": 0, "provisioned": 0, "released": 0}
    if not pools:
        return counts
    backend = backend or get_backend()
    for pool in pools:
        with transaction.atomic():
            counts["provisioned"] += _finish(pool, backend, now)
            open_ = list(pool.provisions.filter(state=NodeProvision.State.REQUESTED))
            named = {int(i) for p in open_ for i in p.request_ids}
            live = sum(1 for n in pool.nodes.all() if n.labels.get(RELEASED) != "true")
            asks = plan(pool, live, sum(p.nodes for p in open_), _demand(pool, named, now))
            for ask in asks:
                _ask(ask, backend, now)
                counts["asked"] += 1
            counts["released"] += _release_idle(pool, backend, now)
    return counts


def _ask(ask: Ask, backend: Any, now: datetime) -> NodeProvision:
    provision = NodeProvision.objects.create(
        pool=ask.pool,
        name=f"qm-{ask.pool.name[:40]}-{uuid4().hex[:10]}",
        nodes=ask.nodes,
        atomic=ask.atomic,
        request_ids=list(ask.request_ids),
        ready_at=now + timedelta(seconds=settings.SIMULATED_PROVISIONING_SECONDS),
        namespace=ask.namespace,
    )
    create = getattr(backend, "provisioning_request_create", None)
    if create is not None:
        transaction.on_commit(
            lambda: create(provision.name, ask.pool, ask.nodes, ask.atomic, ask.namespace)
        )
    return provision


def _finish(pool: Pool, backend: Any, now: datetime) -> int:
    """Mark what the backend provided; the simulated backend's nodes are added here."""
    done = 0
    status = getattr(backend, "provisioning_request_status", None)
    for p in pool.provisions.filter(state=NodeProvision.State.REQUESTED):
        if status is not None:
            state, message = status(p.name, pool, p.nodes, p.atomic, p.namespace)
            if state == NodeProvision.State.REQUESTED:
                continue
        elif p.ready_at is None or p.ready_at > now:
            continue
        else:
            _add_simulated_nodes(pool, p)
            state, message = (
                NodeProvision.State.PROVISIONED,
                f"{p.nodes} node{'' if p.nodes == 1 else 's'} added",
            )
        NodeProvision.objects.filter(pk=p.pk).update(
            state=state, message=message[:300], done_at=now
        )
        done += 1
    return done


def _add_simulated_nodes(pool: Pool, p: NodeProvision) -> None:
    from portal.backends.base import InventoryDevice, InventoryMig, InventoryNode

    template = node_template(pool, "")
    nodes = [
        InventoryNode(
            name=f"{p.name}-{i + 1}",
            pool=pool.name,
            cpu_milli=template.cpu_milli,
            memory_mib=template.memory_mib,
            devices=tuple(
                InventoryDevice(
                    index=d.index,
                    model=d.model,
                    memory_mib=d.memory_mib,
                    uuid=f"GPU-sim-{p.name}-{i + 1}-{d.index}",
                    partitioning=str(d.partitioning),
                    replicas=d.replicas,
                    mig_instances=tuple(
                        InventoryMig(m.profile, m.start, m.size) for m in d.mig_instances
                    ),
                )
                for d in template.devices
            ),
            labels={**dict(template.labels), ADDED_BY: p.name},
            taints=tuple((t.key, t.value, t.effect) for t in template.taints),
            interconnect=pool.interconnect,
        )
        for i in range(p.nodes)
    ]
    inventory_sync(nodes=nodes)


def _release_idle(pool: Pool, backend: Any, now: datetime) -> int:
    """Release added nodes idle for `idle_release_s`, down to `min_nodes` (simulated)."""
    if getattr(backend, "provisioning_request_status", None) is not None:
        return 0  # the cluster autoscaler removes unneeded nodes itself
    added = [
        n for n in pool.nodes.all() if n.labels.get(ADDED_BY) and n.labels.get(RELEASED) != "true"
    ]
    live = sum(1 for n in pool.nodes.all() if n.labels.get(RELEASED) != "true")
    if not added:
        return 0
    busy = set(
        Allocation.objects.filter(active=True, device__node__in=added).values_list(
            "device__node_id", flat=True
        )
    )
    last_used = dict(
        Allocation.objects.filter(device__node__in=added)
        .values_list("device__node_id")
        .annotate(t=Max("attempt__ended_at"))
    )
    made = {p.name: p.done_at for p in pool.provisions.all()}
    released = 0
    for n in added:
        if live - released <= pool.min_nodes or n.pk in busy:
            continue
        idle_from = last_used.get(n.pk) or made.get(n.labels[ADDED_BY]) or now
        if now - idle_from < timedelta(seconds=pool.idle_release_s):
            continue
        if Allocation.objects.filter(device__node=n).exists():
            # Its allocations are accounting history: keep the row, out of service.
            Node.objects.filter(pk=n.pk).update(
                ready=False, cordoned=True, labels={**n.labels, RELEASED: "true"}
            )
        else:
            n.delete()
        released += 1
    return released
