"""One scheduling pass: plain FIFO first fit, one decision per pending request."""

from __future__ import annotations

from scheduling.packer import ClusterState
from scheduling.types import (
    Decision,
    DecisionKind,
    Lifecycle,
    Node,
    Policy,
    Snapshot,
)


def schedule(snapshot: Snapshot, now_ms: int | None = None, policy: Policy | None = None) -> list[Decision]:
    """Return exactly one decision per pending request, in queue order.

    1. order pending requests by creation time, then id;
    2. place each on the first node that fits in its pool (or any production pool);
    3. explain every outcome.
    """
    policy = policy or Policy()
    pools = {p.name: p for p in snapshot.pools}
    state = ClusterState(snapshot.nodes)
    for run in snapshot.running:
        state.take(run.placement)

    decisions: list[Decision] = []
    queue = sorted(snapshot.pending, key=lambda r: (r.created_at_ms, r.id))
    for position, req in enumerate(queue, start=1):

        def accept(node: Node, pool_name: str = req.pool) -> bool:
            pool = pools.get(node.pool)
            if pool is None or pool.lifecycle is Lifecycle.MAINTENANCE:
                return False
            if pool_name:
                return node.pool == pool_name
            return pool.lifecycle is Lifecycle.PRODUCTION

        placement = state.find(req.shape, accept)
        if placement is None:
            where = f"pool {req.pool}" if req.pool else "any production pool"
            decisions.append(
                Decision(
                    DecisionKind.WAIT,
                    req.id,
                    "no-capacity",
                    f"waiting: no node in {where} has {_describe(req.shape)} free right now",
                    position=position,
                )
            )
            continue
        state.take(placement)
        pool_name = next(n.pool for n in state.nodes if n.name == placement.pods[0].node)
        decisions.append(
            Decision(
                DecisionKind.ADMIT,
                req.id,
                "fits",
                f"admitted on {', '.join(placement.nodes)} in pool {pool_name}",
                placement=placement,
                pool=pool_name,
            )
        )
    return decisions


def _describe(shape) -> str:  # type: ignore[no-untyped-def]
    if shape.kind == "mig":
        what = f"{shape.count}× MIG {shape.mig_profile}"
    elif shape.kind == "shared":
        what = f"{shape.count}× {shape.milli / 1000:g} GPU share"
    else:
        what = f"{shape.count} whole GPU" + ("s" if shape.count != 1 else "")
    return what + (f" on each of {shape.pods} nodes" if shape.pods > 1 else "")
