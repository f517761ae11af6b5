"""`scheduling.keeper.StateKeeper`: ticks from a kept state decide as ticks from a new one.

Each case runs a few ticks on a world that moves between them as the portal's does: some
running attempts end, some are stopped, the last tick's admissions run under new attempt
ids (one with another placement than it was admitted with, one never launched), new
requests arrive, time passes. Every tick's decisions from the keeper must equal
`scheduling.schedule`'s on the same snapshot, and the state the keeper brought to the
snapshot must hold exactly what a state built anew holds.
"""

from __future__ import annotations

import dataclasses
import random
import unittest

from scheduling import keeper as keeper_module
from scheduling import schedule
from scheduling.bench.tick import GPUS_PER_NODE, build
from scheduling.cycle import cluster_state
from scheduling.keeper import StateKeeper
from scheduling.types import (
    Decision,
    DecisionKind,
    Node,
    PendingRequest,
    Placement,
    Policy,
    Running,
    Snapshot,
)

MINUTE_MS = 60_000


def _next(snap: Snapshot, decisions: list[Decision], rng: random.Random, tick: int) -> Snapshot:
    """The world one tick later: admissions run, some work ends, new requests come."""
    pending = {r.id: r for r in snap.pending}
    running = {r.attempt_id: r for r in snap.running if rng.random() > 0.1}
    admitted = [d for d in decisions if d.kind is DecisionKind.ADMIT]
    for i, d in enumerate(admitted):
        req = pending.pop(d.request_id)
        if i == 0:
            pending[req.id] = req  # its launch failed: the request waits again
            continue
        assert d.placement is not None
        placement = d.placement
        if i == 1:
            # started elsewhere than admitted (a launch retried on other devices)
            placement = _moved(placement, snap.nodes)
        running[f"{d.request_id}#{tick}"] = Running(
            d.request_id,
            f"{d.request_id}#{tick}",
            req.team,
            req.workload_class,
            req.pool or snap.pools[0].name,
            req.shape,
            placement,
            snap.now_ms,
        )
    for d in decisions:
        if d.kind is DecisionKind.PREEMPT and d.attempt_id in running:
            running[d.attempt_id] = dataclasses.replace(running[d.attempt_id], stopping=True)
    now = snap.now_ms + MINUTE_MS
    for k in range(20):
        template = rng.choice(snap.pending)
        rid = f"new-{tick}-{k}"
        pending[rid] = dataclasses.replace(template, id=rid, created_at_ms=now - 1000)
    return dataclasses.replace(
        snap,
        now_ms=now,
        running=tuple(running.values()),
        pending=tuple(pending.values()),
    )


def _moved(placement: Placement, nodes: tuple[Node, ...]) -> Placement:
    """The same placement on the next node of the same devices (a different placement)."""
    names = [n.name for n in nodes]
    pods = tuple(
        dataclasses.replace(
            p,
            node=names[(names.index(p.node) + 1) % len(names)],
            grants=tuple(
                dataclasses.replace(g, node=names[(names.index(g.node) + 1) % len(names)])
                for g in p.grants
            ),
        )
        for p in placement.pods
    )
    return Placement(pods)


def _free(state: object, nodes: tuple[Node, ...]) -> dict[str, object]:
    return {n.name: state.free_capacity(n.name) for n in nodes}  # type: ignore[attr-defined]


class KeeperTest(unittest.TestCase):
    def run_ticks(self, seed: int, ticks: int, policy: Policy, nodes_change_at: int = -1) -> None:
        rng = random.Random(seed)
        snap = build(400, 6, 2, 40 * GPUS_PER_NODE, 0.7, seed)
        keeper = StateKeeper()
        brought: list[tuple[Snapshot, object]] = []
        real_bring = keeper_module._bring

        def bring(state, taken, s):  # type: ignore[no-untyped-def]
            real_bring(state, taken, s)
            brought.append((s, _free(state, s.nodes)))

        keeper_module._bring = bring
        try:
            for tick in range(ticks):
                if tick == nodes_change_at:
                    cordoned = dataclasses.replace(snap.nodes[3], cordoned=True)
                    snap = dataclasses.replace(
                        snap, nodes=(*snap.nodes[:3], cordoned, *snap.nodes[4:])
                    )
                kept = keeper.schedule(snap, snap.now_ms, policy)
                fresh = schedule(snap, snap.now_ms, policy)
                with self.subTest(seed=seed, tick=tick):
                    self.assertEqual(kept, fresh)
                    self.assertTrue(any(d.kind is DecisionKind.ADMIT for d in kept))
                snap = _next(snap, kept, rng, tick)
        finally:
            keeper_module._bring = real_bring
        # every tick but the first (and the one after the nodes changed) started from the
        # kept state, and that state held what a new one holds
        expect = ticks - 1 - (1 if 0 < nodes_change_at < ticks else 0)
        self.assertEqual(len(brought), expect)
        for s, free in brought:
            self.assertEqual(free, _free(cluster_state(s, policy), s.nodes))

    def test_ticks_from_the_kept_state_decide_as_ticks_from_a_new_one(self) -> None:
        for seed in (1, 2, 3):
            self.run_ticks(seed, 6, Policy())

    def test_a_change_to_the_nodes_builds_the_state_anew(self) -> None:
        self.run_ticks(4, 5, Policy(), nodes_change_at=2)

    def test_the_random_packer_always_builds_anew(self) -> None:
        rng = random.Random(5)
        snap = build(200, 4, 2, 20 * GPUS_PER_NODE, 0.6, 5)
        keeper = StateKeeper()
        policy = Policy(packer="random")
        for tick in range(3):
            self.assertEqual(
                keeper.schedule(snap, snap.now_ms, policy), schedule(snap, snap.now_ms, policy)
            )
            self.assertIsNone(keeper._kept)
            snap = _next(snap, schedule(snap, snap.now_ms, policy), rng, tick)

    def test_a_failed_tick_leaves_nothing_kept(self) -> None:
        snap = build(200, 4, 2, 20 * GPUS_PER_NODE, 0.6, 6)
        keeper = StateKeeper()
        keeper.schedule(snap, snap.now_ms, Policy())
        self.assertIsNotNone(keeper._kept)
        broken = dataclasses.replace(
            snap,
            pending=(*snap.pending, PendingRequest("x", "t", "c", None, 0)),  # type: ignore[arg-type]
        )
        with self.assertRaises(AttributeError):
            keeper.schedule(broken, snap.now_ms, Policy())
        self.assertIsNone(keeper._kept)


if __name__ == "__main__":
    unittest.main()
