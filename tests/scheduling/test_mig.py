"""MIG profile tables and placement geometry."""

from __future__ import annotations

import pytest

from scheduling import mig
from scheduling.types import MigInstance


@pytest.mark.parametrize(
    ("family", "profiles", "fits"),
    [
        (mig.A100_40GB, ["4g.20gb", "3g.20gb"], True),
        (mig.A100_40GB, ["3g.20gb", "3g.20gb"], True),
        (mig.A100_40GB, ["3g.20gb", "3g.20gb", "1g.5gb"], False),
        (mig.A100_40GB, ["1g.5gb"] * 7, True),
        (mig.A100_40GB, ["1g.5gb"] * 8, False),
        (mig.A100_40GB, ["1g.10gb"] * 4, True),
        (mig.A100_40GB, ["1g.10gb"] * 5, False),
        (mig.A100_40GB, ["2g.10gb", "2g.10gb", "3g.20gb"], True),
        (mig.A100_40GB, ["2g.10gb"] * 3 + ["1g.5gb"], True),
        (mig.A100_40GB, ["4g.20gb", "4g.20gb"], False),
        (mig.A100_40GB, ["7g.40gb", "1g.5gb"], False),
        (mig.A100_40GB, ["1g.5gb+me", "1g.5gb+me"], False),
        (mig.A100_80GB, ["4g.40gb", "3g.40gb"], True),
        (mig.A100_80GB, ["3g.40gb", "3g.40gb", "1g.10gb"], False),
        (mig.A100_80GB, ["1g.20gb", "2g.20gb", "3g.40gb"], True),
        (mig.H100_80GB, ["4g.40gb", "3g.40gb"], True),
        (mig.H100_80GB, ["3g.40gb", "3g.40gb"], True),
        (mig.H100_80GB, ["3g.40gb", "3g.40gb", "1g.10gb"], False),
        (mig.H200_141GB, ["4g.71gb", "3g.71gb"], True),
        (mig.H200_141GB, ["3g.71gb", "3g.71gb", "1g.18gb"], False),
        (mig.H200_141GB, ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"], True),
        (mig.H200_141GB, ["3g.40gb"], False),
    ],
)
def test_fits(family: mig.MigFamily, profiles: list[str], fits: bool) -> None:
    assert mig.fits(family, profiles) is fits


@pytest.mark.parametrize(
    ("family", "profile", "slots", "starts", "compute", "memory_mib"),
    [
        (mig.A100_40GB, "1g.5gb", 1, (0, 1, 2, 3, 4, 5, 6), 1, 4864),
        (mig.A100_40GB, "1g.10gb", 2, (0, 2, 4, 6), 1, 9856),
        (mig.A100_40GB, "2g.10gb", 2, (0, 2, 4), 2, 9856),
        (mig.A100_40GB, "3g.20gb", 4, (0, 4), 3, 19968),
        (mig.A100_40GB, "4g.20gb", 4, (0,), 4, 19968),
        (mig.A100_40GB, "7g.40gb", 8, (0,), 7, 40192),
        (mig.A100_80GB, "1g.10gb", 1, (0, 1, 2, 3, 4, 5, 6), 1, 9856),
        (mig.A100_80GB, "1g.20gb", 2, (0, 2, 4, 6), 1, 19968),
        (mig.H100_80GB, "1g.10gb", 1, (0, 1, 2, 3, 4, 5, 6), 1, 10240),
        (mig.H100_80GB, "7g.80gb", 8, (0,), 7, 81920),
        (mig.H200_141GB, "1g.35gb", 2, (0, 2, 4, 6), 1, 35840),
        (mig.H200_141GB, "3g.71gb", 4, (0, 4), 3, 72704),
    ],
)
def test_profile_tables(
    family: mig.MigFamily,
    profile: str,
    slots: int,
    starts: tuple[int, ...],
    compute: int,
    memory_mib: int,
) -> None:
    prof = family.profile(profile)
    assert prof is not None
    assert (prof.slots, prof.starts, prof.compute, prof.memory_mib) == (
        slots,
        starts,
        compute,
        memory_mib,
    )


@pytest.mark.parametrize(
    ("model", "memory_mib", "family"),
    [
        ("NVIDIA-A100-SXM4-40GB", 40960, mig.A100_40GB),
        ("NVIDIA-A100-SXM4-80GB", 81920, mig.A100_80GB),
        ("A100", 81920, mig.A100_80GB),
        ("A100", 40960, mig.A100_40GB),
        ("A800-SXM4-80GB", 0, mig.A100_80GB),
        ("NVIDIA-H100-80GB-HBM3", 81920, mig.H100_80GB),
        ("H800", 81920, mig.H100_80GB),
        ("NVIDIA-H100-NVL", 95830, mig.H100_94GB),
        ("NVIDIA-H200", 144384, mig.H200_141GB),
        ("Tesla-T4", 15360, None),
        ("V100M32", 32768, None),
    ],
)
def test_family_for(model: str, memory_mib: int, family: mig.MigFamily | None) -> None:
    assert mig.family_for(model, memory_mib) is family


def test_free_starts_follow_the_mask() -> None:
    three = mig.A100_80GB.profile("3g.40gb")
    one = mig.A100_80GB.profile("1g.10gb")
    assert three is not None and one is not None
    assert mig.free_starts(three, 0) == (0, 4)
    assert mig.free_starts(three, three.mask(0)) == (4,)
    assert mig.free_starts(three, three.mask(0) | three.mask(4)) == ()
    assert mig.free_starts(one, three.mask(0), compute_used=3) == (4, 5, 6)
    assert mig.free_starts(one, 0, compute_used=7) == ()


def test_layout_valid() -> None:
    ok = [MigInstance("4g.20gb", 0, 4), MigInstance("3g.20gb", 4, 4)]
    assert mig.layout_valid(mig.A100_40GB, ok)
    assert not mig.layout_valid(mig.A100_40GB, [*ok, MigInstance("1g.5gb", 6, 1)])
    assert not mig.layout_valid(mig.A100_40GB, [MigInstance("3g.20gb", 2, 4)])
    assert not mig.layout_valid(mig.A100_40GB, [MigInstance("3g.40gb", 0, 4)])


def test_layout_places_the_all_balanced_profiles_where_nvidia_does() -> None:
    from scheduling.mig import H100_80GB, layout

    placed = layout(H100_80GB, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])
    assert placed is not None
    assert [(m.profile, m.start, m.size) for m in placed] == [
        ("2g.20gb", 0, 2),
        ("1g.10gb", 2, 1),
        ("1g.10gb", 3, 1),
        ("3g.40gb", 4, 4),
    ]
    assert layout(H100_80GB, ["3g.40gb", "3g.40gb", "1g.10gb"]) is None


