"""The full decision list of seeded mixed ticks, compared with a golden recorded before the
tick was optimised for scale (issue 33, item 4): an optimisation may make `schedule()`
faster, never decide differently.

The workloads are the tick benchmark's synthetic snapshot (`scheduling.bench.tick.build`),
varied so that every path of the pass runs: stopping attempts and their preemptors,
requeue backoff, estimates (backfill, drain), unknown classes and pools, a pool in
maintenance, shapes only a few large nodes can host (scarce nodes), requests past their
starvation bound, and a nearly full cluster (preemption, reservations).

Regenerate (only when a change of decisions is intended, and say why in the commit):
    python -m tests.scheduling.test_tick_golden --write
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
import sys
import unittest
from pathlib import Path

from scheduling.bench.tick import GPUS_PER_NODE, build
from scheduling.cycle import schedule
from scheduling.profile import DEFAULT_PROFILE
from scheduling.profile import load as load_profile
from scheduling.types import (
    Decision,
    Device,
    Lifecycle,
    Node,
    Partitioning,
    Policy,
    Pool,
    Shape,
    Snapshot,
)

GOLDEN = Path(__file__).with_name("golden") / "tick_decisions.json.gz"
HOUR_MS = 3_600_000


def _vary(snap: Snapshot, seed: int, old: float) -> Snapshot:
    """Add the paths the benchmark's snapshot leaves out (see the module docstring)."""
    rng = random.Random(seed)
    now = snap.now_ms
    first = snap.pools[0].name
    big = tuple(
        Node(
            f"big-{i}",
            first,
            256_000,
            2_097_152,
            tuple(Device(d, "H100", 81_920, Partitioning.TIME_SLICING, 4) for d in range(16)),
        )
        for i in range(3)
    )
    running = []
    for r in snap.running:
        roll = rng.random()
        if roll < 0.02:
            r = dataclasses.replace(r, stopping=True)
        elif roll < 0.5:
            r = dataclasses.replace(
                r,
                expected_end_ms=now + rng.randrange(60_000, 8 * HOUR_MS),
                last_checkpoint_ms=r.started_at_ms + rng.randrange(0, 600_000),
            )
        running.append(r)
    pending = []
    for r in snap.pending:
        roll = rng.random()
        if roll < 0.01:
            r = dataclasses.replace(r, workload_class="nonesuch")
        elif roll < 0.02:
            r = dataclasses.replace(r, pool="nonesuch")
        elif roll < 0.03:
            r = dataclasses.replace(r, pool="maint")
        elif roll < 0.06:
            r = dataclasses.replace(r, attempts=1, not_before_ms=now + rng.randrange(1, 600_000))
        elif roll < 0.062:
            r = dataclasses.replace(r, preempting=True)
        elif roll < 0.09:
            r = dataclasses.replace(r, shape=Shape(count=16, cpu_milli=8000, memory_mib=32_768))
        elif roll < 0.10:
            r = dataclasses.replace(r, shape=Shape(count=12, cpu_milli=8000, memory_mib=32_768))
        if rng.random() < 0.4:
            r = dataclasses.replace(r, expected_runtime_ms=rng.choice((600, 3600, 14_400)) * 1000)
        if rng.random() < old:
            r = dataclasses.replace(r, created_at_ms=now - rng.randrange(HOUR_MS, 48 * HOUR_MS))
        pending.append(r)
    return dataclasses.replace(
        snap,
        pools=(*snap.pools, Pool("maint", lifecycle=Lifecycle.MAINTENANCE)),
        nodes=snap.nodes + big,
        running=tuple(running),
        pending=tuple(pending),
    )


def workloads() -> list[tuple[str, Snapshot, Policy]]:
    shipped = load_profile(DEFAULT_PROFILE).policy()
    # eager: preempts at once, without loss caps, and holds more nodes back
    eager = Policy(
        max_preemptions_per_tick=64,
        preempt_after_s=0,
        max_victim_loss_gpu_s=0,
        victim_loss_per_gpu_s=0,
        max_reservations=16,
        reserve_after_s=0,
    )
    roomy = _vary(build(4000, 12, 3, 500 * GPUS_PER_NODE, 0.5, 3), 3, 0.05)
    deep = _vary(build(5000, 30, 5, 500 * GPUS_PER_NODE, 0.6, 1), 1, 0.1)
    full = _vary(build(3000, 8, 2, 100 * GPUS_PER_NODE, 0.92, 5), 5, 0.5)
    return [
        ("roomy-shipped", roomy, shipped),
        ("deep-shipped", deep, shipped),
        ("full-shipped", full, shipped),
        ("roomy-eager", roomy, eager),
        ("full-eager", full, eager),
    ]


def encode(decisions: list[Decision]) -> list[object]:
    return [
        json.loads(json.dumps(dataclasses.asdict(d), sort_keys=True, default=str))
        for d in decisions
    ]


def current() -> dict[str, list[object]]:
    return {name: encode(schedule(snap, policy=policy)) for name, snap, policy in workloads()}


