"""One scenario per rule of `schedule()`, table-driven (Kueue's scheduler tests where they apply)."""

from __future__ import annotations

import unittest
from dataclasses import dataclass, field, replace

from scheduling import schedule
from scheduling.types import Decision, DecisionKind, Lifecycle, Policy, Snapshot
from tests.scheduling.builders import (
    NOW,
    by_kind,
    node,
    outcome,
    pool,
    quota,
    req,
    rules,
    run,
    snapshot,
)


@dataclass
class Case:
    snap: Snapshot
    #: request id -> "kind:code" for the requests the case is about
    want: dict[str, str]
    #: attempt ids preempted, in order (None = do not check)
    preempted: list[str] | None = None
    policy: Policy = field(default_factory=rules)


TWO_NODES = (node("n1", gpus=4), node("n2", gpus=4))

CASES: dict[str, Case] = {
    # Kueue: "Should admit workloads as they fit in their ClusterQueue"
    "admits as they fit": Case(
        snapshot(
            [node("n1", gpus=4)],
            pending=[
                req("r1", gpus=2, created_s=30),
                req("r2", gpus=2, created_s=20),
                req("r3", gpus=2, created_s=10),
            ],
        ),
        {"r1": "admit:fits", "r2": "admit:fits", "r3": "wait:no-capacity"},
    ),
    # Kueue: "...two small workloads after a big one finishes" (the big one is gone from running)
    "two small after the big one finished": Case(
        snapshot([node("n1", gpus=4)], pending=[req("s1", gpus=2), req("s2", gpus=2, created_s=1)]),
        {"s1": "admit:fits", "s2": "admit:fits"},
    ),
    "waits while the big one runs": Case(
        snapshot(
            [node("n1", gpus=4)],
            pending=[req("s1", gpus=2)],
            running=[run("big", devices=range(4))],
        ),
        {"s1": "wait:no-capacity"},
    ),
    # Kueue: "Should start workloads that are under min quota before borrowing"
    "under nominal goes before borrowing": Case(
        snapshot(
            [node("n1", gpus=4)],
            pending=[
                req("b1", team="b", gpus=2, created_s=100),
                req("a1", team="a", gpus=2, created_s=1),
            ],
            running=[run("b0", team="b", devices=(0, 1))],
            quotas=[quota("a", 2), quota("b", 2)],
        ),
        {"a1": "admit:fits", "b1": "wait:cohort-exhausted"},
    ),
    "borrows unused nominal": Case(
        snapshot(
            [node("n1", gpus=4)], pending=[req("a1", gpus=3)], quotas=[quota("a", 2), quota("b", 2)]
        ),
        {"a1": "admit:borrows"},
    ),
    "borrowing limit": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("a1", gpus=4)],
            quotas=[quota("a", 2, borrow=1), quota("b", 6)],
        ),
        {"a1": "wait:borrowing-limit"},
    ),
    "lending limit": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("a1", gpus=5)],
            quotas=[quota("a", 2), quota("b", 6, lend=2)],
        ),
        {"a1": "wait:cohort-exhausted"},
    ),
    "lending limit leaves the rest": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("a1", gpus=4)],
            quotas=[quota("a", 2), quota("b", 6, lend=2)],
        ),
        {"a1": "admit:borrows"},
    ),
    "floor never lent to non-preemptible work": Case(
        snapshot(
            [node("n1", gpus=8)],
            pools=[pool(floor=4)],
            pending=[req("i1", cls="interactive", gpus=5)],
        ),
        {"i1": "wait:inference-floor"},
    ),
    "preemptible training may use the floor": Case(
        snapshot([node("n1", gpus=8)], pools=[pool(floor=4)], pending=[req("t1", gpus=8)]),
        {"t1": "admit:fits"},
    ),
    "inference takes the floor back": Case(
        snapshot(
            [node("n1", gpus=8)],
            pools=[pool(floor=4)],
            pending=[req("inf", cls="inference", gpus=2)],
            running=[run("t1", devices=range(8))],
        ),
        {"inf": "wait:preempting"},
        preempted=["t1#1"],
    ),
    "canary only by name": Case(
        snapshot(
            [node("c1", pool="canary", gpus=4)],
            pools=[pool("canary", lifecycle=Lifecycle.CANARY)],
            pending=[req("any", gpus=1), req("named", gpus=1, pool="canary", created_s=1)],
        ),
        {"any": "reject:never-fits", "named": "admit:fits"},
    ),
    "maintenance never": Case(
        snapshot(
            [node("m1", pool="old", gpus=4)],
            pools=[pool("old", lifecycle=Lifecycle.MAINTENANCE)],
            pending=[req("named", pool="old")],
        ),
        {"named": "wait:pool-maintenance"},
    ),
    "unknown pool and class": Case(
        snapshot(pending=[req("p", pool="nope"), req("c", cls="nope")]),
        {"p": "reject:unknown-pool", "c": "reject:unknown-class"},
    ),
    "never fits": Case(
        snapshot([node("n1", gpus=4)], pending=[req("big", gpus=8)]), {"big": "reject:never-fits"}
    ),
    "a shape only an autoscaled pool's new nodes could hold waits for them": Case(
        replace(
            snapshot([node("n1", gpus=4)], pending=[req("big", gpus=8), req("huge", gpus=16)]),
            growth=(node("grow-1", gpus=8),),
        ),
        {"big": "wait:awaiting-nodes", "huge": "reject:never-fits"},
    ),
    "gang all or nothing": Case(
        snapshot(
            TWO_NODES,
            pending=[req("g", gpus=4, pods=2, created_s=10), req("s", gpus=1)],
            running=[run("x", node="n2", devices=(0,))],
        ),
        {"g": "wait:no-capacity", "s": "admit:fits"},
        policy=rules(max_reservations=0),
    ),
    "gang spans nodes": Case(
        snapshot(TWO_NODES, pending=[req("g", gpus=4, pods=2)]), {"g": "admit:fits"}
    ),
    "backoff holds a requeued request": Case(
        snapshot(pending=[req("r", not_before_s=30)]), {"r": "wait:backoff"}
    ),
    # Kueue: "Should issue preemption exactly once for each preempted workload"
    "reclaim borrowed capacity, each victim once": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("a1", team="a", gpus=4)],
            running=[run(f"b{i}", team="b", devices=(i,)) for i in range(8)],
            quotas=[quota("a", 4), quota("b", 4)],
        ),
        {"a1": "wait:preempting"},
        preempted=["b0#1", "b1#1", "b2#1", "b3#1"],
    ),
    "no reclaim from a team within its nominal": Case(
        snapshot(
            TWO_NODES,
            pending=[req("a1", team="a", gpus=4)],
            running=[run("b1", team="b", node="n1"), run("b2", team="b", node="n2")],
            quotas=[quota("a", 4), quota("b", 4)],
        ),
        {"a1": "wait:no-capacity"},
        preempted=[],
        policy=rules(max_reservations=0),
    ),
    "borrowing requests do not preempt": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("a1", team="a", gpus=4)],
            running=[run(f"b{i}", team="b", devices=(i,)) for i in range(8)],
            quotas=[quota("a", 2), quota("b", 6)],
        ),
        {"a1": "wait:cohort-exhausted"},
        preempted=[],
    ),
    "minimum runtime protects": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("a1", team="a", gpus=1)],
            running=[run("b0", team="b", devices=(0, 1), age_s=10)],
            quotas=[quota("a", 1), quota("b", 1)],
            classes=[
                *snapshot().classes[:2],
                replace(snapshot().classes[2], min_runtime_s=600),
            ],
        ),
        {"a1": "wait:no-capacity"},
        preempted=[],
    ),
    "prefers the victim with a recent checkpoint": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("a1", team="a", gpus=1)],
            running=[
                run("old", team="b", devices=(0,), checkpoint_age_s=3000),
                run("fresh", team="b", devices=(1,), checkpoint_age_s=60),
            ],
            quotas=[quota("a", 1), quota("b", 0)],
        ),
        {"a1": "wait:preempting"},
        preempted=["fresh#1"],
    ),
    "victims that would lose too much work are spared": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("a1", team="a", gpus=1)],
            running=[run("long", team="b", devices=(0, 1), age_s=7200)],
            quotas=[quota("a", 1), quota("b", 1)],
        ),
        {"a1": "wait:no-capacity"},
        preempted=[],
        policy=rules(max_victim_loss_gpu_s=3600),
    ),
    "preemption cap per tick": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("a1", team="a", gpus=4)],
            running=[run(f"b{i}", team="b", devices=(i,)) for i in range(8)],
            quotas=[quota("a", 4), quota("b", 4)],
        ),
        {"a1": "wait:no-capacity"},
        preempted=[],
        policy=rules(max_preemptions_per_tick=3),
    ),
    "lower band of the same team": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("hi", cls="interactive", gpus=2)],
            running=[run("lo", devices=(0, 1))],
        ),
        {"hi": "wait:preempting"},
        preempted=["lo#1"],
    ),
    # Kueue fair sharing: "should not cause an infinite preemption cycle"
    "no preemption cycle": Case(
        snapshot(
            [node("n1", gpus=4)],
            pending=[req("b1", team="b", gpus=2)],
            running=[run("a1", team="a", devices=(0, 1, 2, 3), by_preemption=True)],
            quotas=[quota("a", 2), quota("b", 2)],
        ),
        {"b1": "wait:no-capacity"},
        preempted=[],
    ),
    "stopping victims are not preempted twice": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("a1", team="a", gpus=4)],
            running=[run(f"b{i}", team="b", devices=(i,), stopping=i >= 4) for i in range(8)],
            quotas=[quota("a", 4), quota("b", 4)],
        ),
        {"a1": "wait:awaiting-stop"},
        preempted=[],
    ),
    "large request reserves a node": Case(
        snapshot(
            TWO_NODES,
            pending=[
                req("big", gpus=4, created_s=100),
                req("s1", gpus=1, created_s=2),
                req("s2", gpus=1),
            ],
            running=[run("x", node="n1", devices=(0,)), run("y", node="n2", devices=(0, 1, 2))],
        ),
        {"big": "wait:no-capacity", "s1": "admit:fits", "s2": "wait:no-capacity"},
    ),
    "without reservations small jobs backfill": Case(
        snapshot(
            TWO_NODES,
            pending=[
                req("big", gpus=4, created_s=100),
                req("s1", gpus=1, created_s=2),
                req("s2", gpus=1),
            ],
            running=[run("x", node="n1", devices=(0,)), run("y", node="n2", devices=(0, 1, 2))],
        ),
        {"big": "wait:no-capacity", "s1": "admit:fits", "s2": "admit:fits"},
        policy=rules(max_reservations=0),
    ),
}


