"""The what-if replay keeps work across ticks (`cycle.remembering`); it must not change
what the replay decides."""

from __future__ import annotations

import contextlib
import random
from dataclasses import asdict
from typing import Any

import pytest

from scheduling import cycle, packer, reservation, whatif
from scheduling.simulate import REPLAY_CLASSES, Job
from scheduling.types import Partitioning, Policy, Quota, Team
from scheduling.whatif import Site, replay
from tests.scheduling.builders import node, pool, shape

MINUTE = 60 * 1000
HOUR = 60 * MINUTE


def _site(scarce: bool = False) -> Site:
    # scarce: one a100 node of 21 alone takes a 100-core 8-GPU job (scheduling/scarce.py)
    big = (node("a-big", pool="a100", gpus=8, cpu=128),) if scarce else ()
    nodes = (
        *(node(f"a{i}", pool="a100", gpus=8) for i in range(20 if scarce else 4)),
        *big,
        *(node(f"l{i}", pool="l4", gpus=4, model="L4") for i in range(2)),
        node("s0", pool="shared", gpus=4, partitioning=Partitioning.TIME_SLICING),
    )
    teams = ("t0", "t1", "t2")
    return Site(
        nodes=nodes,
        pools=(
            pool("a100"),
            pool("l4"),
            pool("shared", partitioning=Partitioning.TIME_SLICING),
        ),
        classes=REPLAY_CLASSES,
        teams=tuple(Team(t) for t in teams),
        quotas=tuple(
            Quota(t, p, milli, None)
            for t in teams
            for p, milli in (("a100", 10_000), ("l4", 2_000), ("shared", 1_000))
        ),
        policy=Policy(reserve_after_s=600, preempt_after_s=300),
    )


