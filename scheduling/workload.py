"""The target workload of a pool: a decayed histogram of the request shapes it has seen.

FGD scores a placement by how much it fragments the GPUs for the requests the cluster
*usually* sees (`scheduling.packer`, "the target workload"). One tick's requests are a
poor sample of that (often a single request), so the workload is learnt from history:
every submitted request adds weight 1 to its shape (`shape_key`), and all weights halve
every `half_life_s`. A pool with no history starts from a prior built from what its
nodes offer (`prior`).

`ShapeHistory` is plain data: `to_dict`/`from_dict` give a JSON-able dict that the
portal stores per pool and the packing benchmark keeps in memory; the scheduling core
receives the weights in the snapshot (`scheduling.types.PoolWorkload`) and turns them
into the packer's integer target (`target_workload`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduling import fit
from scheduling.packer import node_class
from scheduling.types import (
    WHOLE_GPU_MILLI,
    Device,
    Node,
    Partitioning,
    PoolWorkload,
    ProfileKind,
    Shape,
    Taint,
)

#: share of the weight the target workload covers, in percent (FGD uses 95)
TARGET_COVERAGE_PCT = 95
#: the integer weights of a target sum to about this much (the packer's weights are integers)
TARGET_SCALE = 10_000
#: at most this many shapes are kept; the lightest go first (keeps a stored row small)
MAX_SHAPES = 128
#: weights below this are dropped when decaying (a shape not seen for ~17 half-lives)
MIN_WEIGHT = 1e-5
#: whole-GPU counts the prior offers (those a node has devices for)
PRIOR_WHOLE_COUNTS = (1, 2, 4, 8)
#: compute shares of a time-sliced device the prior offers when no replica count fixes one
PRIOR_SHARES = (500, 250)
#: the prior weighs as much as this many requests; real requests soon outweigh it
PRIOR_WEIGHT = 10.0


def shape_key(shape: Shape) -> Shape:
    """The histogram's key for a request: one pod of it, host memory left out.

    Gangs count per pod (each pod lands on a node like a single request); host memory is
    left out as in FGD (it keys shapes by CPU, devices, share and models), which keeps
    the histogram small. The placement policy is the request's, not part of its shape.
    """
    return dataclasses.replace(shape, pods=1, memory_mib=0, placement="")


@dataclass
class ShapeHistory:
    """Shape -> weight, exponentially decayed with `half_life_s`, as of `as_of_ms`."""

    half_life_s: int
    as_of_ms: int = 0
    counts: dict[Shape, float] = field(default_factory=dict)

    def _factor(self, dt_ms: int) -> float:
        if self.half_life_s <= 0:
            return 1.0
        return math.pow(2.0, -dt_ms / (self.half_life_s * 1000))

    def observe(self, shape: Shape, at_ms: int, weight: float = 1.0) -> None:
        """Count one request of `shape` submitted at `at_ms`.

        A late observation (before `as_of_ms`, e.g. two submits racing) is added already
        decayed to `as_of_ms`, so the order of observations does not matter.
        """
        key = shape_key(shape)
        if at_ms > self.as_of_ms:
            self._decay_to(at_ms)
        else:
            weight *= self._factor(self.as_of_ms - at_ms)
        self.counts[key] = self.counts.get(key, 0.0) + weight
        if len(self.counts) > MAX_SHAPES:
            lightest = min(self.counts, key=lambda s: (self.counts[s], shape_repr(s)))
            del self.counts[lightest]

    def _decay_to(self, at_ms: int) -> None:
        f = self._factor(at_ms - self.as_of_ms)
        self.as_of_ms = at_ms
        if f == 1.0:
            return
        self.counts = {s: w * f for s, w in self.counts.items() if w * f >= MIN_WEIGHT}

    def weights(self, at_ms: int) -> dict[Shape, float]:
        """The weights decayed to `at_ms` (never before `as_of_ms`); nothing is changed."""
        f = self._factor(max(0, at_ms - self.as_of_ms))
        return {s: w * f for s, w in self.counts.items()}

    def total(self, at_ms: int) -> float:
        return sum(self.weights(at_ms).values())

    def to_workload(self, pool: str) -> PoolWorkload:
        """The snapshot's view of this history (weights as of `as_of_ms`; only ratios matter)."""
        items = sorted(self.counts.items(), key=lambda kv: shape_repr(kv[0]))
        return PoolWorkload(pool, tuple(items))

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; `from_dict` reads it back."""
        return {
            "half_life_s": self.half_life_s,
            "as_of_ms": self.as_of_ms,
            "shapes": [
                [shape_to_dict(s), round(w, 9)]
                for s, w in sorted(self.counts.items(), key=lambda kv: repr(kv[0]))
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], half_life_s: int | None = None) -> ShapeHistory:
        """Read `to_dict`'s output; `half_life_s` overrides the stored one (a changed setting)."""
        h = cls(
            half_life_s=int(data.get("half_life_s", 0) if half_life_s is None else half_life_s),
            as_of_ms=int(data.get("as_of_ms", 0)),
        )
        for raw, w in data.get("shapes", ()):
            h.counts[shape_from_dict(raw)] = float(w)
        return h

    @classmethod
    def from_prior(cls, nodes: Iterable[Node], half_life_s: int, at_ms: int) -> ShapeHistory:
        """A cold history: the prior of these nodes, as of `at_ms`."""
        return cls(half_life_s=half_life_s, as_of_ms=at_ms, counts=prior(nodes))


