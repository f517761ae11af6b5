"""Dynamic MIG re-layout: the layout of one GPU that best matches the demand per profile.

Demand is a weight per MIG profile (learned request shapes plus pending requests, each
weighted by the instances it asks for). The target is each profile's share of the GPU's
7 compute slices in proportion to weight × compute. Every multiset of the family's
profiles that `scheduling.mig.layout` (the packer's placement search) can place on one
GPU is a candidate; the best one, in this order:

1. the least distance between the candidate's compute shares and the target (sum of
   absolute differences, in slices): it serves the shapes that wait, in their proportions;
2. the fewest idle compute slices (less fragmentation);
3. the fewest instances, then the names, for a deterministic answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from scheduling import mig
from scheduling.types import MigInstance


@dataclass(frozen=True)
class Proposal:
    profiles: tuple[str, ...]
    instances: tuple[MigInstance, ...]
    #: compute slices left idle on each GPU
    idle: int
    #: sum of |share - target| in compute slices (0 = the demand's proportions exactly)
    distance: float


def _candidates(family: mig.MigFamily) -> list[tuple[str, ...]]:
    """Every multiset of profiles that fits one GPU (a few hundred at most)."""
    profiles = sorted(family.profiles, key=lambda p: (-p.compute, p.name))
    out: list[tuple[str, ...]] = []

    def grow(start: int, chosen: list[str], compute: int) -> None:
        if chosen:
            out.append(tuple(chosen))
        for i in range(start, len(profiles)):
            p = profiles[i]
            if compute + p.compute > family.compute_slices:
                continue
            chosen.append(p.name)
            if mig.fits(family, chosen):
                grow(i, chosen, compute + p.compute)
            chosen.pop()

    grow(0, [], 0)
    return out


def propose(family: mig.MigFamily, demand: Mapping[str, float]) -> Proposal | None:
    """The layout for one GPU of `family` that best serves `demand` (None: no demand)."""
    demand = {p: w for p, w in demand.items() if w > 0 and family.profile(p) is not None}
    if not demand:
        return None
    compute = {p.name: p.compute for p in family.profiles}
    total = sum(w * compute[p] for p, w in demand.items())
    target = {p: family.compute_slices * w * compute[p] / total for p, w in demand.items()}
    best: tuple[tuple[float, int, int, tuple[str, ...]], tuple[str, ...]] | None = None
    for cand in _candidates(family):
        counts = Counter(cand)
        used = sum(compute[p] for p in cand)
        names = set(counts) | set(target)
        distance = sum(abs(counts[p] * compute[p] - target.get(p, 0.0)) for p in names)
        key = (round(distance, 9), family.compute_slices - used, len(cand), tuple(sorted(cand)))
        if best is None or key < best[0]:
            best = (key, cand)
    assert best is not None
    chosen = best[1]
    placed = mig.layout(family, chosen)
    assert placed is not None
    return Proposal(
        profiles=tuple(sorted(chosen, key=lambda p: (-compute[p], p))),
        instances=placed,
        idle=best[0][1],
        distance=best[0][0],
    )


def idle_of(family: mig.MigFamily, profiles: list[str]) -> int:
    """Compute slices a layout leaves idle on each GPU."""
    return family.compute_slices - sum(
        p.compute for p in (family.profile(n) for n in profiles) if p is not None
    )