def _history(seed: int, n: int = 400, scarce: bool = False) -> list[Job]:
    """Seeded jobs over two days: whole GPUs, gangs and slices, with runtime estimates
    (reservations and backfilling use them) and checkpoints, enough to queue."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        roll = rng.random()
        if scarce and roll < 0.1:
            s, pool_name, cls = shape(gpus=8, cpu=100), "a100", "interactive"
        elif roll < 0.6:
            s, pool_name, cls = shape(gpus=rng.choice((1, 2, 4, 8))), "", "training"
        elif roll < 0.75:
            s, pool_name, cls = shape(gpus=rng.choice((2, 4)), pods=2), "a100", "training"
        else:
            s, pool_name, cls = shape(milli=rng.choice((250, 500))), "shared", "interactive"
        runtime = rng.choice((10, 30, 60, 120, 240)) * MINUTE
        jobs.append(
            Job(
                f"j{i:04d}",
                f"t{rng.randrange(3)}",
                cls,
                s,
                runtime,
                arrival_ms=rng.randrange(48 * HOUR),
                estimate_ms=runtime * rng.choice((1, 2, 3)) if rng.random() < 0.8 else None,
                checkpoint_ms=30 * MINUTE if cls == "training" else None,
                pool=pool_name,
            )
        )
    return jobs


@pytest.mark.parametrize(("seed", "scarce"), [(1, False), (2, False), (3, True)])
def test_remembering_across_ticks_changes_no_decision(
    seed: int, scarce: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    site, jobs = _site(scarce), _history(seed, n=900 if scarce else 400, scarce=scarce)
    kept: dict[str, int] = {}
    real = cycle.remembering

    @contextlib.contextmanager
    def counting():  # type: ignore[no-untyped-def]
        with real():
            yield
            kept["drains"] = len(reservation._DRAINS or {})
            kept["evaluations"] = len(packer._EVALUATED or {})

    update = reservation._NodeHolds.update

    def updating(holds: reservation._NodeHolds, *args: Any) -> None:
        update(holds, *args)
        kept["node_holds"] = max(kept.get("node_holds", 0), len(holds.holds))

    monkeypatch.setattr(whatif, "remembering", counting)
    monkeypatch.setattr(reservation._NodeHolds, "update", updating)
    remembered = replay(site, jobs, end_ms=48 * HOUR, tick_ms=MINUTE)
    monkeypatch.setattr(whatif, "remembering", contextlib.nullcontext)
    fresh = replay(site, jobs, end_ms=48 * HOUR, tick_ms=MINUTE)

    # the replay did keep work between ticks, and queued enough to reserve and preempt
    assert kept["drains"] > 0 and kept["evaluations"] > 0 and kept["node_holds"] > 0
    assert len(fresh.waiting) > 0 and fresh.preemptions > 0
    assert any(fresh.first_start_ms.get(j.id, 48 * HOUR) > j.arrival_ms + 10 * MINUTE for j in jobs)
    # ... and decided exactly as without it
    a, b = asdict(remembered), asdict(fresh)
    a.pop("seconds"), b.pop("seconds")
    assert a == b
    # nothing is kept once the replay is over
    assert reservation._DRAINS is None and packer._EVALUATED is None
    assert reservation._NODE_HOLDS is None


def test_memos_dropped_when_full_change_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small caps: the drains' answers and their hold numbers are dropped again and again
    # during the replay (also between two holders of one tick).
    site, jobs = _site(), _history(1)
    dropped: list[int] = []
    real = cycle.remembering

    @contextlib.contextmanager
    def counting():  # type: ignore[no-untyped-def]
        with real():
            yield
            assert reservation._DRAINS is not None
            dropped.append(reservation._DRAINS.generation)

    monkeypatch.setattr(reservation, "_DRAINS_MAX", 40)
    monkeypatch.setattr(whatif, "remembering", counting)
    small = replay(site, jobs, end_ms=48 * HOUR, tick_ms=MINUTE)
    monkeypatch.setattr(whatif, "remembering", contextlib.nullcontext)
    fresh = replay(site, jobs, end_ms=48 * HOUR, tick_ms=MINUTE)

    assert dropped and dropped[0] > 10
    a, b = asdict(small), asdict(fresh)
    a.pop("seconds"), b.pop("seconds")
    assert a == b


def _drain_clamped(now, node_, shape_, flags, holds):  # type: ignore[no-untyped-def]
    """The rule `_drain_ms` had before it was remembered: ends clamped to now, then sorted."""
    from scheduling import fit

    ends, used, cpu, mem = [], {}, 0, 0
    for k, (end, grants, c, m) in enumerate(holds):
        if end is None:
            return None
        ends.append((max(end, now), k))
        for dev, milli in grants:
            used[dev] = used.get(dev, 0) + milli
        cpu, mem = cpu + c, mem + m
    if fit.fits_free(node_, shape_, flags, used, cpu, mem):
        return now
    for end, k in sorted(ends):
        _, grants, c, m = holds[k]
        for dev, milli in grants:
            used[dev] -= milli
        cpu, mem = cpu - c, mem - m
        if fit.fits_free(node_, shape_, flags, used, cpu, mem):
            return end
    return None


def test_when_a_node_drains_does_not_depend_on_clamping_past_ends_first() -> None:
    rng = random.Random(7)
    n = node("a0", gpus=8, cpu=16)
    for _ in range(2000):
        s = shape(gpus=rng.choice((1, 2, 4, 8)), cpu=rng.choice((0, 2, 8)))
        flags = packer.eligible(n, s)
        assert flags is not None
        now = 1000 * rng.randrange(20)
        holds = []
        devices = list(range(8))
        rng.shuffle(devices)
        for _ in range(rng.randrange(6)):
            take = [devices.pop() for _ in range(min(len(devices), rng.choice((1, 2))))]
            end = None if rng.random() < 0.05 else 1000 * rng.randrange(30)
            holds.append((end, tuple((d, 1000) for d in take), rng.choice((0, 4000, 10_000)), 0))
        at, free = reservation._fit_at_free(n, s, flags, holds)
        assert (None if at is None else max(at, now)) == _drain_clamped(now, n, s, flags, holds)
        held = {d for _, grants, _, _ in holds for d, milli in grants if milli}
        assert free == sum(
            1 for d, ok in zip(n.devices, flags, strict=True) if ok and d.index not in held
        )
