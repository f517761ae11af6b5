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
        ("NVIDIA-H100-NVL", 95830, None),
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