# Every GPU of NVIDIA's MIG user guide: how GFD names it (`nvidia.com/gpu.product`,
# `nvidia.com/gpu.memory` in MiB), its profiles with (compute, memory slots, MiB, max),
# a layout that fits and one that does not.
EVERY_MIG_GPU = [
    (
        "NVIDIA-A30",
        24576,
        mig.A30_24GB,
        4,
        {
            "1g.6gb": (1, 1, 6144, 4),
            "1g.6gb+me": (1, 1, 6144, 1),
            "2g.12gb": (2, 2, 12288, 2),
            "2g.12gb+me": (2, 2, 12288, 1),
            "4g.24gb": (4, 4, 24576, 1),
        },
        ["2g.12gb", "1g.6gb", "1g.6gb"],
        ["2g.12gb", "2g.12gb", "1g.6gb"],
    ),
    (
        "NVIDIA-A100-SXM4-40GB",
        40960,
        mig.A100_40GB,
        7,
        {
            "1g.5gb": (1, 1, 4864, 7),
            "1g.5gb+me": (1, 1, 4864, 1),
            "1g.10gb": (1, 2, 9856, 4),
            "2g.10gb": (2, 2, 9856, 3),
            "3g.20gb": (3, 4, 19968, 2),
            "4g.20gb": (4, 4, 19968, 1),
            "7g.40gb": (7, 8, 40192, 1),
        },
        ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"],
        ["4g.20gb", "4g.20gb"],
    ),
    (
        "NVIDIA-A100-SXM4-80GB",
        81920,
        mig.A100_80GB,
        7,
        {
            "1g.10gb": (1, 1, 9856, 7),
            "1g.10gb+me": (1, 1, 9856, 1),
            "1g.20gb": (1, 2, 19968, 4),
            "2g.20gb": (2, 2, 19968, 3),
            "3g.40gb": (3, 4, 40192, 2),
            "4g.40gb": (4, 4, 40192, 1),
            "7g.80gb": (7, 8, 80384, 1),
        },
        ["4g.40gb", "3g.40gb"],
        ["3g.40gb", "3g.40gb", "1g.10gb"],
    ),
    (
        "NVIDIA-H100-80GB-HBM3",
        81559,
        mig.H100_80GB,
        7,
        {
            "1g.10gb": (1, 1, 10240, 7),
            "1g.10gb+me": (1, 1, 10240, 1),
            "1g.20gb": (1, 2, 20480, 4),
            "2g.20gb": (2, 2, 20480, 3),
            "3g.40gb": (3, 4, 40960, 2),
            "4g.40gb": (4, 4, 40960, 1),
            "7g.80gb": (7, 8, 81920, 1),
        },
        ["1g.20gb"] * 4,
        ["1g.20gb"] * 5,
    ),
    (
        "NVIDIA-H800-80GB-HBM3",
        81559,
        mig.H100_80GB,
        7,
        {"1g.10gb": (1, 1, 10240, 7), "7g.80gb": (7, 8, 81920, 1)},
        ["1g.10gb"] * 7,
        ["1g.10gb"] * 8,
    ),
    (
        "NVIDIA-H100-NVL",
        95830,
        mig.H100_94GB,
        7,
        {
            "1g.12gb": (1, 1, 12288, 7),
            "1g.12gb+me": (1, 1, 12288, 1),
            "1g.24gb": (1, 2, 24576, 4),
            "2g.24gb": (2, 2, 24576, 3),
            "3g.47gb": (3, 4, 48128, 2),
            "4g.47gb": (4, 4, 48128, 1),
            "7g.94gb": (7, 8, 96256, 1),
        },
        ["3g.47gb", "2g.24gb", "1g.12gb", "1g.12gb"],
        ["7g.94gb", "1g.12gb"],
    ),
    (
        "NVIDIA-H100-96GB-HBM3",
        97871,
        mig.H100_96GB,
        7,
        {
            "1g.12gb": (1, 1, 12288, 7),
            "1g.12gb+me": (1, 1, 12288, 1),
            "1g.24gb": (1, 2, 24576, 4),
            "2g.24gb": (2, 2, 24576, 3),
            "3g.48gb": (3, 4, 49152, 2),
            "4g.48gb": (4, 4, 49152, 1),
            "7g.96gb": (7, 8, 98304, 1),
        },
        ["4g.48gb", "3g.48gb"],
        ["4g.48gb", "4g.48gb"],
    ),
    (
        "NVIDIA-H20",
        97871,
        mig.H20_96GB,
        7,
        {
            "1g.12gb": (1, 1, 12288, 7),
            "1g.24gb": (1, 2, 24576, 4),
            "2g.24gb": (2, 2, 24576, 3),
            "3g.48gb": (3, 4, 49152, 2),
            "4g.48gb": (4, 4, 49152, 1),
            "7g.96gb": (7, 8, 98304, 1),
        },
        ["3g.48gb", "3g.48gb"],
        ["1g.12gb+me", "1g.12gb+me"],
    ),
    (
        "NVIDIA-H200",
        143771,
        mig.H200_141GB,
        7,
        {
            "1g.18gb": (1, 1, 18432, 7),
            "1g.18gb+me": (1, 1, 18432, 1),
            "1g.35gb": (1, 2, 35840, 4),
            "2g.35gb": (2, 2, 35840, 3),
            "3g.71gb": (3, 4, 72704, 2),
            "4g.71gb": (4, 4, 72704, 1),
            "7g.141gb": (7, 8, 144384, 1),
        },
        ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"],
        ["3g.71gb", "3g.71gb", "1g.18gb"],
    ),
    (
        "NVIDIA-GH200-480GB",
        97871,
        mig.GH200_96GB,
        7,
        {"1g.12gb": (1, 1, 12288, 7), "3g.48gb": (3, 4, 49152, 2), "7g.96gb": (7, 8, 98304, 1)},
        ["3g.48gb", "2g.24gb", "1g.12gb", "1g.12gb"],
        ["7g.96gb", "1g.12gb"],
    ),
    (
        "NVIDIA-GH200-144G-HBM3e",
        146831,
        mig.GH200_144GB,
        7,
        {
            "1g.18gb": (1, 1, 18432, 7),
            "1g.18gb+me": (1, 1, 18432, 1),
            "1g.36gb": (1, 2, 36864, 4),
            "2g.36gb": (2, 2, 36864, 3),
            "3g.72gb": (3, 4, 73728, 2),
            "4g.72gb": (4, 4, 73728, 1),
            "7g.144gb": (7, 8, 147456, 1),
        },
        ["1g.18gb", "1g.18gb", "2g.36gb", "3g.72gb"],
        ["1g.36gb"] * 5,
    ),
    (
        "NVIDIA-B200",
        183359,
        mig.B200_180GB,
        7,
        {
            "1g.23gb": (1, 1, 23552, 7),
            "1g.23gb+me": (1, 1, 23552, 1),
            "1g.45gb": (1, 2, 46080, 4),
            "2g.45gb": (2, 2, 46080, 3),
            "3g.90gb": (3, 4, 92160, 2),
            "4g.90gb": (4, 4, 92160, 1),
            "7g.180gb": (7, 8, 184320, 1),
        },
        ["1g.23gb", "1g.23gb", "2g.45gb", "3g.90gb"],
        ["4g.90gb", "3g.90gb", "1g.23gb"],
    ),
    (
        "NVIDIA-GB200",
        189471,
        mig.GB200_186GB,
        7,
        {
            "1g.23gb": (1, 1, 23552, 7),
            "1g.23gb+me": (1, 1, 23552, 1),
            "1g.47gb": (1, 2, 48128, 4),
            "2g.47gb": (2, 2, 48128, 3),
            "3g.93gb": (3, 4, 95232, 2),
            "4g.93gb": (4, 4, 95232, 1),
            "7g.186gb": (7, 8, 190464, 1),
        },
        ["1g.23gb", "1g.23gb", "2g.47gb", "3g.93gb"],
        ["2g.47gb"] * 4,
    ),
    (
        "NVIDIA-B300-SXM6-AC",
        275040,
        mig.B300_288GB,
        7,
        {
            "1g.34gb": (1, 1, 34816, 7),
            "1g.34gb+me": (1, 1, 34816, 1),
            "1g.67gb": (1, 2, 68608, 4),
            "2g.67gb": (2, 2, 68608, 3),
            "3g.135gb": (3, 4, 138240, 2),
            "4g.135gb": (4, 4, 138240, 1),
            "7g.269gb": (7, 8, 275456, 1),
        },
        ["1g.34gb", "1g.34gb", "2g.67gb", "3g.135gb"],
        ["7g.269gb", "1g.34gb"],
    ),
    (
        "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        97887,
        mig.RTX_PRO_6000,
        4,
        {
            "1g.24gb": (1, 1, 24576, 4),
            "1g.24gb+gfx": (1, 1, 24576, 4),
            "1g.24gb-me": (1, 1, 24576, 4),
            "1g.24gb+me.all": (1, 1, 24576, 1),
            "2g.48gb": (2, 2, 49152, 2),
            "2g.48gb+gfx": (2, 2, 49152, 2),
            "2g.48gb-me": (2, 2, 49152, 2),
            "2g.48gb+me.all": (2, 2, 49152, 1),
            "4g.96gb": (4, 4, 98304, 1),
            "4g.96gb+gfx": (4, 4, 98304, 1),
        },
        ["1g.24gb", "1g.24gb", "2g.48gb"],
        ["1g.24gb"] * 5,
    ),
]


