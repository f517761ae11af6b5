"""Reservations with runtime estimates (EASY backfilling), table-driven.

A blocked large request holds the node expected to drain soonest (from
`Running.expected_end_ms`); without estimates the node where nothing started for the
longest time. Work backfills a reserved node only when it is expected to end
(`PendingRequest.expected_runtime_ms`) before the holder is expected to start there.
"""

from __future__ import annotations

import random
import unittest
from dataclasses import dataclass, replace

from scheduling import reservation, schedule
from scheduling.packer import eligible
from scheduling.types import DeviceGrant, PendingRequest, Placement, PodPlacement, Running, Snapshot
from tests.scheduling.builders import NOW, S, node, outcome, req, run, shape, snapshot


def ends_in(r: Running, seconds: int) -> Running:
    return replace(r, expected_end_ms=NOW + seconds * S)


def lasts(r: PendingRequest, seconds: int) -> PendingRequest:
    return replace(r, expected_runtime_ms=seconds * S)


TWO_NODES = (node("n1", gpus=4), node("n2", gpus=4))
BIG = req("big", gpus=4, created_s=100)
#: x started long ago on n1 (the old rule's pick), y recently on n2
OLD_X = run("x", node="n1", devices=(0,), age_s=5000)
NEW_Y = run("y", node="n2", devices=(0, 1, 2), age_s=100)


@dataclass
class Case:
    snap: Snapshot
    #: request id -> "kind:code"
    want: dict[str, str]
    #: the nodes held back for "big"
    reserved: list[str]


CASES: dict[str, Case] = {
    "without estimates the node untouched longest is held": Case(
        snapshot(TWO_NODES, pending=[BIG], running=[OLD_X, NEW_Y]),
        {"big": "wait:no-capacity"},
        ["n1"],
    ),
    "the node expected to drain soonest is held": Case(
        snapshot(TWO_NODES, pending=[BIG], running=[ends_in(OLD_X, 3000), ends_in(NEW_Y, 60)]),
        {"big": "wait:no-capacity"},
        ["n2"],
    ),
    "drain is when enough frees, not when the last holder ends": Case(
        # n1: one device until +4000 s, three free; n2: all four until +1000 s.
        snapshot(
            TWO_NODES,
            pending=[BIG],
            running=[
                ends_in(run("x", node="n1", devices=(0,)), 4000),
                ends_in(run("y", node="n2", devices=(0, 1)), 1000),
                ends_in(run("z", node="n2", devices=(2, 3)), 500),
            ],
        ),
        {"big": "wait:no-capacity"},
        ["n2"],
    ),
    "a node with an unestimated holder comes after one with an estimate": Case(
        snapshot(TWO_NODES, pending=[BIG], running=[OLD_X, ends_in(NEW_Y, 9000)]),
        {"big": "wait:no-capacity"},
        ["n2"],
    ),
    "an estimate already past counts as ending now": Case(
        snapshot(TWO_NODES, pending=[BIG], running=[ends_in(OLD_X, 60), ends_in(NEW_Y, -600)]),
        {"big": "wait:no-capacity"},
        ["n2"],
    ),
    "backfill on the reserved node only what ends before the holder starts": Case(
        # n1 is full for long; n2 drains in 600 s and has two devices free until then.
        snapshot(
            TWO_NODES,
            pending=[
                BIG,
                lasts(req("long", gpus=1, created_s=3), 3600),
                lasts(req("short", gpus=1, created_s=2), 300),
                req("unknown", gpus=1, created_s=1),
            ],
            running=[
                ends_in(run("x", node="n1", devices=(0, 1, 2, 3)), 10_000),
                ends_in(run("y", node="n2", devices=(0, 1)), 600),
            ],
        ),
        {
            "big": "wait:no-capacity",
            "long": "wait:no-capacity",
            "short": "admit:fits",
            "unknown": "wait:no-capacity",
        },
        ["n2"],
    ),
    "a gang holds the nodes that drain soonest": Case(
        snapshot(
            (node("n1", gpus=4), node("n2", gpus=4), node("n3", gpus=4)),
            pending=[req("big", gpus=4, pods=2, created_s=100)],
            running=[
                ends_in(run("x", node="n1", devices=(0,), age_s=9000), 5000),
                ends_in(run("y", node="n2", devices=(0,), age_s=10), 100),
                ends_in(run("z", node="n3", devices=(0,), age_s=20), 200),
            ],
        ),
        {"big": "wait:no-capacity"},
        ["n2", "n3"],
    ),
}


