"""MIG profile tables and placement geometry (NVIDIA's MIG user guide).

A GPU in MIG mode has 7 compute slices (GPCs) and 8 memory slots (4 and 4 on the A30 and
the RTX PRO 6000 Blackwell). A GPU instance of a
profile occupies `slots` consecutive memory slots starting at one of the profile's allowed
starts, and `compute` compute slices. A layout is valid when

1. no two instances overlap in memory slots,
2. the compute slices of all instances sum to at most the GPU's (7 or 4),
3. no profile appears more often than its per-GPU maximum (this only binds the `+me`
   profiles, which own the GPU's single set of media engines; geometry bounds the rest).

So 4g + 3g fits (slots 0–3 and 4–7, 7 compute slices), 3g + 3g fits, 3g + 3g + 1g does not
(no memory slot left).

Memory sizes are the values NVML reports; treat them as approximate.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.types import MigInstance

#: compute slices (GPCs) of a 7-slice MIG GPU (A100, H100, H200, H20, GH200, B200, GB200, B300)
COMPUTE_SLICES = 7
#: memory slots of a 7-slice MIG GPU
MEMORY_SLOTS = 8
ALL_SLOTS_MASK = (1 << MEMORY_SLOTS) - 1
#: compute slices and memory slots of a 4-slice MIG GPU (A30, RTX PRO 6000 Blackwell)
SMALL_SLICES = 4

# Allowed starts per profile class (the MIG user guide's placement tables).
_STARTS_1G1 = (0, 1, 2, 3, 4, 5, 6)
_STARTS_1G2 = (0, 2, 4, 6)
_STARTS_2G = (0, 2, 4)
_STARTS_3G = (0, 4)
_STARTS_4G = (0,)
_STARTS_7G = (0,)
# On a 4-slice GPU (the A30 placement diagram): 1g anywhere, 2g at 0 or 2, 4g whole.
_SMALL_STARTS = {(1, 1): (0, 1, 2, 3), (2, 2): (0, 2), (4, 4): (0,)}


def unknown_gpu_message(model: str) -> str:
    """What an admin is told about a MIG GPU whose geometry is not in the table."""
    return f"unknown MIG GPU {model or '(no product label)'}: not scheduled as MIG"


def media_profile(name: str) -> bool:
    """Whether the profile owns the GPU's media engines (`+me`, `+me.all`): one per GPU."""
    return "+me" in name


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of one GPU family."""

    name: str
    #: GPC slices out of the GPU's `gpu_compute`
    compute: int
    #: memory slots out of the GPU's 8 (4 on a 4-slice GPU)
    slots: int
    memory_mib: int
    #: allowed start memory slots
    starts: tuple[int, ...]
    #: most instances of this profile on one GPU
    max_count: int
    #: compute slices of the whole GPU (7, or 4 on A30 and RTX PRO 6000 Blackwell)
    gpu_compute: int = COMPUTE_SLICES

    @property
    def gpu_slots(self) -> int:
        """Memory slots of the whole GPU: 8, or 4 on a 4-slice GPU."""
        return MEMORY_SLOTS if self.gpu_compute == COMPUTE_SLICES else SMALL_SLICES

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
    #: compute slices of one GPU (7, or 4)
    compute_slices: int = COMPUTE_SLICES

    def profile(self, name: str) -> MigProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None


def _family(
    name: str,
    memory_mib: int,
    rows: list[tuple[str, int, int, int, int]],
    *,
    slices: int = COMPUTE_SLICES,
) -> MigFamily:
    starts = (
        {
            (1, 1): _STARTS_1G1,
            (1, 2): _STARTS_1G2,
            (2, 2): _STARTS_2G,
            (3, 4): _STARTS_3G,
            (4, 4): _STARTS_4G,
            (7, 8): _STARTS_7G,
        }
        if slices == COMPUTE_SLICES
        else _SMALL_STARTS
    )
    return MigFamily(
        name=name,
        memory_mib=memory_mib,
        profiles=tuple(
            MigProfile(p, compute, slots, mib, starts[(compute, slots)], max_count, slices)
            for p, compute, slots, mib, max_count in rows
        ),
        compute_slices=slices,
    )


def _gib(name: str) -> int:
    """A profile's memory from its name ("3g.90gb" -> 90 GiB in MiB).

    Used where NVIDIA's guide gives only the profile name: the exact NVML value of these
    parts is not confirmed here (`nvidia-smi mig -lgip` on the hardware gives it).
    """
    return int(name.split(".", 1)[1].split("gb", 1)[0]) * 1024


def _seven(
    name: str, memory_mib: int, one: str, one_big: str, two: str, three: str, four: str, seven: str
) -> MigFamily:
    """A 7-slice family of the GH100/GB100 shape, memory from the profile names."""
    return _family(
        name,
        memory_mib,
        [
            (one, 1, 1, _gib(one), 7),
            (f"{one}+me", 1, 1, _gib(one), 1),
            (one_big, 1, 2, _gib(one_big), 4),
            (two, 2, 2, _gib(two), 3),
            (three, 3, 4, _gib(three), 2),
            (four, 4, 4, _gib(four), 1),
            (seven, 7, 8, _gib(seven), 1),
        ],
    )


# Profiles and counts: NVIDIA's MIG user guide ("Supported MIG Profiles") and the GPU
# Operator's default mig-parted configuration (assets/state-mig-manager). Memory in MiB is
# the NVML value for the four families tabled before; for the others it is the nominal
# size in the profile name (see `_gib`).
A30_24GB = _family(
    "A30-24GB",
    24576,
    [
        ("1g.6gb", 1, 1, 6144, 4),
        ("1g.6gb+me", 1, 1, 6144, 1),
        ("2g.12gb", 2, 2, 12288, 2),
        ("2g.12gb+me", 2, 2, 12288, 1),
        ("4g.24gb", 4, 4, 24576, 1),
    ],
    slices=SMALL_SLICES,
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
#: H100 NVL and H100 94 GB (H800 NVL)
H100_94GB = _seven(
    "H100-94GB", 96256, "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"
)
#: H100 96 GB, the H100 of GH200 96 GB
H100_96GB = _seven(
    "H100-96GB", 98304, "1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"
)
#: H20 96 GB: the operator's balanced layout gives it the H100-96GB profiles (0x2329)
H20_96GB = _seven(
    "H20-96GB", 98304, "1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"
)
#: GH200 with 96 GB HBM3: the H100-96GB profiles (0x2342)
GH200_96GB = _seven(
    "GH200-96GB", 98304, "1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"
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
#: GH200 with 144 GB HBM3e (0x2348)
GH200_144GB = _seven(
    "GH200-144GB", 147456, "1g.18gb", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"
)
#: B200 180 GB (0x2901); placements taken as GH100's (not confirmed from the guide's diagram)
B200_180GB = _seven(
    "B200-180GB", 184320, "1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"
)
#: GB200 186 GB (0x2941); placements as B200's
GB200_186GB = _seven(
    "GB200-186GB", 190464, "1g.23gb", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"
)
#: B300 288 GB (0x3182; 269 GB usable under MIG); placements as B200's
B300_288GB = _seven(
    "B300-288GB", 294912, "1g.34gb", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"
)
#: RTX PRO 6000 Blackwell 96 GB (0x2BB5): 4 slices. Counts from the operator's config;
#: placements as the A30's 4-slice diagram (not confirmed for GB202).
RTX_PRO_6000 = _family(
    "RTX-PRO-6000-96GB",
    98304,
    [
        ("1g.24gb", 1, 1, 24576, 4),
        ("1g.24gb+gfx", 1, 1, 24576, 4),
        ("1g.24gb-me", 1, 1, 24576, 4),
        ("1g.24gb+me.all", 1, 1, 24576, 1),
        ("2g.48gb", 2, 2, 49152, 2),
        ("2g.48gb+gfx", 2, 2, 49152, 2),
        ("2g.48gb-me", 2, 2, 49152, 2),
        ("2g.48gb+me.all", 2, 2, 49152, 1),
        ("4g.96gb", 4, 4, 98304, 1),
        ("4g.96gb+gfx", 4, 4, 98304, 1),
    ],
    slices=SMALL_SLICES,
)

FAMILIES: tuple[MigFamily, ...] = (
    A30_24GB,
    A100_40GB,
    A100_80GB,
    H100_80GB,
    H100_94GB,
    H100_96GB,
    H20_96GB,
    H200_141GB,
    GH200_96GB,
    GH200_144GB,
    B200_180GB,
    GB200_186GB,
    B300_288GB,
    RTX_PRO_6000,
)


def _tokens(model: str) -> set[str]:
    return set(re.split(r"[^A-Z0-9]+", model.upper()))


# (asked for each MIG grant the packer takes or gives back: a few models, parsed once)
@functools.lru_cache(maxsize=1024)
def family_for(model: str, memory_mib: int = 0) -> MigFamily | None:
    """Recognise the MIG family of a GPU from its product name (GFD's `nvidia.com/gpu.product`,
    e.g. "NVIDIA-H100-80GB-HBM3") and, where the name does not say, its memory in MiB.

    None: not a GPU this table knows. A MIG device of such a GPU is refused, never given a
    guessed geometry (`unknown_gpu_message`).
    """
    words = _tokens(model.split("-MIG-", 1)[0])
    gib = memory_mib / 1024
    if "RTX" in words and "PRO" in words and "6000" in words:
        return RTX_PRO_6000
    if "A30" in words:
        return A30_24GB
    if "GB300" in words:
        return None  # not in this table yet
    if "GB200" in words:
        return GB200_186GB
    if "B200" in words:
        return B200_180GB
    if "B300" in words:
        return B300_288GB
    if "GH200" in words:
        return GH200_144GB if "144G" in words or "144GB" in words or gib > 120 else GH200_96GB
    if "H200" in words:
        return H200_141GB
    if "H20" in words:
        return H20_96GB
    if "H100" in words or "H800" in words:
        if "NVL" in words or "94GB" in words:
            return H100_94GB
        if "96GB" in words:
            return H100_96GB
        if "80GB" in words or gib <= 88:
            return H100_80GB
        # H100 NVL reports 95830 MiB, the 96 GB H100 97871 MiB
        return H100_94GB if memory_mib <= 97280 else H100_96GB
    if "A100" in words or "A800" in words:
        if "80GB" in words or (gib > 48 and "40GB" not in words):
            return A100_80GB
        return A100_40GB
    return None


def profile_for(model: str, memory_mib: int, profile: str) -> MigProfile | None:
    """The named profile on a GPU of this model; None when the family lacks it or the GPU
    is unknown (no geometry is guessed from the profile's name)."""
    family = family_for(model, memory_mib)
    return family.profile(profile) if family is not None else None


def free_starts(
    profile: MigProfile, mask: int, compute_used: int = 0, same_profile_count: int = 0
) -> tuple[int, ...]:
    """Starts where `profile` can be created next to instances using `mask` and `compute_used`."""
    if (
        compute_used + profile.compute > profile.gpu_compute
        or same_profile_count >= profile.max_count
    ):
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
    return compute <= family.compute_slices


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