@pytest.mark.parametrize(
    ("product", "memory_mib", "family", "slices", "profiles", "fits", "does_not_fit"),
    EVERY_MIG_GPU,
    ids=[row[0] for row in EVERY_MIG_GPU],
)
def test_every_mig_gpu_has_its_row(
    product: str,
    memory_mib: int,
    family: mig.MigFamily,
    slices: int,
    profiles: dict[str, tuple[int, int, int, int]],
    fits: list[str],
    does_not_fit: list[str],
) -> None:
    assert mig.family_for(product, memory_mib) is family
    assert family.compute_slices == slices
    for name, (compute, slots, memory, most) in profiles.items():
        prof = family.profile(name)
        assert prof is not None, name
        assert (prof.compute, prof.slots, prof.memory_mib, prof.max_count) == (
            compute,
            slots,
            memory,
            most,
        ), name
        # every start lies on the GPU and is aligned to the instance's size
        assert all(s % prof.slots == 0 or prof.slots == 1 for s in prof.starts), name
        assert all(s + prof.slots <= prof.gpu_slots for s in prof.starts), name
    placed = mig.layout(family, fits)
    assert placed is not None and mig.layout_valid(family, placed)
    assert not mig.fits(family, does_not_fit)


def test_a_4_slice_gpu_has_its_own_placements() -> None:
    one = mig.A30_24GB.profile("1g.6gb")
    two = mig.A30_24GB.profile("2g.12gb")
    four = mig.A30_24GB.profile("4g.24gb")
    assert one is not None and two is not None and four is not None
    assert (one.starts, two.starts, four.starts) == ((0, 1, 2, 3), (0, 2), (0,))
    assert one.gpu_slots == 4
    assert mig.free_starts(one, 0, compute_used=4) == ()
    assert mig.free_starts(two, two.mask(0), compute_used=2) == (2,)
    # a 7-slice geometry would let a fifth 1g in: the A30 has four slices
    assert not mig.fits(mig.A30_24GB, ["1g.6gb"] * 5)