def shape_to_dict(s: Shape) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": s.kind.value, "count": s.count}
    if s.kind is ProfileKind.SHARED:
        out["milli"] = s.milli
        if s.gpu_memory_mib:
            out["gpu_memory_mib"] = s.gpu_memory_mib
    if s.mig_profile:
        out["mig_profile"] = s.mig_profile
    if s.cpu_milli:
        out["cpu_milli"] = s.cpu_milli
    if s.memory_mib:
        out["memory_mib"] = s.memory_mib
    if s.gpu_models:
        out["gpu_models"] = sorted(s.gpu_models)
    if s.tolerations:
        out["tolerations"] = [[t.key, t.value, t.effect] for t in s.tolerations]
    if s.pods != 1:
        out["pods"] = s.pods
    return out


def shape_from_dict(d: Mapping[str, Any]) -> Shape:
    kind = ProfileKind(d.get("kind", ProfileKind.WHOLE.value))
    return Shape(
        kind=kind,
        count=int(d.get("count", 1)),
        milli=int(d.get("milli", WHOLE_GPU_MILLI)),
        gpu_memory_mib=int(d.get("gpu_memory_mib", 0)),
        mig_profile=str(d.get("mig_profile", "")),
        cpu_milli=int(d.get("cpu_milli", 0)),
        memory_mib=int(d.get("memory_mib", 0)),
        gpu_models=frozenset(d.get("gpu_models", ())),
        tolerations=tuple(Taint(*t) for t in d.get("tolerations", ())),
        pods=int(d.get("pods", 1)),
    )


# ---------------------------------------------------------------------- prior


def _tolerations(node: Node) -> tuple[Taint, ...]:
    found = {t for t in node.taints if t.effect in ("NoSchedule", "NoExecute")}
    return tuple(sorted(found, key=lambda t: (t.key, t.value, t.effect)))


def offered_shapes(node: Node) -> set[Shape]:
    """What a node offers one request: whole GPUs (1/2/4/8 as it has them), the MIG
    profiles of its MIG devices, and shares of its time-sliced devices (one replica's
    share when the replica count is set, else `PRIOR_SHARES`). A node without healthy
    devices offers a CPU-only request."""
    return set(_offered(_tolerations(node), node.devices))


