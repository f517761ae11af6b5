"""The autoscaling page: demand waiting per pool, the nodes asked for, the nodes added and released."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, Sum

from portal.access import AnyUser
from portal.models import Node, NodeProvision, Pool
from portal.selectors.demand import pending_demand
from portal.services.autoscale import ADDED_BY, RELEASED

#: how many provisioning requests and added nodes the page lists, newest first
RECENT = 50


def autoscaling(user: AnyUser) -> dict[str, Any]:
    """Everything the page shows, in a fixed number of queries whatever the size of the fleet."""
    requested = NodeProvision.State.REQUESTED
    # Two grouped reads rather than one query joining both: the join would multiply the sums.
    # (an exclude() would drop the nodes without the label too: NOT NULL is not true)
    released = Q(**{f"labels__{RELEASED}": "true"})
    live = {
        pool_id: n - gone
        for pool_id, n, gone in Node.objects.values("pool_id")
        .annotate(n=Count("id"), gone=Count("id", filter=released))
        .values_list("pool_id", "n", "gone")
    }
    coming = dict(
        NodeProvision.objects.filter(state=requested)
        .values("pool_id")
        .annotate(n=Sum("nodes"))
        .values_list("pool_id", "n")
    )
    pools = [
        {"pool": p, "nodes": live.get(p.pk, 0), "coming": coming.get(p.pk, 0)}
        for p in Pool.objects.filter(autoscaled=True, retired_at__isnull=True).order_by("name")
    ]
    added = list(
        Node.objects.filter(labels__has_key=ADDED_BY)
        .select_related("pool")
        .order_by("-id")[:RECENT]
    )
    return {
        "pools": pools,
        "demand": pending_demand(user),
        "provisions": list(NodeProvision.objects.select_related("pool")[:RECENT]),
        "in_flight": sum(coming.values()),
        "nodes": [
            {
                "node": n,
                "provision": n.labels.get(ADDED_BY, ""),
                "released": n.labels.get(RELEASED) == "true",
            }
            for n in added
        ],
    }
