"""Scarce nodes: the few hosts of a rare shape take other work only when nothing else fits."""

from __future__ import annotations

import unittest
from dataclasses import replace

from scheduling import scarce, schedule
from scheduling.types import DecisionKind, PoolWorkload, Snapshot
from tests.scheduling.builders import node, quota, req, rules, run, shape, snapshot

#: 20 ordinary nodes and one large one: a shape of 120 cores and 720 GiB fits only "big"
SMALL = tuple(node(f"s{i:02d}", gpus=8, cpu=64, memory_gib=256) for i in range(20))
BIG = node("big", gpus=8, cpu=128, memory_gib=768)
LARGE = shape(gpus=8, cpu=120, memory_gib=720)
#: "big" has one device free: best fit puts a 1-GPU request there unless told otherwise
ON_BIG = run("r-big", devices=range(7), node="big")
#: every ordinary node full
FULL = tuple(run(f"f{i:02d}", devices=range(8), node=n.name) for i, n in enumerate(SMALL))


def placed_on(snap: Snapshot) -> dict[str, list[str]]:
    """Where each admitted request goes; no reservations, so only the placement rule acts."""
    out: dict[str, list[str]] = {}
    for d in schedule(snap, policy=rules(max_reservations=0)):
        if d.kind is DecisionKind.ADMIT:
            assert d.placement is not None
            out[d.request_id] = sorted(d.placement.nodes)
    return out