class ReservationTest(unittest.TestCase):
    def test_it_holds_the_node_expected_to_drain_soonest(self) -> None:
        for name, case in CASES.items():
            with self.subTest(name):
                decisions = schedule(case.snap)
                got = outcome(decisions)
                self.assertEqual({k: got.get(k) for k in case.want}, case.want)
                big = next(d for d in decisions if d.request_id == "big")
                self.assertEqual(big.facts.get("reserved_nodes"), case.reserved)

    def test_a_backfill_lands_on_the_reserved_node(self) -> None:
        case = CASES["backfill on the reserved node only what ends before the holder starts"]
        short = next(d for d in schedule(case.snap) if d.request_id == "short")
        assert short.placement is not None
        self.assertEqual(short.placement.nodes, ("n2",))


if __name__ == "__main__":
    unittest.main()


class NodeHoldsTest(unittest.TestCase):
    """What a replay keeps across ticks (`reservation._NodeHolds`) equals what a tick
    would sum from its running attempts alone, through starts, stops, attempts replaced
    (a checkpoint, a stop begun) and gangs over several nodes."""

    def fresh(
        self, running: list[Running], now: int
    ) -> tuple[dict[str, list[object]], dict[str, int]]:
        holds: dict[str, list[object]] = {}
        last: dict[str, int] = {}
        for r in running:
            end = now if r.stopping else r.expected_end_ms
            for name, hold in reservation._pod_holds(r.placement, end):
                holds.setdefault(name, []).append(hold)
            for name in r.placement.nodes:
                last[name] = max(last.get(name, 0), r.started_at_ms)
        return {n: sorted(h, key=repr) for n, h in holds.items()}, last

    def test_kept_holds_equal_fresh_ones(self) -> None:
        rng = random.Random(5)
        kept = reservation._NodeHolds()
        running: list[Running] = []
        made = 0
        for tick in range(300):
            now = NOW + tick * 60 * S
            for _ in range(rng.randrange(4)):
                roll = rng.random()
                if running and roll < 0.3:
                    running.pop(rng.randrange(len(running)))
                elif running and roll < 0.5:
                    i = rng.randrange(len(running))
                    running[i] = replace(running[i], stopping=True)
                elif running and roll < 0.6:
                    i = rng.randrange(len(running))
                    running[i] = replace(running[i], last_checkpoint_ms=now)
                else:
                    made += 1
                    nodes = rng.sample(range(6), rng.choice((1, 1, 2)))
                    pods = tuple(
                        PodPlacement(
                            f"n{k}",
                            (DeviceGrant(f"n{k}", rng.randrange(4), rng.choice((250, 1000))),),
                            cpu_milli=rng.randrange(4000),
                        )
                        for k in nodes
                    )
                    r = run(f"r{made}", age_s=rng.randrange(1, 9000))
                    end = None if rng.random() < 0.2 else now + rng.randrange(1, 3600) * S
                    running.append(replace(r, placement=Placement(pods), expected_end_ms=end))
            if rng.random() < 0.7:  # a tick that reserves nothing brings nothing up to date
                kept.update(tuple(running), now)
                holds, last = self.fresh(running, now)
                got = {n: sorted(h, key=repr) for n, h in kept.holds.items()}
                self.assertEqual(got, holds, f"tick {tick}")
                self.assertEqual({n: t for n, t in last.items() if t}, kept.last, f"tick {tick}")
        self.assertGreater(made, 100)

    def test_order_of_holds_does_not_change_when_a_node_drains(self) -> None:
        rng = random.Random(9)
        n = node("n1", gpus=4)
        want = shape(gpus=2)
        flags = eligible(n, want)
        assert flags is not None
        for _ in range(200):
            holds = [
                (
                    None if rng.random() < 0.05 else NOW + rng.randrange(5) * 600 * S,
                    ((rng.randrange(4), rng.choice((250, 500, 1000))),),
                    rng.randrange(8000),
                    0,
                )
                for _ in range(rng.randrange(1, 6))
            ]
            answer = reservation._fit_at_free(n, want, flags, holds)
            for _ in range(4):
                rng.shuffle(holds)
                self.assertEqual(reservation._fit_at_free(n, want, flags, holds), answer)