# Every tick asks again for every node, and nodes rarely change: remember the answer per
# (tolerations, devices).
@functools.lru_cache(maxsize=4096)
def _offered(tol: tuple[Taint, ...], devices: tuple[Device, ...]) -> frozenset[Shape]:
    out: set[Shape] = set()
    whole = [
        d
        for d in devices
        if d.healthy and d.partitioning in (Partitioning.EXCLUSIVE, Partitioning.TIME_SLICING)
    ]
    for n in PRIOR_WHOLE_COUNTS:
        if n <= len(whole):
            out.add(Shape(count=n, tolerations=tol))
    for d in devices:
        if not d.healthy:
            continue
        if d.partitioning is Partitioning.TIME_SLICING:
            shares = (WHOLE_GPU_MILLI // d.replicas,) if d.replicas > 1 else PRIOR_SHARES
            for milli in shares:
                out.add(Shape(kind=ProfileKind.SHARED, milli=milli, tolerations=tol))
        elif d.partitioning is Partitioning.MIG:
            family = fit.mig_family(d)
            names = (
                [i.profile for i in d.mig_instances]
                if d.mig_instances
                else ([p.name for p in family.profiles] if family else [])
            )
            for name in names:
                out.add(Shape(kind=ProfileKind.MIG, mig_profile=name, tolerations=tol))
    if not out:
        out.add(Shape(count=0, tolerations=tol))
    return frozenset(out)


def prior(nodes: Iterable[Node], total: float = PRIOR_WEIGHT) -> dict[Shape, float]:
    """The cold-start histogram of a pool: every shape its nodes offer, weighted by the
    number of nodes that offer it, scaled to weigh `total` requests in all."""
    # Nodes equal but for their name offer alike: each class is asked once (thousands of
    # nodes come in a few classes; a portal tick brings new node objects each time).
    first: dict[int, Node] = {}
    nodes_of: dict[int, int] = {}
    for node in nodes:
        token = node_class(node)
        if token in nodes_of:
            nodes_of[token] += 1
        else:
            first[token] = node
            nodes_of[token] = 1
    counts: dict[Shape, int] = {}
    for token, many in nodes_of.items():
        if not fit.schedulable(first[token]):
            continue
        for s in offered_shapes(first[token]):
            counts[s] = counts.get(s, 0) + many
    n = sum(counts.values())
    return {s: c * total / n for s, c in counts.items()} if n else {}


# ---------------------------------------------------------------------- target


def target_workload(
    weights: Mapping[Shape, float] | Iterable[tuple[Shape, float]],
    coverage_pct: int = TARGET_COVERAGE_PCT,
    scale: int = TARGET_SCALE,
) -> list[tuple[Shape, int]]:
    """The packer's target: the heaviest shapes covering `coverage_pct` % of the weight,
    with integer weights summing to about `scale` (FGD's popular-shape rule, weighted).

    Ties are ordered by the shape's repr so the result is deterministic.
    """
    items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
    total = sum(w for _, w in items if w > 0)
    if total <= 0:
        return []
    ranked = sorted((kv for kv in items if kv[1] > 0), key=lambda kv: (-kv[1], shape_repr(kv[0])))
    out: list[tuple[Shape, int]] = []
    covered = 0.0
    for shape, w in ranked:
        if covered * 100 >= total * coverage_pct:
            break
        covered += w
        iw = round(w * scale / total)
        if iw > 0:
            out.append((shape, iw))
    return out


def pool_targets(
    nodes: Iterable[Node], workloads: Iterable[PoolWorkload] | None
) -> dict[str, list[tuple[Shape, int]]]:
    """Per pool of `nodes`: the target from its workload in the snapshot, else its prior."""
    by_pool: dict[str, list[Node]] = {}
    for n in nodes:
        by_pool.setdefault(n.pool, []).append(n)
    given = {w.pool: w.weights for w in workloads or ()}
    out: dict[str, list[tuple[Shape, int]]] = {}
    for pool, members in by_pool.items():
        target = _given_target(pool, given[pool]) if pool in given else []
        out[pool] = target or _prior_target(pool, members)
    return out


#: per pool, the last weights a target was made from and the target: a replay asks again
#: with equal weights at every tick without an arrival
_GIVEN: dict[str, tuple[tuple[tuple[Shape, float], ...], list[tuple[Shape, int]]]] = {}


def _given_target(pool: str, weights: tuple[tuple[Shape, float], ...]) -> list[tuple[Shape, int]]:
    hit = _GIVEN.get(pool)
    if hit is not None and hit[0] == weights:
        return list(hit[1])
    target = target_workload(weights)
    if len(_GIVEN) >= 1024:
        _GIVEN.clear()
    _GIVEN[pool] = (weights, target)
    return list(target)


#: a shape's repr, the tie-break of the orders above (a few hundred shapes, ordered at every
#: tick)
_REPRS: dict[Shape, str] = {}


def shape_repr(shape: Shape) -> str:
    r = _REPRS.get(shape)
    if r is None:
        if len(_REPRS) >= 4096:
            _REPRS.clear()
        r = _REPRS[shape] = repr(shape)
    return r


#: per pool, the last nodes a prior was built from and its target: a caller that passes the
#: same node objects tick after tick (the replay) does not rebuild it every tick
_PRIORS: dict[str, tuple[list[Node], list[tuple[Shape, int]]]] = {}


def _prior_target(pool: str, members: list[Node]) -> list[tuple[Shape, int]]:
    hit = _PRIORS.get(pool)
    if (
        hit is not None
        and len(hit[0]) == len(members)
        and all(a is b for a, b in zip(hit[0], members, strict=True))
    ):
        return list(hit[1])
    target = target_workload(prior(members))
    _PRIORS[pool] = (members, target)
    return list(target)