@pytest.mark.parametrize(
    ("product", "memory_mib"),
    [
        ("NVIDIA-GB300", 284208),
        ("NVIDIA-RTX-PRO-5000-Blackwell", 48000),
        ("NVIDIA-L40S", 46068),
        ("", 0),
    ],
)
def test_an_unknown_gpu_gets_no_guessed_geometry(product: str, memory_mib: int) -> None:
    assert mig.family_for(product, memory_mib) is None
    assert mig.profile_for(product, memory_mib, "3g.40gb") is None
    assert mig.profile_for(product, memory_mib, "1g.10gb") is None
    assert "not scheduled as MIG" in mig.unknown_gpu_message(product)
    assert not hasattr(mig, "generic_profile")


def test_the_product_of_a_single_strategy_node_names_the_gpu() -> None:
    # GFD under the `single` strategy appends the profile to the product
    assert mig.family_for("NVIDIA-A30-MIG-1g.6gb", 6016) is mig.A30_24GB
    assert mig.family_for("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 9856) is mig.H100_80GB


def test_quotas_count_a_4_slice_gpu_s_slice_as_its_share() -> None:
    from scheduling.types import FOUR_SLICE_MIG_PROFILES, ProfileKind, Shape

    def milli(profile: str) -> int:
        return Shape(kind=ProfileKind.MIG, count=1, mig_profile=profile).gpus_milli

    assert milli("1g.6gb") == 250 and milli("2g.48gb") == 500 and milli("4g.24gb") == 1000
    assert milli("3g.40gb") == 428 and milli("1g.24gb") == 142  # the H100-94/96GB profile
    small = {p.name for f in mig.FAMILIES if f.compute_slices == 4 for p in f.profiles}
    big = {p.name for f in mig.FAMILIES if f.compute_slices == 7 for p in f.profiles}
    assert small - big == FOUR_SLICE_MIG_PROFILES