class TickGoldenTest(unittest.TestCase):
    def test_decisions_match_the_golden(self) -> None:
        with gzip.open(GOLDEN, "rt") as f:
            golden = json.load(f)
        got = current()
        self.assertEqual(sorted(got), sorted(golden))
        for name, want in golden.items():
            have = got[name]
            self.assertEqual(len(have), len(want), name)
            for i, (a, b) in enumerate(zip(have, want, strict=True)):
                self.assertEqual(a, b, f"{name}: decision {i} differs")

    def test_the_workloads_reach_every_outcome(self) -> None:
        # The golden is only worth what it covers.
        with gzip.open(GOLDEN, "rt") as f:
            golden = json.load(f)
        codes = {d["code"] for ds in golden.values() for d in ds}  # type: ignore[index]
        for code in (
            "fits",
            "borrows",
            "no-capacity",
            "preempting",
            "reclaim",
            "backoff",
            "unknown-class",
            "unknown-pool",
            "pool-maintenance",
            "cohort-exhausted",
        ):
            self.assertIn(code, codes)


if __name__ == "__main__":
    if "--write" in sys.argv:
        with gzip.open(GOLDEN, "wt") as f:
            json.dump(current(), f, sort_keys=True)
        sys.exit(0)
    unittest.main()


class AlikeRequestsTest(unittest.TestCase):
    """Alike requests share a decision only while it would be the same (`_Tick.decide`)."""

    def test_room_after_the_stops_is_looked_for_again_after_an_admission(self) -> None:
        # One node of 2 GPUs: device 0 held by a stopping attempt, device 1 free. A and B
        # are alike (team a, 2 GPUs); C (team b, 1 GPU) comes between them and takes
        # device 1, so once the stop is done there is room for A, but no longer for B.
        from tests.scheduling.builders import node, req, rules, run, snapshot

        snap = snapshot(
            [node(gpus=2)],
            pending=[
                req("A", "a", gpus=2, created_s=60, priority=2),
                req("C", "b", gpus=1, created_s=60, priority=1),
                req("B", "a", gpus=2, created_s=50, priority=0),
            ],
            running=[run("old", "c", devices=(0,), stopping=True)],
        )
        got = {d.request_id: d.code for d in schedule(snap, policy=rules(max_reservations=0))}
        self.assertEqual(got, {"A": "awaiting-stop", "C": "fits", "B": "no-capacity"})

    def test_a_copy_is_the_decision_the_request_would_get_on_its_own(self) -> None:
        # Runtime estimates differ from request to request (a replay draws each one);
        # alike requests share a decision when no reservation tells their runtimes apart.
        # Every decision must be the one the request gets when it is decided alone.
        from unittest import mock

        from scheduling import cycle
        from tests.scheduling.builders import node, pool, req, snapshot

        # two alike requests for a pool in maintenance: a decision made before the queue
        # is read says no queue position, and neither may its copy
        maint = snapshot(
            [node("m1", pool="old", gpus=4)],
            pools=[pool("old", lifecycle=Lifecycle.MAINTENANCE)],
            pending=[req("one", pool="old", created_s=2), req("two", pool="old", created_s=1)],
        )
        self.assertEqual([d.position for d in schedule(maint)], [0, 0])
        for name, snap, policy in workloads():
            if name == "roomy-eager":
                continue
            rng = random.Random(name)
            distinct = dataclasses.replace(
                snap,
                pending=tuple(
                    dataclasses.replace(r, expected_runtime_ms=rng.randrange(60, 12 * 3600) * 1000)
                    if rng.random() < 0.8
                    else r
                    for r in snap.pending
                ),
            )
            for variant, s in (("as built", snap), ("distinct estimates", distinct)):
                shared = encode(schedule(s, policy=policy))
                with mock.patch.object(cycle._Tick, "_alike", lambda *_: None):
                    alone = encode(schedule(s, policy=policy))
                with self.subTest(workload=name, variant=variant):
                    self.assertEqual(len(shared), len(alone))
                    for i, (a, b) in enumerate(zip(shared, alone, strict=True)):
                        self.assertEqual(a, b, f"decision {i} differs")

    def test_the_collector_is_paused_for_a_tick_and_left_as_found(self) -> None:
        import gc
        from unittest import mock

        from scheduling import cycle

        snap = build(200, 4, 2, 20 * GPUS_PER_NODE, 0.6, 3)
        seen: list[bool] = []
        real = cycle._Tick.decide

        def decide(tick: cycle._Tick, req: object, position: int) -> list[Decision]:
            seen.append(gc.isenabled())
            return real(tick, req, position)  # type: ignore[arg-type]

        enabled = gc.isenabled()
        try:
            with mock.patch.object(cycle._Tick, "decide", decide):
                for before in (True, False):
                    (gc.enable if before else gc.disable)()
                    seen.clear()
                    schedule(snap)
                    self.assertEqual(set(seen), {False})
                    self.assertEqual(gc.isenabled(), before)
            # nested (two ticks at once): the first one out does not resume it
            gc.enable()
            inner = cycle._collector_paused(gc.isenabled)
            self.assertTrue(
                cycle._collector_paused(lambda: (inner(), gc.isenabled()))() == (False, False)
            )
            self.assertTrue(gc.isenabled())
        finally:
            (gc.enable if enabled else gc.disable)()

    def test_a_tick_is_freed_without_the_cyclic_collector(self) -> None:
        # A replay runs tens of thousands of ticks: one kept alive by a reference cycle
        # until the collector runs holds its whole cluster state, and costs CPU.
        import gc
        import weakref

        from scheduling.cycle import _Tick

        snap = build(300, 4, 2, 40 * GPUS_PER_NODE, 0.6, 2)
        enabled = gc.isenabled()
        gc.disable()
        try:
            tick = _Tick(snap, snap.now_ms, Policy())
            tick.run()
            ref = weakref.ref(tick)
            del tick
            self.assertIsNone(ref())
        finally:
            if enabled:
                gc.enable()