class ScarceNodesTest(unittest.TestCase):
    def test_rare_shape_marks_its_few_hosts(self) -> None:
        nodes = (*SMALL, BIG)
        self.assertEqual(scarce.scarce_nodes(nodes, [("a100", LARGE)]), {"big"})
        # a shape every node can hold marks nothing
        self.assertEqual(scarce.scarce_nodes(nodes, [("a100", shape(gpus=1))]), frozenset())
        # a shape no node can hold marks nothing either
        huge = shape(gpus=8, cpu=512)
        self.assertEqual(scarce.scarce_nodes(nodes, [("a100", huge)]), frozenset())

    def test_without_a_rare_shape_best_fit_takes_the_large_node(self) -> None:
        snap = snapshot([*SMALL, BIG], pending=[req("small", cls="inference")], running=[ON_BIG])
        self.assertEqual(placed_on(snap), {"small": ["big"]})

    def test_learned_rare_shape_keeps_small_work_elsewhere(self) -> None:
        snap = snapshot([*SMALL, BIG], pending=[req("small", cls="inference")], running=[ON_BIG])
        snap = replace(snap, workloads=(PoolWorkload("a100", ((LARGE, 0.001),)),))
        self.assertNotEqual(placed_on(snap)["small"], ["big"])

    def test_pending_rare_shape_keeps_small_work_elsewhere(self) -> None:
        big_req = req("large", gpus=8, cpu=120, memory_gib=720, created_s=100)
        snap = snapshot(
            [*SMALL, BIG], pending=[big_req, req("small", cls="inference")], running=[ON_BIG]
        )
        self.assertNotEqual(placed_on(snap).get("small"), ["big"])

    def test_scarce_node_still_takes_preemptible_work_nothing_else_fits(self) -> None:
        big_req = req("large", gpus=8, cpu=120, memory_gib=720, created_s=100)
        snap = snapshot(
            [*SMALL, BIG],
            pending=[big_req, req("small", cls="training")],
            running=[ON_BIG, *FULL],
        )
        self.assertEqual(placed_on(snap).get("small"), ["big"])

    def test_never_preempted_work_waits_rather_than_block_a_scarce_node(self) -> None:
        big_req = req("large", gpus=8, cpu=120, memory_gib=720, created_s=100)
        fresh = req("fresh", cls="inference", created_s=10)
        snap = snapshot([*SMALL, BIG], pending=[big_req, fresh], running=[ON_BIG, *FULL])
        self.assertNotIn("fresh", placed_on(snap))
        # past its class's maximum queue time (600 s here) it takes the scarce node
        old = req("old", cls="inference", created_s=700)
        snap = snapshot([*SMALL, BIG], pending=[big_req, old], running=[ON_BIG, *FULL])
        self.assertEqual(placed_on(snap).get("old"), ["big"])

    def test_when_borrowing_work_waits_rather_than_block_a_scarce_node(self) -> None:
        # Interactive work (when-borrowing) within its team's quota can no more be preempted
        # by the rare shape than inference, and it never checkpoints: it too waits for
        # another node up to its class's maximum queue time (3,600 s here).
        big_req = req("large", gpus=8, cpu=120, memory_gib=720, created_s=100)
        quotas = [quota("a", 100)]
        fresh = req("fresh", cls="interactive", created_s=10)
        snap = snapshot(
            [*SMALL, BIG], pending=[big_req, fresh], running=[ON_BIG, *FULL], quotas=quotas
        )
        self.assertNotIn("fresh", placed_on(snap))
        old = req("old", cls="interactive", created_s=3700)
        snap = snapshot(
            [*SMALL, BIG], pending=[big_req, old], running=[ON_BIG, *FULL], quotas=quotas
        )
        self.assertEqual(placed_on(snap).get("old"), ["big"])

    def test_rare_shape_holds_a_reservation_before_older_requests(self) -> None:
        # Every node is full; five older 2-GPU requests would take all four reservations.
        older = [req(f"old{i}", gpus=2, created_s=1000 + i) for i in range(5)]
        big_req = req("large", gpus=8, cpu=120, memory_gib=720, created_s=100)
        snap = snapshot([*SMALL, BIG], pending=[*older, big_req], running=[ON_BIG, *FULL])
        large = next(d for d in schedule(snap, policy=rules()) if d.request_id == "large")
        self.assertEqual(large.facts.get("reserved_nodes"), ["big"])

    def test_reservation_of_a_rare_borrower_is_firm(self) -> None:
        # "large" borrows (team a's nominal is 1 GPU); an entitled 1-GPU request of team b
        # would ignore a borrower's reservation, but not on the only node "large" fits.
        empty_big = node("big", gpus=8, cpu=128, memory_gib=768)
        snap = snapshot(
            [*SMALL, empty_big],
            pending=[
                req("large", gpus=8, cpu=120, memory_gib=720, created_s=100),
                req("small", team="b", cls="training", created_s=10),
            ],
            running=[run("r-big", devices=(0,), node="big"), *FULL],
            quotas=[quota("a", 1), quota("b", 200)],
        )
        got = {d.request_id: d for d in schedule(snap, policy=rules())}
        self.assertEqual(got["large"].facts.get("reserved_nodes"), ["big"])
        self.assertNotEqual(got["small"].kind, DecisionKind.ADMIT)

    def test_reservation_of_a_starving_borrower_is_firm(self) -> None:
        # "starving" (interactive, max_queue_s 3600) waited past its bound and borrows;
        # a request within its nominal no longer takes the node held for it.
        nodes = (node("n1", gpus=4), node("n2", gpus=4))
        running = [
            run("i1", team="c", cls="inference", node="n1", devices=(0,)),
            run("i2", team="c", cls="inference", node="n2", devices=range(4)),
        ]
        pending = [
            req("starving", cls="interactive", gpus=4, created_s=4000),
            req("small", team="b", created_s=10),
        ]
        quotas = [quota("a", 1), quota("b", 100), quota("c", 100)]
        snap = snapshot(nodes, pending=pending, running=running, quotas=quotas)
        got = {d.request_id: d for d in schedule(snap, policy=rules())}
        self.assertEqual(got["starving"].facts.get("reserved_nodes"), ["n1"])
        self.assertNotEqual(got["small"].kind, DecisionKind.ADMIT)
        # before its bound the same reservation gives way to the team within its nominal
        young = req("starving", cls="interactive", gpus=4, created_s=100)
        snap = snapshot(nodes, pending=[young, pending[1]], running=running, quotas=quotas)
        got = {d.request_id: d for d in schedule(snap, policy=rules())}
        self.assertEqual(got["small"].kind, DecisionKind.ADMIT)


if __name__ == "__main__":
    unittest.main()