class ScheduleScenarioTest(unittest.TestCase):
    def test_it_follows_each_rule(self) -> None:
        for name, case in CASES.items():
            with self.subTest(name):
                decisions = schedule(case.snap, policy=case.policy)
                got = outcome(decisions)
                self.assertEqual({k: got.get(k) for k in case.want}, case.want)
                if case.preempted is not None:
                    self.assertEqual(by_kind(decisions, DecisionKind.PREEMPT), case.preempted)
                self.assertEqual(len(got), len(case.snap.pending))


class OrderTest(unittest.TestCase):
    def order(self, snap: Snapshot, policy: Policy | None = None) -> list[str]:
        decisions = schedule(snap, policy=policy)
        return [d.request_id for d in sorted(decisions, key=lambda d: d.position)]

    def test_it_orders_by_band_then_share_then_age_then_id(self) -> None:
        nodes = [node("n1", gpus=1)]
        cases = {
            "band first": ([req("t", created_s=100), req("i", cls="interactive")], {}, ["i", "t"]),
            "older first": ([req("new", created_s=1), req("old", created_s=9)], {}, ["old", "new"]),
            "id breaks ties": ([req("b"), req("a")], {}, ["a", "b"]),
            "lower decayed usage first": (
                [req("heavy", team="a", created_s=9), req("light", team="b")],
                {"a": 10**12},
                ["light", "heavy"],
            ),
            "priority inside the band": (
                [req("lo", created_s=9), req("hi", priority=5)],
                {},
                ["hi", "lo"],
            ),
            "priority never crosses a band": (
                [req("t", priority=10**6), req("i", cls="interactive", priority=-(10**6))],
                {},
                ["i", "t"],
            ),
        }
        for name, (pending, usage, want) in cases.items():
            with self.subTest(name):
                self.assertEqual(self.order(snapshot(nodes, pending=pending, usage=usage)), want)

    def test_it_re_ranks_a_team_after_each_admission(self) -> None:
        pending = [
            req("a1", team="a", created_s=9),
            req("a2", team="a", created_s=8),
            req("b1", team="b"),
        ]
        self.assertEqual(
            self.order(snapshot([node("n1", gpus=8)], pending=pending)), ["a1", "b1", "a2"]
        )

    def test_it_escalates_near_the_maximum_queue_time(self) -> None:
        pending = [
            req("young", cls="interactive", created_s=10),
            req("old", cls="interactive", created_s=3500),
        ]
        decisions = {
            d.request_id: d for d in schedule(snapshot([node("n1", gpus=0)], pending=pending))
        }
        self.assertTrue(decisions["old"].escalated)
        self.assertFalse(decisions["young"].escalated)


