"""Scarce nodes: the few nodes of a pool able to host a shape that fits almost nowhere.

An 8-GPU request with 120 cores and 720 GiB fits 4 of the replay's 152 nodes. When
small work fills those four (inference above all, which is never preempted), the large
request waits for hours although the rest of the pool could have taken that work. The
cycle (`cycle._Tick._find`) therefore places a request that fits elsewhere on a scarce
node only when no other node of its pools takes it: a tie-break, never a refusal —
except for work the rare shape could not take back by preemption (a `never` class, or a
`when-borrowing` one), which waits for another node up to its class's maximum queue
time.

A shape is rare when at most `SCARCE_PCT` % of its pool's nodes (and at least one) can
ever host one pod of it (`fit.can_ever_host`). The shapes considered are the pool's
learned request shapes (`Snapshot.workloads`, every weight above zero: a rare shape is
exactly one the FGD target drops) and the shapes pending now.

A whole-node shape (it takes every device of any node that can host it) is not rare
when many nodes can host it, yet it needs one of them empty, which sharing never leaves
it: small work that is never preempted lands on every host in turn, and the shape waits
for hours (88-core, 8-GPU requests on 73 of the replay's 152 nodes waited up to 16,361 s).
So the first `SCARCE_PCT` % of the pool's nodes (rounded down; by name) among its hosts
are **kept** (`kept_nodes`) and count as scarce — to that shape as well: they hold work
that is always preemptible, or that reached its starvation bound, and a request
of the shape past its starvation bound preempts there (tier 4) instead of waiting for
never-preempted work to end.

A whole-node shape that is only learned (none of it pending) keeps fewer:
`Policy.learned_kept_nodes` (the shipped profile: one). Keeping 5 % of the pool for every
whole-node shape seen in a week left those nodes short of inference most of the time and
cost up to 0.7 points of useful utilization at load 90; one node lets the next request of
the shape start at once or preempt there, and once one is pending its shape keeps the
full 5 % (docs/scheduling.md, "Issue 33: one kept node for a learned shape").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduling import fit
from scheduling.types import Node, ProfileKind, Shape

#: a shape is rare when at most this share of its pool's nodes can host it, percent
SCARCE_PCT = 5


def _hardware(node: Node) -> tuple[object, ...]:
    """Everything `fit.can_ever_host` reads of a node: nodes alike in it host alike."""
    devices = tuple((d.model, d.partitioning, d.memory_mib) for d in node.devices)
    return node.taints, node.cpu_milli, node.memory_mib, devices


@dataclass(slots=True)
class _Memo:
    nodes: tuple[Node, ...]
    #: per pool, the node names by hardware, and one node of each hardware to ask
    kinds: dict[str, dict[tuple[object, ...], tuple[Node, list[str]]]] = field(default_factory=dict)
    hosts: dict[tuple[str, Shape], frozenset[str]] = field(default_factory=dict)
    #: (pool, shape) -> `_whole_node`: asked for every pending shape every tick
    whole: dict[tuple[str, Shape], bool] = field(default_factory=dict)
    #: nodes per pool
    size: dict[str, int] = field(default_factory=dict)
    #: (pool, shape, pct) -> the nodes `scarce_nodes` / `kept_nodes` answer for it
    scarce: dict[tuple[str, Shape, int], frozenset[str]] = field(default_factory=dict)
    kept: dict[tuple[str, Shape, int, int], tuple[str, ...]] = field(default_factory=dict)


#: the last nodes seen: a caller that passes the same node objects tick after tick (the
#: replay) does not recompute the hosts
_MEMO: _Memo | None = None


def _memo(nodes: Sequence[Node]) -> _Memo:
    global _MEMO
    if _MEMO is not None:
        seen = _MEMO.nodes
        if seen is nodes:  # a tuple: the same nodes (one check per call, not per node)
            return _MEMO
        if len(seen) == len(nodes) and all(a is b for a, b in zip(seen, nodes, strict=True)):
            if isinstance(nodes, tuple):
                _MEMO.nodes = nodes  # the same nodes in a new tuple: by identity next time
            return _MEMO
    memo = _Memo(tuple(nodes))
    # A portal tick brings new node objects each time, and a thousand nodes come in a
    # few hardware kinds: each (pool, shape) asks one node of each kind.
    for n in memo.nodes:
        memo.size[n.pool] = memo.size.get(n.pool, 0) + 1
        kinds = memo.kinds.setdefault(n.pool, {})
        key = _hardware(n)
        if key in kinds:
            kinds[key][1].append(n.name)
        else:
            kinds[key] = (n, [n.name])
    _MEMO = memo
    return memo


def hosts(nodes: Sequence[Node], pool: str, shape: Shape) -> frozenset[str]:
    """Return the nodes of the pool that could hold one pod of the shape when empty."""
    memo = _memo(nodes)
    key = (pool, shape)
    found = memo.hosts.get(key)
    if found is None:
        found = frozenset(
            name
            for first, names in memo.kinds.get(pool, {}).values()
            if fit.can_ever_host(first, shape)
            for name in names
        )
        memo.hosts[key] = found
    return found


def scarce_nodes(
    nodes: Sequence[Node], shapes: Iterable[tuple[str, Shape]], pct: int = SCARCE_PCT
) -> frozenset[str]:
    """Return the nodes that are the only hosts of some rare (pool, shape)."""
    memo = _memo(nodes)
    size = memo.size
    out: set[str] = set()
    for pool, shape in dict.fromkeys(shapes):
        if pool not in size:
            continue
        key = (pool, shape, pct)
        rare = memo.scarce.get(key)
        if rare is None:
            found = hosts(nodes, pool, shape)
            rare = found if found and len(found) * 100 <= size[pool] * pct else frozenset()
            memo.scarce[key] = rare
        out |= rare
    return frozenset(out)


def _whole_node(nodes: Sequence[Node], pool: str, shape: Shape) -> bool:
    """Whether one pod of the shape takes every device of any node of the pool that could
    host it (and some node could)."""
    if shape.kind is not ProfileKind.WHOLE or shape.count <= 0:
        return False
    memo = _memo(nodes)
    key = (pool, shape)
    whole = memo.whole.get(key)
    if whole is None:
        kinds = [
            first
            for first, _ in memo.kinds.get(pool, {}).values()
            if fit.can_ever_host(first, shape)
        ]
        whole = memo.whole[key] = bool(kinds) and all(
            shape.count >= len(first.devices) for first in kinds
        )
    return whole


def kept_nodes(
    nodes: Sequence[Node],
    shapes: Iterable[tuple[str, Shape]],
    pct: int = SCARCE_PCT,
    most: int = 0,
) -> frozenset[str]:
    """Return the nodes kept for whole-node shapes that more than `pct` % of their pool's
    nodes can host: per shape, the first `pct` % of the pool's nodes (rounded down; at most
    `most` when it is not 0) among its hosts, by name, so the choice holds from tick to
    tick."""
    memo = _memo(nodes)
    size = memo.size
    out: set[str] = set()
    for pool, shape in dict.fromkeys(shapes):
        # a pool under 100 / `pct` nodes keeps none
        k = size.get(pool, 0) * pct // 100
        if most:
            k = min(k, most)
        if not k or shape.kind is not ProfileKind.WHOLE:
            continue
        key = (pool, shape, pct, most)
        kept = memo.kept.get(key)
        if kept is None:
            found = hosts(nodes, pool, shape)  # asked already by `scarce_nodes`: remembered
            kept = (
                tuple(sorted(found)[:k])
                if len(found) > k and _whole_node(nodes, pool, shape)
                else ()
            )
            memo.kept[key] = kept
        out.update(kept)
    return frozenset(out)
