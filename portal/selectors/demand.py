"""Pending demand per pool and device profile, for capacity planning."""

from __future__ import annotations

from typing import Any

from django.db.models import Sum

from portal import access
from portal.access import AnyUser
from portal.models import GpuRequest, NodeProvision
from portal.tick import waits


def pending_demand(user: AnyUser) -> list[dict[str, Any]]:
    """Pending demand of the requests `user` may see, per pool and device profile, with
    the nodes each autoscaled pool is waiting for."""
    pending = access.requests_visible(user).filter(state=GpuRequest.State.PENDING)
    rows = waits.pending_demand(pending)
    waiting = dict(
        NodeProvision.objects.filter(state=NodeProvision.State.REQUESTED)
        .values_list("pool__name")
        .annotate(n=Sum("nodes"))
        .order_by()
    )
    for r in rows:
        r["provisioning_nodes"] = waiting.get(r["pool"], 0)
    return rows