class ReservationTest(unittest.TestCase):
    def test_the_oldest_qualifying_request_holds_the_reservation(self) -> None:
        # Team a holds a lot, so b's younger request comes first in queue order; the
        # reservation still goes to a's older one, so its nodes keep draining.
        snap = snapshot(
            TWO_NODES,
            pending=[req("old", team="a", gpus=4, created_s=900), req("young", team="b", gpus=4)],
            running=[
                run("x", team="a", node="n1", devices=(0,)),
                run("y", team="a", node="n2", devices=(0, 1)),
            ],
        )
        decisions = {d.request_id: d for d in schedule(snap, policy=rules(max_reservations=1))}
        self.assertLess(decisions["young"].position, decisions["old"].position)
        self.assertEqual(decisions["old"].facts["reserved_nodes"], ["n1"])
        self.assertNotIn("reserved_nodes", decisions["young"].facts)

    def test_a_large_borrower_blocked_by_quota_holds_lendable_quota(self) -> None:
        snap = snapshot(
            [node("n1", gpus=8)],
            pending=[req("big", team="a", gpus=4, created_s=900), req("small", team="b", gpus=1)],
            running=[
                run("a0", team="a", devices=(0, 1)),
                run("b0", team="b", devices=(2, 3, 4, 5)),
            ],
            quotas=[quota("a", 2), quota("b", 2), quota("c", 4)],
        )
        self.assertEqual(
            outcome(schedule(snap, policy=rules(max_reservations=0)))["small"], "admit:borrows"
        )
        decisions = {d.request_id: d for d in schedule(snap)}
        self.assertEqual(decisions["small"].code, "cohort-exhausted")
        self.assertIn("held for it", decisions["big"].message)


