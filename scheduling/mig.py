"""MIG profile tables and placement geometry (NVIDIA's MIG user guide).

A GPU in MIG mode has 7 compute slices (GPCs) and 8 memory slots. A GPU instance of a
profile occupies `slots` consecutive memory slots starting at one of the profile's allowed
starts, and `compute` compute slices. A layout is valid when

1. no two instances overlap in memory slots,
2. the compute slices of all instances sum to at most 7,
3. no profile appears more often than its per-GPU maximum (this only binds the `+me`
   profiles, which own the GPU's single set of media engines; geometry bounds the rest).

So 4g + 3g fits (slots 0–3 and 4–7, 7 compute slices), 3g + 3g fits, 3g + 3g + 1g does not
(no memory slot left).

Memory sizes are the values NVML reports; treat them as approximate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.types import MigInstance

#: compute slices (GPCs) of a MIG-capable GPU
COMPUTE_SLICES = 7
#: memory slots of a MIG-capable GPU
MEMORY_SLOTS = 8
ALL_SLOTS_MASK = (1 << MEMORY_SLOTS) - 1

# Allowed starts per profile class (the MIG user guide's placement tables).
_STARTS_1G1 = (0, 1, 2, 3, 4, 5, 6)
_STARTS_1G2 = (0, 2, 4, 6)
_STARTS_2G = (0, 2, 4)
_STARTS_3G = (0, 4)
_STARTS_4G = (0,)
_STARTS_7G = (0,)


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of one GPU family."""

    name: str
    #: GPC slices out of 7
    compute: int
    #: memory slots out of 8
    slots: int
    memory_mib: int
    #: allowed start memory slots
    starts: tuple[int, ...]
    #: most instances of this profile on one GPU
    max_count: int

    def mask(self, start: int) -> int:
        """Bitmask of the memory slots an instance starting at `start` occupies."""
        return ((1 << self.slots) - 1) << start


@dataclass(frozen=True, slots=True)
class MigFamily:
    """A GPU family's MIG profile table."""

    name: str
    #: total device memory the family is recognised by, in MiB (approximate)
    memory_mib: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None


def _family(name: str, memory_mib: int, rows: list[tuple[str, int, int, int, int]]) -> MigFamily:
    starts = {
        (1, 1): _STARTS_1G1,
        (1, 2): _STARTS_1G2,
        (2, 2): _STARTS_2G,
        (3, 4): _STARTS_3G,
        (4, 4): _STARTS_4G,
        (7, 8): _STARTS_7G,
    }
    return MigFamily(
        name=name,
        memory_mib=memory_mib,
        profiles=tuple(
            MigProfile(p, compute, slots, mib, starts[(compute, slots)], max_count)
            for p, compute, slots, mib, max_count in rows
        ),
    )


A100_40GB = _family(
    "A100-40GB",
    40960,
    [
        ("1g.5gb", 1, 1, 4864, 7),
        ("1g.5gb+me", 1, 1, 4864, 1),
        ("1g.10gb", 1, 2, 9856, 4),
        ("2g.10gb", 2, 2, 9856, 3),
        ("3g.20gb", 3, 4, 19968, 2),
        ("4g.20gb", 4, 4, 19968, 1),
        ("7g.40gb", 7, 8, 40192, 1),
    ],
)
A100_80GB = _family(
    "A100-80GB",
    81920,
    [
        ("1g.10gb", 1, 1, 9856, 7),
        ("1g.10gb+me", 1, 1, 9856, 1),
        ("1g.20gb", 1, 2, 19968, 4),
        ("2g.20gb", 2, 2, 19968, 3),
        ("3g.40gb", 3, 4, 40192, 2),
        ("4g.40gb", 4, 4, 40192, 1),
        ("7g.80gb", 7, 8, 80384, 1),
    ],
)
H100_80GB = _family(
    "H100-80GB",
    81920,
    [
        ("1g.10gb", 1, 1, 10240, 7),
        ("1g.10gb+me", 1, 1, 10240, 1),
        ("1g.20gb", 1, 2, 20480, 4),
        ("2g.20gb", 2, 2, 20480, 3),
        ("3g.40gb", 3, 4, 40960, 2),
        ("4g.40gb", 4, 4, 40960, 1),
        ("7g.80gb", 7, 8, 81920, 1),
    ],
)
H200_141GB = _family(
    "H200-141GB",
    144384,
    [
        ("1g.18gb", 1, 1, 18432, 7),
        ("1g.18gb+me", 1, 1, 18432, 1),
        ("1g.35gb", 1, 2, 35840, 4),
        ("2g.35gb", 2, 2, 35840, 3),
        ("3g.71gb", 3, 4, 72704, 2),
        ("4g.71gb", 4, 4, 72704, 1),
        ("7g.141gb", 7, 8, 144384, 1),
    ],
)

