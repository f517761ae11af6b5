"""Scarce nodes: the few hosts of a rare shape take other work only when nothing else fits."""

from __future__ import annotations

import unittest
from collections.abc import Sequence
from dataclasses import replace

from scheduling import scarce, schedule
from scheduling.types import (
    DecisionKind,
    PendingRequest,
    PoolWorkload,
    Quota,
    Running,
    Snapshot,
)
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


def preempted_squatter(
    age_s: int, quotas: list[Quota], running: Sequence[Running]
) -> list[tuple[str, str, object]]:
    """The preemptions a 120-core request (team a, waited 4,000 s) causes, with the
    shipped victim caps, while "squat" (team b, interactive, `age_s` old) holds "big"."""
    large = req("large", cls="interactive", gpus=8, cpu=120, memory_gib=720, created_s=4000)
    squat = run("squat", team="b", cls="interactive", node="big", devices=range(8), age_s=age_s)
    snap = snapshot([*SMALL, BIG], pending=[large], running=[squat, *running], quotas=quotas)
    caps = rules(max_victim_loss_gpu_s=7200, victim_loss_per_gpu_s=120)
    return [
        (d.request_id, d.code, d.facts["lost_gpu_ms"])
        for d in schedule(snap, policy=caps)
        if d.kind is DecisionKind.PREEMPT
    ]


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

    def test_a_starving_rare_shape_takes_its_node_back_from_work_that_fits_elsewhere(self) -> None:
        # "squat" (interactive: when-borrowing, its team within quota) took the only node
        # "large" fits, after it had waited its own maximum queue time. Tiers 1-4 leave it
        # alone; once "large" starves (interactive: 3,600 s), the scarce node is its.
        quotas = [quota("a", 100), quota("b", 100)]
        squat = run("squat", team="b", cls="interactive", node="big", devices=range(8))
        large = req("large", cls="interactive", gpus=8, cpu=120, memory_gib=720, created_s=4000)

        def decided(
            pending: list[PendingRequest], running: list[Running]
        ) -> dict[str, list[tuple[DecisionKind, str]]]:
            snap = snapshot([*SMALL, BIG], pending=pending, running=running, quotas=quotas)
            out: dict[str, list[tuple[DecisionKind, str]]] = {}
            for d in schedule(snap, policy=rules()):
                out.setdefault(d.request_id, []).append((d.kind, d.code))
            return out

        got = decided([large], [squat, *FULL])
        self.assertEqual(got["squat"], [(DecisionKind.PREEMPT, "scarce-node")])
        self.assertEqual(got["large"], [(DecisionKind.WAIT, "preempting")])
        # not yet starving: it waits
        young = replace(large, created_at_ms=large.created_at_ms + 3000 * 1000)
        self.assertNotIn("squat", decided([young], [squat, *FULL]))
        # work that needs the scarce node itself is not displaced from it
        needs_it = replace(squat, shape=LARGE)
        self.assertNotIn("squat", decided([large], [needs_it, *FULL]))
        # nor is a higher band's (inference: never preempted at all)
        serving = replace(squat, workload_class="inference")
        self.assertNotIn("squat", decided([large], [serving, *FULL]))

    def test_a_squatter_that_preempted_its_way_there_is_displaced_too(self) -> None:
        # An attempt admitted by preempting is no victim of its own band (no cycles), but
        # on a scarce node its admission said it may be displaced. In the replay 88-core
        # requests past their bound preempted onto the four nodes a 120-core request
        # needs, and that request waited 12,074 s (defect).
        quotas = [quota("a", 100), quota("b", 100)]
        squat = run(
            "squat", team="b", cls="interactive", node="big", devices=range(8), by_preemption=True
        )
        large = req("large", cls="interactive", gpus=8, cpu=120, memory_gib=720, created_s=4000)
        snap = snapshot([*SMALL, BIG], pending=[large], running=[squat, *FULL], quotas=quotas)
        got = {d.request_id: (d.kind, d.code) for d in schedule(snap, policy=rules())}
        self.assertEqual(got["squat"], (DecisionKind.PREEMPT, "scarce-node"))
        # the rule it keeps: no other tier takes it (its team borrows: a reclaim would)
        borrowing = replace(squat, shape=shape(gpus=8))
        ordinary = req("plain", cls="interactive", gpus=8, created_s=4000)
        snap = snapshot([BIG], pending=[ordinary], running=[borrowing], quotas=[quota("a", 8)])
        self.assertNotIn(DecisionKind.PREEMPT, [d.kind for d in schedule(snap, policy=rules())])

    def test_a_scarce_node_s_squatter_may_lose_twice_the_waiter_s_budget(self) -> None:
        # With the shipped caps (7,200 GPU-seconds a victim, 120 per preemptor GPU) an hour
        # of 8 GPUs (28,800) protects work from every tier; the waiter's loss budget is
        # what it waited, 4,000 s x 8 GPUs = 32,000, and a squatter may lose twice that.
        def preempted(age_s: int) -> list[tuple[str, str, object]]:
            return preempted_squatter(age_s, [quota("a", 100), quota("b", 100)], FULL)

        self.assertEqual(preempted(8000), [("squat", "scarce-node", 8000 * 8000 * 1000)])
        self.assertEqual(preempted(8001), [])  # 64,008 GPU-seconds: more than twice

    def test_a_squatter_another_tier_may_take_keeps_no_more_protection(self) -> None:
        # "squat" borrows (team b has no quota), so tier 1 (reclaim) may take it for "large"
        # (team a, within its nominal) - within that tier's loss limit. It also squats the
        # only node "large" fits: as such it may lose up to twice the waiter's budget, and
        # being reclaimable too must not protect it more (defect: the reclaim's limit, the
        # budget once, applied and kept "large" waiting for hours in the replay).
        quotas = [quota("a", 8), quota("b", 0), quota("c", 160)]
        full = [replace(r, team="c") for r in FULL]

        def preempted(age_s: int) -> list[tuple[str, str, object]]:
            return preempted_squatter(age_s, quotas, full)

        # within the reclaim's limit (the budget, 32,000 GPU-seconds): a reclaim
        self.assertEqual(preempted(4000), [("squat", "reclaim", 4000 * 8000 * 1000)])
        # above it, within twice the budget: the scarce node's tier takes it
        self.assertEqual(preempted(6000), [("squat", "scarce-node", 6000 * 8000 * 1000)])
        self.assertEqual(preempted(8001), [])

    def test_a_request_past_its_promise_leaves_a_rare_holder_its_node(self) -> None:
        # "large" (a shape only "big" hosts) holds "big" firmly, where inference runs;
        # "late" (interactive, 4,000 s: past its 3,600 s promise) fits on big's free device
        # and nowhere else, and still waits. Letting a request past its promise take a node
        # held for one not yet past its own was tried at load 90: long inference then took
        # all four nodes a rare shape fits, and a 117-s interactive request of that shape
        # waited 13,156 s past its promise (docs/scheduling.md, "an overdue request before
        # a holder that is not").
        large = req("large", cls="interactive", gpus=8, cpu=120, memory_gib=720, created_s=100)
        late = req("late", team="b", cls="interactive", created_s=4000)
        snap = snapshot(
            [*SMALL, BIG],
            pending=[late, large],
            running=[replace(ON_BIG, workload_class="inference"), *FULL],
            quotas=[quota("a", 100), quota("b", 100)],
        )
        got = {d.request_id: d for d in schedule(snap, policy=rules())}
        self.assertEqual(got["large"].facts.get("reserved_nodes"), ["big"])
        self.assertEqual(got["late"].kind, DecisionKind.WAIT)
        self.assertNotIn("big", got["late"].facts.get("reserved_nodes", ()))

    def test_an_admission_onto_a_scarce_node_says_it_may_be_preempted(self) -> None:
        big_req = req("large", gpus=8, cpu=120, memory_gib=720, created_s=100)
        snap = snapshot(
            [*SMALL, BIG], pending=[big_req, req("small", cls="training")], running=[ON_BIG, *FULL]
        )
        small = next(
            d for d in schedule(snap, policy=rules(max_reservations=0)) if d.request_id == "small"
        )
        self.assertEqual(small.kind, DecisionKind.ADMIT)
        self.assertEqual(small.facts["scarce_nodes"], ["big"])
        self.assertIn("big is kept for shapes few nodes can hold", small.message)