class ExplainTest(unittest.TestCase):
    def test_it_says_why_in_words(self) -> None:
        snap = snapshot(
            [node("n1", pool="a100", gpus=32)],
            pending=[req("v1", team="vision", gpus=4)],
            running=[
                run("v0", team="vision", devices=range(16)),
                run("n0", team="nlp", devices=range(16, 32)),
            ],
            quotas=[quota("vision", 16, borrow=0), quota("nlp", 16)],
            teams=("vision", "nlp"),
        )
        (d,) = schedule(snap)
        self.assertEqual(d.code, "borrowing-limit")
        self.assertEqual(
            d.message,
            "waiting: team vision uses 16 of 16 guaranteed GPUs in pool a100 and may borrow 0 more",
        )

    def test_a_team_under_its_guarantee_is_told_what_it_may_borrow_beyond_it(self) -> None:
        # 2 of 4 guaranteed in use and a borrowing limit of 4: 6 more GPUs in all, of which
        # 4 borrowed ("may borrow 6 more" read as 6 beyond the guarantee: 8 would fit).
        snap = snapshot(
            [node("n1", pool="a100", gpus=16)],
            pending=[req("s1", team="speech", gpus=8)],
            running=[run("s0", team="speech", devices=range(2))],
            quotas=[quota("speech", 4, borrow=4), quota("nlp", 12)],
            teams=("speech", "nlp"),
        )
        (d,) = schedule(snap)
        self.assertEqual(d.code, "borrowing-limit")
        self.assertEqual(
            d.message,
            "waiting: team speech uses 2 of 4 guaranteed GPUs in pool a100 and may borrow 4 "
            "beyond them: 6 more in all",
        )

    def test_reclaim_names_the_borrower(self) -> None:
        decisions = schedule(
            CASES["reclaim borrowed capacity, each victim once"].snap, policy=rules()
        )
        wait = next(d for d in decisions if d.kind is DecisionKind.WAIT)
        self.assertEqual(
            wait.message,
            "waiting: 4 GPUs lent to b will be reclaimed; it starts once they have stopped",
        )
        preempt = next(d for d in decisions if d.kind is DecisionKind.PREEMPT)
        self.assertEqual(preempt.facts["preemptor"], "a1")
        self.assertEqual(preempt.code, "reclaim")


class DeterminismTest(unittest.TestCase):
    def test_same_input_same_output(self) -> None:
        for name, case in CASES.items():
            with self.subTest(name):
                first: list[Decision] = schedule(case.snap, NOW, case.policy)
                self.assertEqual(first, schedule(case.snap, NOW, case.policy))
