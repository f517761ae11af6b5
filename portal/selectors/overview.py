"""The admins' overview: where the platform needs a person now, on one page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone

from portal.models import GpuRequest, Node, NodeProvision, Rollout
from portal.models.pools import heartbeat_stale_before
from portal.selectors.capacity import pool_summaries

#: how many of the longest waits the overview lists
OLDEST = 8


@dataclass(frozen=True)
class Wait:
    request: GpuRequest
    waited_s: int
    #: the class's maximum queue time (0: it promises none)
    promise_s: int

    @property
    def overdue(self) -> bool:
        return bool(self.promise_s) and self.waited_s > self.promise_s


@dataclass(frozen=True)
class Attention:
    node: Node
    reasons: list[str]


def admin_overview(now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    waiting: dict[int | None, int] = dict(
        GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
        .values("pool_id")
        .annotate(n=Count("id"))
        .values_list("pool_id", "n")
    )
    pools = pool_summaries(now)
    for p in pools:
        p["waiting"] = waiting.get(p["pool"].pk, 0)
    oldest = [
        Wait(r, int((now - r.created_at).total_seconds()), r.workload_class.max_queue_s)
        for r in GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
        .select_related("team", "workload_class", "pool")
        .order_by("created_at", "id")[:OLDEST]
    ]
    return {
        "pools": pools,
        "waiting_any_pool": waiting.get(None, 0),
        "oldest": oldest,
        "overdue": sum(1 for w in oldest if w.overdue),
        "attention": nodes_needing_attention(now),
        "rollouts": list(
            Rollout.objects.filter(state=Rollout.State.RUNNING)
            .select_related("pool")
            .order_by("created_at")
        ),
        "provisioning": list(
            NodeProvision.objects.filter(state=NodeProvision.State.REQUESTED)
            .select_related("pool")
            .order_by("created_at")
        ),
    }


def nodes_needing_attention(now: datetime) -> list[Attention]:
    """Nodes not ready, cordoned, draining or in maintenance, silent, or with sick devices."""
    stale = heartbeat_stale_before(now)
    nodes = (
        Node.objects.annotate(
            quarantined=Count("devices", filter=Q(devices__quarantined=True)),
            unhealthy=Count(
                "devices",
                filter=Q(devices__quarantined=False)
                & (
                    Q(devices__healthy=False, devices__foreign=False)
                    | Q(devices__agent_healthy=False)
                ),
            ),
        )
        .filter(
            Q(ready=False)
            | Q(cordoned=True)
            | Q(draining=True)
            | Q(last_heartbeat__lt=stale)
            | Q(quarantined__gt=0)
            | Q(unhealthy__gt=0)
        )
        .select_related("pool")
        .order_by("pool__name", "name")
    )
    out = []
    for n in nodes:
        reasons = []
        if not n.ready:
            reasons.append("not ready")
        if n.draining:
            reasons.append("draining")
        elif n.cordoned:
            reasons.append(
                "cordoned" + (f": {n.maintenance_reason}" if n.maintenance_reason else "")
            )
        if n.last_heartbeat is not None and n.last_heartbeat < stale:
            reasons.append("node agent silent")
        quarantined, unhealthy = getattr(n, "quarantined", 0), getattr(n, "unhealthy", 0)
        if quarantined:
            reasons.append(f"{quarantined} GPU{'s' if quarantined > 1 else ''} quarantined")
        if unhealthy:
            reasons.append(f"{unhealthy} GPU{'s' if unhealthy > 1 else ''} unhealthy")
        out.append(Attention(n, reasons))
    return out