#: 40 nodes an 88-core, 8-GPU request fills whole: 5 % of the pool, w00 and w01, are kept
WIDE = tuple(node(f"w{i:02d}", gpus=8, cpu=96, memory_gib=384) for i in range(40))
WHOLE = shape(gpus=8, cpu=88, memory_gib=320)
KNOWN = (PoolWorkload("a100", ((WHOLE, 0.001),)),)
#: every node but the kept ones full
BUSY = tuple(run(f"b{i:02d}", devices=range(8), node=n.name) for i, n in enumerate(WIDE[2:]))


class KeptNodesTest(unittest.TestCase):
    def test_a_whole_node_shape_many_nodes_host_keeps_a_few(self) -> None:
        kept = scarce.kept_nodes(WIDE, [("a100", WHOLE), ("a100", shape(gpus=4))])
        self.assertEqual(kept, {"w00", "w01"})
        # a pool under 20 nodes keeps none
        self.assertEqual(scarce.kept_nodes(WIDE[:19], [("a100", WHOLE)]), frozenset())
        # a rare whole-node shape has its hosts scarce instead
        odd = (*WIDE, node("huge", gpus=8, cpu=128, memory_gib=768))
        rare = shape(gpus=8, cpu=120, memory_gib=720)
        self.assertEqual(scarce.kept_nodes(odd, [("a100", rare)]), frozenset())
        self.assertEqual(scarce.scarce_nodes(odd, [("a100", rare)]), {"huge"})

    def test_a_learned_shape_keeps_at_most_learned_kept_nodes(self) -> None:
        self.assertEqual(scarce.kept_nodes(WIDE, [("a100", WHOLE)], most=1), {"w00"})
        self.assertEqual(scarce.kept_nodes(WIDE, [("a100", WHOLE)], most=5), {"w00", "w01"})

        # Only learned, the shape keeps w00: fresh inference takes w01. Once a request of
        # the shape is pending, w01 is kept again and the inference waits for its bound.
        def placed(*pending: PendingRequest) -> dict[str, list[str]]:
            snap = replace(snapshot(WIDE, pending=pending, running=BUSY), workloads=KNOWN)
            out: dict[str, list[str]] = {}
            for d in schedule(snap, policy=rules(max_reservations=0, learned_kept_nodes=1)):
                if d.kind is DecisionKind.ADMIT and d.placement is not None:
                    out[d.request_id] = sorted(d.placement.nodes)
            return out

        fresh = req("fresh", cls="inference", created_s=10)
        self.assertEqual(placed(fresh), {"fresh": ["w01"]})
        whole = req("whole", cls="interactive", gpus=8, cpu=88, memory_gib=320, created_s=10)
        self.assertEqual(placed(fresh, whole), {})

    def test_other_work_goes_elsewhere_first(self) -> None:
        # w00 has one device free: best fit would take it
        on_kept = run("r-w00", devices=range(7), node="w00")
        snap = snapshot(WIDE, pending=[req("small", cls="training")], running=[on_kept])
        self.assertEqual(placed_on(snap), {"small": ["w00"]})
        self.assertNotEqual(placed_on(replace(snap, workloads=KNOWN))["small"], ["w00"])

    def test_never_preempted_work_waits_for_other_nodes_up_to_its_queue_time(self) -> None:
        # only learned, the shape keeps one node (w00); w01 is full as well
        busy = (*BUSY, run("b-w01", devices=range(8), node="w01"))

        def placed(r: PendingRequest) -> dict[str, list[str]]:
            return placed_on(replace(snapshot(WIDE, pending=[r], running=busy), workloads=KNOWN))

        self.assertEqual(placed(req("fresh", cls="inference", created_s=10)), {})
        self.assertEqual(placed(req("old", cls="inference", created_s=700))["old"], ["w00"])
        # always preemptible work takes a kept node at once
        self.assertEqual(placed(req("batch", cls="training"))["batch"], ["w00"])

    def test_the_shape_itself_takes_a_kept_node_only_as_a_last_resort(self) -> None:
        # Kept nodes are the reserve of the request that found no other: a fresh one of the
        # shape (interactive, not always preemptible) waits; past its class's maximum
        # queue time (3,600 s) it takes one.
        def placed(created_s: int) -> dict[str, list[str]]:
            whole = req(
                "whole", cls="interactive", gpus=8, cpu=88, memory_gib=320, created_s=created_s
            )
            return placed_on(
                replace(snapshot(WIDE, pending=[whole], running=BUSY), workloads=KNOWN)
            )

        self.assertEqual(placed(10), {})
        self.assertIn(placed(3700)["whole"], (["w00"], ["w01"]))

    def test_the_kept_shape_takes_a_kept_node_at_its_starvation_bound(self) -> None:
        # With the bound at half the class's maximum queue time (1,800 s of 3,600), a
        # request that may preempt on the kept nodes may also take one that is free there.
        def placed(created_s: int) -> list[str]:
            whole = req(
                "whole", cls="interactive", gpus=8, cpu=88, memory_gib=320, created_s=created_s
            )
            snap = replace(snapshot(WIDE, pending=[whole], running=BUSY), workloads=KNOWN)
            return [
                n
                for d in schedule(snap, policy=rules(max_reservations=0, starvation_after=0.5))
                if d.kind is DecisionKind.ADMIT and d.placement is not None
                for n in d.placement.nodes
            ]

        self.assertEqual(placed(1700), [])
        self.assertIn(placed(1900), (["w00"], ["w01"]))

    def test_a_starving_whole_node_request_finds_preemptible_work_there(self) -> None:
        # Every other host holds inference; the kept ones hold training. Past its bound
        # (interactive: 3,600 s) the request preempts the training on a kept node.
        serving = tuple(
            run(f"s{i:02d}", cls="inference", devices=range(8), node=n.name)
            for i, n in enumerate(WIDE[2:])
        )
        batch = tuple(
            run(f"t{i}", cls="training", devices=range(8), node=n.name)
            for i, n in enumerate(WIDE[:2])
        )
        whole = req("whole", cls="interactive", gpus=8, cpu=88, memory_gib=320, created_s=4000)
        snap = snapshot(WIDE, pending=[whole], running=[*serving, *batch])
        got = [(d.request_id, d.kind) for d in schedule(snap, policy=rules())]
        self.assertIn(("whole", DecisionKind.WAIT), got)
        self.assertEqual(
            sum(1 for rid, kind in got if kind is DecisionKind.PREEMPT and rid in ("t0", "t1")), 1
        )


if __name__ == "__main__":
    unittest.main()