FAMILIES: tuple[MigFamily, ...] = (A100_40GB, A100_80GB, H100_80GB, H200_141GB)


def family_for(model: str, memory_mib: int = 0) -> MigFamily | None:
    """Recognise the MIG family of a GPU from its model name and (optionally) memory.

    1. "H200" in the name -> H200-141GB.
    2. "H100"/"H800" -> H100-80GB, unless the name or memory says 94/96 GB (NVL, not tabled).
    3. "A100"/"A800" -> A100-80GB when the name says 80GB or memory > 48 GiB, else A100-40GB.
    4. Anything else -> None (not MIG-capable as far as Quartermaster knows).
    """
    name = model.upper().replace("_", "-")
    big = memory_mib > 48 * 1024
    if "H200" in name:
        return H200_141GB
    if "H100" in name or "H800" in name:
        if "94GB" in name or "96GB" in name or "NVL" in name or memory_mib > 90 * 1024:
            return None
        return H100_80GB
    if "A100" in name or "A800" in name:
        if "80GB" in name or (big and "40GB" not in name):
            return A100_80GB
        return A100_40GB
    return None


def profile_for(model: str, memory_mib: int, profile: str) -> MigProfile | None:
    """The named profile on a GPU of this model, or None when the family lacks it."""
    family = family_for(model, memory_mib)
    if family is not None:
        return family.profile(profile)
    # Unknown family: fall back to the shape of the name ("3g.40gb"), class geometry only.
    return generic_profile(profile)


def generic_profile(profile: str) -> MigProfile | None:
    """Class geometry from the name alone; the 1g class is taken as one memory slot."""
    head = profile.split(".", 1)[0]
    table = {
        1: (1, _STARTS_1G1),
        2: (2, _STARTS_2G),
        3: (4, _STARTS_3G),
        4: (4, _STARTS_4G),
        7: (8, _STARTS_7G),
    }
    if not head.endswith("g") or not head[:-1].isdigit() or int(head[:-1]) not in table:
        return None
    compute = int(head[:-1])
    slots, starts = table[compute]
    return MigProfile(profile, compute, slots, 0, starts, 1 if profile.endswith("+me") else 8)


def free_starts(
    profile: MigProfile, mask: int, compute_used: int = 0, same_profile_count: int = 0
) -> tuple[int, ...]:
    """Starts where `profile` can be created next to instances using `mask` and `compute_used`."""
    if compute_used + profile.compute > COMPUTE_SLICES or same_profile_count >= profile.max_count:
        return ()
    return tuple(s for s in profile.starts if not mask & profile.mask(s))


def layout_valid(family: MigFamily, instances: Iterable[MigInstance]) -> bool:
    """Whether a set of instances is a valid layout on a GPU of `family` (rules 1–3)."""
    mask = 0
    compute = 0
    counts: dict[str, int] = {}
    for inst in instances:
        prof = family.profile(inst.profile)
        if prof is None or inst.start not in prof.starts or inst.size != prof.slots:
            return False
        m = prof.mask(inst.start)
        if mask & m:
            return False
        mask |= m
        compute += prof.compute
        counts[inst.profile] = counts.get(inst.profile, 0) + 1
        if counts[inst.profile] > prof.max_count:
            return False
    return compute <= COMPUTE_SLICES


def fits(family: MigFamily, profiles: Iterable[str]) -> bool:
    """Whether instances of these profiles can coexist on one GPU (searching all starts)."""
    return layout(family, profiles) is not None


def layout(family: MigFamily, profiles: Iterable[str]) -> tuple[MigInstance, ...] | None:
    """Place instances of these profiles on one GPU, biggest first; None when they do not fit."""
    wanted = [family.profile(p) for p in profiles]
    if any(p is None for p in wanted):
        return None
    ordered = sorted((p for p in wanted if p is not None), key=lambda p: (-p.slots, p.name))
    placed: list[MigInstance] = []

    def place(i: int, mask: int, compute: int, counts: dict[str, int]) -> bool:
        if i == len(ordered):
            return True
        prof = ordered[i]
        for start in free_starts(prof, mask, compute, counts.get(prof.name, 0)):
            counts[prof.name] = counts.get(prof.name, 0) + 1
            placed.append(MigInstance(prof.name, start, prof.slots))
            if place(i + 1, mask | prof.mask(start), compute + prof.compute, counts):
                return True
            placed.pop()
            counts[prof.name] -= 1
        return False

    if not place(0, 0, 0, {}):
        return None
    return tuple(sorted(placed, key=lambda m: m.start))
