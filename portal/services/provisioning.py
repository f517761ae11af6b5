"""Which ProvisioningRequest an attempt's pods consume (autoscaled pools, docs/capacity.md).

The cluster autoscaler books the capacity it added for a ProvisioningRequest for the pods
that name it in their `consume-provisioning-request` annotation, and does not scale up
again for them. The launch spec carries the name (`LaunchSpec.provisioning_request`),
read here from the stored `NodeProvision` rows; the Kubernetes backend annotates the pods
(portal/k8s/jobs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from portal.k8s.provisioning import part_names
from portal.models import GpuRequest, NodeProvision


def consumed(attempts: Sequence[Any]) -> dict[int, str]:
    """The ProvisioningRequest each attempt's pods consume, by attempt id (none: absent).

    An attempt consumes the request of the newest requested or provisioned `NodeProvision`
    of its pool that names its request and lives in the attempt's namespace (the
    autoscaler looks the name up there); an ask split into one request per node
    (portal/k8s/provisioning.py) gives each of its requests the part of one node, the
    requests packed first-fit onto the nodes in the ask's (queue) order. Reads the provisions of the attempts'
    autoscaled pools once (and, for split asks, the sizes of the requests they name),
    whatever the number of attempts: the bulk launch path calls it for a tick's admissions.
    `attempts` carry `pool`, `request` and `namespace` (read, not queried here).
    """
    scaled = [a for a in attempts if a.pool.autoscaled]
    if not scaled:
        return {}
    pools = {a.pool_id: a.pool for a in scaled}
    wanted = {(a.pool_id, a.request_id) for a in scaled}
    # A provision names requests that existed when it was made.
    rows = list(
        NodeProvision.objects.filter(
            pool_id__in=list(pools),
            state__in=[NodeProvision.State.REQUESTED, NodeProvision.State.PROVISIONED],
            created_at__gte=min(a.request.created_at for a in scaled),
        )
        .order_by("created_at", "id")
        .values_list("pool_id", "name", "nodes", "atomic", "request_ids", "namespace")
    )
    mine = [
        (pool_id, name, nodes, atomic, [int(i) for i in ids])
        for pool_id, name, nodes, atomic, ids, _ in rows
        if any((pool_id, int(i)) in wanted for i in ids)
    ]
    # Rows made before asks had a namespace ("") kept theirs in the portal's namespace.
    where = {name: namespace for _, name, _, _, _, namespace in rows}
    split = {i for _, _, nodes, atomic, ids in mine if nodes > 1 and not atomic for i in ids}
    counts = {a.request_id: a.request.count for a in scaled}
    if split - set(counts):
        counts |= dict(
            GpuRequest.objects.filter(pk__in=split - set(counts)).values_list("pk", "count")
        )
    by_request: dict[tuple[int, int], tuple[str, str]] = {}
    for pool_id, name, nodes, atomic, ids in mine:  # oldest first: the newest wins
        parts = [part for part, _ in part_names(name, nodes, atomic)]
        if len(parts) == 1:
            by_request.update({(pool_id, i): (parts[0], where[name]) for i in ids})
            continue
        free = [pools[pool_id].node_gpus] * len(parts)
        for i in ids:
            need = counts.get(i, 1)
            # First fit; an ask packed by its devices' sum may leave none that fits.
            at = next((k for k, f in enumerate(free) if f >= need), None)
            if at is None:
                at = max(range(len(free)), key=lambda k: free[k])
            free[at] -= need
            by_request[(pool_id, i)] = (parts[at], where[name])
    out = {}
    for a in scaled:
        part, namespace = by_request.get((a.pool_id, a.request_id), ("", ""))
        if part and namespace in ("", a.namespace):
            out[a.pk] = part
    return out
