"""Preemption, table-driven in Kueue's terms: ClusterQueue ↔ team, flavor ↔ pool,
priority ↔ class band, cohort ↔ the teams with a quota row in one pool.

Cases named "Kueue: …" port a case of Kueue's `TestPreemption`
(pkg/scheduler/preemption/preemption_test.go) or `TestSchedule`
(pkg/scheduler/scheduler_test.go) with the same quantities (Kueue's CPUs become GPUs).
The ClusterQueues there use `withinClusterQueue: LowerPriority` and
`reclaimWithinCohort: Any`, as Quartermaster does. Differences from Kueue are in
docs/scheduling.md ("Differences from Kueue").
"""

from __future__ import annotations

import unittest
from dataclasses import dataclass, field, replace

from scheduling import preemption, schedule
from scheduling.explain import Code
from scheduling.quota import QuotaBook
from scheduling.types import (
    DecisionKind,
    DeviceGrant,
    Placement,
    PodPlacement,
    Policy,
    PreemptionPolicy,
    Running,
    Snapshot,
    Taint,
    WorkloadClass,
)
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

#: Kueue's priorities -1, 0, 1 as class bands; every class may be preempted
PRIO = (
    WorkloadClass("low", band=10, preemption=PreemptionPolicy.ALWAYS),
    WorkloadClass("mid", band=20, preemption=PreemptionPolicy.ALWAYS),
    WorkloadClass("high", band=30, preemption=PreemptionPolicy.ALWAYS),
)


@dataclass
class Case:
    snap: Snapshot
    want: dict[str, str]
    #: attempt ids preempted, as a set (Kueue's wantPreempted)
    preempted: set[str] = field(default_factory=set)
    policy: Policy = field(default_factory=rules)


def standalone(*running: tuple[str, str, int], gpus: int = 6) -> tuple[object, ...]:
    """Kueue's "standalone" ClusterQueue: team a, nominal 6, no cohort to borrow from."""
    runs = []
    at = 0
    for name, cls, n in running:
        runs.append(run(name, team="a", cls=cls, devices=range(at, at + n)))
        at += n
    return ([node("n1", gpus=gpus)], runs, [quota("a", 6)])


def _standalone_case(
    running: list[tuple[str, str, int]], incoming: tuple[str, int], want: str, victims: set[str]
) -> Case:
    nodes, runs, quotas = standalone(*running)
    cls, n = incoming
    return Case(
        snapshot(
            nodes,  # type: ignore[arg-type]
            pending=[req("in", team="a", cls=cls, gpus=n)],
            running=runs,  # type: ignore[arg-type]
            quotas=quotas,  # type: ignore[arg-type]
            classes=PRIO,
        ),
        {"in": want},
        victims,
    )


#: two requests past their starvation bound, one node full of the same band started later
TWO_STARVING = snapshot(
    [node("n1", gpus=2)],
    pending=[
        req("in", team="a", gpus=2, created_s=86400),
        req("in2", team="c", gpus=2, created_s=86400),
    ],
    running=[run("b0", team="b", devices=(0, 1))],
)

#: one request past its starvation bound in a queue of five asking 6 GPUs of a 2-GPU pool
DEEP_QUEUE = snapshot(
    [node("n1", gpus=2)],
    pending=[
        req("in", team="a", gpus=2, created_s=86400),
        *(req(f"young{i}", team="c", gpus=1, created_s=60 + i) for i in range(4)),
    ],
    running=[run("b0", team="b", devices=(0, 1))],
)

CASES: dict[str, Case] = {
    # -- Kueue TestPreemption, withinClusterQueue: LowerPriority ----------------------------
    "Kueue: preempt lowest priority": _standalone_case(
        [("low", "low", 2), ("mid", "mid", 2), ("high", "high", 2)],
        ("high", 2),
        "wait:preempting",
        {"low#1"},
    ),
    "Kueue: preempt multiple": _standalone_case(
        [("low", "low", 2), ("mid", "mid", 2), ("high", "high", 2)],
        ("high", 3),
        "wait:preempting",
        {"low#1", "mid#1"},
    ),
    "Kueue: no preemption for low priority": _standalone_case(
        [("low", "low", 3), ("mid", "mid", 3)], ("low", 1), "wait:cohort-exhausted", set()
    ),
    "Kueue: not enough low priority workloads": _standalone_case(
        [("low", "low", 3), ("mid", "mid", 3)], ("mid", 4), "wait:cohort-exhausted", set()
    ),
    "Kueue: some free quota, preempt low priority": _standalone_case(
        [("low", "low", 1), ("mid", "mid", 1), ("high", "high", 3)],
        ("high", 2),
        "wait:preempting",
        {"low#1"},
    ),
    "Kueue: minimal set excludes low priority": _standalone_case(
        [("low", "low", 1), ("mid", "mid", 2), ("high", "high", 3)],
        ("high", 2),
        "wait:preempting",
        {"mid#1"},
    ),
    # -- Kueue TestPreemption, reclaimWithinCohort: Any --------------------------------------
    # c1 (a) nominal 6 runs c1-low 3; c2 (b) nominal 6 runs c2-mid 3 and c2-high 6 (borrows 3)
    "Kueue: reclaim quota from borrower": Case(
        snapshot(
            [node("n1", gpus=12)],
            pending=[req("in", team="a", cls="high", gpus=3)],
            running=[
                run("c1-low", team="a", cls="low", devices=range(3)),
                run("c2-mid", team="b", cls="mid", devices=range(3, 6)),
                run("c2-high", team="b", cls="high", devices=range(6, 12)),
            ],
            quotas=[quota("a", 6, borrow=6), quota("b", 6, borrow=6)],
            classes=PRIO,
        ),
        {"in": "wait:preempting"},
        {"c2-mid#1"},
    ),
    # Kueue takes a borrower's workloads only while its ClusterQueue still borrows.
    "Kueue: reclaim only what is borrowed": Case(
        snapshot(
            [node("n1", gpus=4)],
            pending=[req("in", team="a", gpus=2)],
            running=[run(f"b{i}", team="b", devices=(i,)) for i in range(3)],
            quotas=[quota("a", 2), quota("b", 2)],
        ),
        {"in": "wait:preempting"},
        {"b0#1"},
    ),
    # ... but the last victim may take the borrower below nominal (documented, as Kueue).
    "reclaim may end below nominal by one attempt": Case(
        snapshot(
            [node("n1", gpus=4)],
            pending=[req("in", team="a", gpus=2)],
            running=[run("b3", team="b", devices=(0, 1, 2))],
            quotas=[quota("a", 2), quota("b", 2)],
        ),
        {"in": "wait:preempting"},
        {"b3#1"},
    ),
    # Kueue: c1 (a) nominal 6 runs c1-low 3 and c1-mid 2; c2 (b) nominal 6 runs c2-low 3 and
    # c2-mid 4 (borrows 1). a's 4 must preempt its own low to get back within nominal *and*
    # b's borrowed low for room.
    "Kueue: preempt from all ClusterQueues in cohort": Case(
        snapshot(
            [node("n1", gpus=12)],
            pending=[req("in", team="a", cls="mid", gpus=4)],
            running=[
                run("c1-low", team="a", cls="low", devices=range(3)),
                run("c1-mid", team="a", cls="mid", devices=range(3, 5)),
                run("c2-low", team="b", cls="low", devices=range(5, 8)),
                run("c2-mid", team="b", cls="mid", devices=range(8, 12)),
            ],
            quotas=[quota("a", 6, borrow=6), quota("b", 6, borrow=6)],
            classes=PRIO,
        ),
        {"in": "wait:preempting"},
        {"c1-low#1", "c2-low#1"},
    ),
    # Kueue TestSchedule: other-alpha (a) and other-beta (b), nominal 2 each, run a1 and b1
    # (priority -1, 1 each); a's 3 would borrow even after preempting a1, so it preempts
    # nothing: borrowed capacity is best effort, no one loses work so that a team borrows.
    "Kueue: only a request that fits fully within nominal quota preempts": Case(
        snapshot(
            [node("n1", gpus=4)],
            pending=[req("in", team="a", cls="high", gpus=3)],
            running=[
                run("a1", team="a", cls="low", devices=(0,)),
                run("b1", team="b", cls="low", devices=(1,)),
            ],
            quotas=[quota("a", 2), quota("b", 2)],
            classes=PRIO,
        ),
        {"in": "wait:cohort-exhausted"},
        set(),
    ),
    # The same rule when quota admits the borrower and only devices are missing.
    "a borrower does not preempt its own lower band for devices": Case(
        snapshot(
            [node("n1", gpus=5)],
            pending=[req("in", team="a", cls="high", gpus=3)],
            running=[
                run("a1", team="a", cls="low", devices=(0, 1)),
                run("x", team="c", cls="high", devices=(2, 3)),
            ],
            quotas=[quota("a", 2), quota("b", 6)],
            classes=PRIO,
        ),
        {"in": "wait:no-capacity"},
        set(),
    ),
    # -- issue defect a: own lower band while at or over nominal ----------------------------
    "own lower band at nominal (withinClusterQueue: LowerPriority)": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("in", team="a", cls="interactive", gpus=2)],
            running=[
                *[run(f"a{i}", team="a", devices=(i,), age_s=3600 - i) for i in range(4)],
                *[run(f"b{i}", team="b", devices=(4 + i,)) for i in range(4)],
            ],
            quotas=[quota("a", 4), quota("b", 4)],
        ),
        {"in": "wait:preempting"},
        {"a3#1", "a2#1"},
    ),
    "own lower band frees quota, not devices": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("in", team="a", cls="interactive", gpus=2)],
            running=[run(f"a{i}", team="a", devices=(i,), age_s=3600 - i) for i in range(4)],
            quotas=[quota("a", 4), quota("b", 4, lend=0)],
        ),
        {"in": "wait:preempting"},
        {"a3#1", "a2#1"},
    ),
    # -- issue defect b: a quota-blocked borrower's reservation does not block reclaim -------
    "reservation of a quota-blocked borrower does not stop a reclaim": Case(
        snapshot(
            [node("n1", gpus=4), node("n2", gpus=4)],
            pending=[
                req("big", team="b", gpus=4, priority=10, created_s=600),
                req("in", team="c", gpus=2),
            ],
            running=[
                *[run(f"b{i}", team="b", node="n1", devices=(i,), age_s=7200) for i in range(4)],
                *[run(f"a{i}", team="a", node="n2", devices=(i,), age_s=600) for i in range(4)],
            ],
            quotas=[quota("a", 4), quota("b", 2), quota("c", 2)],
        ),
        {"big": "wait:cohort-exhausted", "in": "wait:preempting"},
        {"b0#1", "b1#1"},
    ),
    # -- a preemption is never wasted against the inference floor ---------------------------
    "no preemption the floor would refuse afterwards": Case(
        snapshot(
            # n2's two devices count for quota but the request does not tolerate its taint
            [node("n1", gpus=8), node("n2", gpus=2, taints=(Taint("gpu", "reserved"),))],
            pools=[pool(floor=4)],
            pending=[req("in", team="a", cls="interactive", gpus=2)],
            running=[
                run("b0", team="b", cls="interactive", devices=(0, 1)),
                run("a0", team="a", devices=(2, 3)),
                run("c0", team="c", cls="interactive", devices=(4, 5, 6, 7)),
            ],
            quotas=[quota("a", 3), quota("b", 2)],
        ),
        {"in": "wait:no-capacity"},
        set(),
        rules(max_reservations=0),
    ),
    # -- the starvation bound: 0.99 of its class's maximum queue time, the same band too -
    "starving request preempts the same band": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("in", team="a", gpus=2, created_s=86400)],
            running=[run("b0", team="b", devices=(0, 1))],
        ),
        {"in": "wait:preempting"},
        {"b0#1"},
    ),
    "before its starvation bound (0.99 of 86,400 s) it does not": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("in", team="a", gpus=2, created_s=85000)],
            running=[run("b0", team="b", devices=(0, 1))],
        ),
        {"in": "wait:no-capacity"},
        set(),
    ),
    "a starving request spares its band's older work": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("in", team="a", gpus=2, created_s=86400)],
            running=[run("b0", team="b", devices=(0, 1), age_s=90000)],
        ),
        {"in": "wait:no-capacity"},
        set(),
    ),
    "a starving request never takes a higher band": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("in", team="a", gpus=2, created_s=86400)],
            running=[run("b0", team="b", cls="interactive", devices=(0, 1))],
        ),
        {"in": "wait:no-capacity"},
        set(),
    ),
    # More requests starving in a pool than may hold reservations: the pool is overloaded,
    # and preempting for the starving ones would only move the wait to their victims.
    "an overloaded pool preempts for no starving request": Case(
        TWO_STARVING,
        {"in": "wait:no-capacity", "in2": "wait:no-capacity"},
        set(),
        rules(max_reservations=1),
    ),
    "as many starving as may hold reservations still preempt": Case(
        TWO_STARVING,
        {"in": "wait:preempting"},
        {"b0#1"},
        rules(max_reservations=2),
    ),
    # A queue deeper than the reservations, asking half the pool's GPUs or more: the pool
    # is overloaded though one request starves.
    "a deep queue overloads the pool: its starving request does not preempt": Case(
        DEEP_QUEUE,
        {"in": "wait:no-capacity"},
        set(),
        rules(max_reservations=4, overload_queue_ratio=0.5),
    ),
    "a queue no deeper than the reservations does not": Case(
        DEEP_QUEUE,
        {"in": "wait:preempting"},
        {"b0#1"},
        rules(max_reservations=5, overload_queue_ratio=0.5),
    ),
    "nor one asking less than the ratio of the pool's GPUs": Case(
        DEEP_QUEUE,
        {"in": "wait:preempting"},
        {"b0#1"},
        rules(max_reservations=4, overload_queue_ratio=4.0),
    ),
    "nor any queue with the ratio off": Case(
        DEEP_QUEUE,
        {"in": "wait:preempting"},
        {"b0#1"},
        rules(max_reservations=4, overload_queue_ratio=0),
    ),
    # -- a victim's loss in proportion to its preemptor's GPUs (900 GPU-seconds per GPU) ---
    "a 1-GPU request may not cost a victim 1,000 GPU-seconds": Case(
        snapshot(
            [node("n1", gpus=1)],
            pending=[req("in", team="a", cls="high", gpus=1)],
            running=[run("low", team="b", cls="low", devices=(0,), age_s=1000)],
            classes=PRIO,
        ),
        {"in": "wait:no-capacity"},
        set(),
        rules(victim_loss_per_gpu_s=900),
    ),
    "a 2-GPU request may": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("in", team="a", cls="high", gpus=2)],
            running=[
                run("low", team="b", cls="low", devices=(0,), age_s=1000),
                run("low2", team="b", cls="low", devices=(1,), age_s=100),
            ],
            classes=PRIO,
        ),
        {"in": "wait:preempting"},
        {"low#1", "low2#1"},
        rules(victim_loss_per_gpu_s=900),
    ),
    "the fixed cap still bounds a large request": Case(
        snapshot(
            [node("n1", gpus=2)],
            pending=[req("in", team="a", cls="high", gpus=2)],
            running=[run("low", team="b", cls="low", devices=(0, 1), age_s=1000)],
            classes=PRIO,
        ),
        {"in": "wait:no-capacity"},
        set(),
        rules(victim_loss_per_gpu_s=900, max_victim_loss_gpu_s=1500),
    ),
}

#: the shipped victim-loss cap (7,200 GPU-seconds) and loss budget (1× the GPU-time waited)
CAPPED = rules(max_victim_loss_gpu_s=7200, starving_loss_ratio=1.0)


def _budget_case(
    running: list[Running],
    want: str,
    victims: set[str],
    waited_s: int = 3700,
    policy: Policy = CAPPED,
    nodes: int = 1,
    attempts: int = 0,
) -> Case:
    """An 8-GPU interactive request of team a (`max_queue_s` 3,600 s) that waited
    `waited_s` on 8-GPU nodes n1… full of `running`."""
    pending = replace(req("in", cls="interactive", gpus=8, created_s=waited_s), attempts=attempts)
    return Case(
        snapshot(
            [node(f"n{i + 1}", gpus=8) for i in range(nodes)], pending=[pending], running=running
        ),
        {"in": want},
        victims,
        policy,
    )


#: n1 full of training (band 100): t0 never checkpointed (4 GPUs × 3,000 s = 12,000
#: GPU-seconds lost if stopped, above the 7,200 cap), f has just checkpointed
UNSAVED = [
    run("t0", team="b", devices=range(4), age_s=3000),
    run("f", team="b", devices=range(4, 8), checkpoint_age_s=0),
]

# -- the loss budget past the starvation bound: checkpoint-aware ------------------------------
BUDGET_CASES: dict[str, Case] = {
    "past its bound it preempts work above the loss cap": _budget_case(
        UNSAVED, "wait:preempting", {"t0#1", "f#1"}
    ),
    "before its bound the loss cap protects that work": _budget_case(
        UNSAVED, "wait:no-capacity", set(), waited_s=3500
    ),
    "without a budget (ratio 0) the cap holds past the bound too": _budget_case(
        UNSAVED,
        "wait:no-capacity",
        set(),
        policy=rules(max_victim_loss_gpu_s=7200, starving_loss_ratio=0),
    ),
    "victims never lose more than the GPU-time it waited": _budget_case(
        # 4 GPUs × 8,000 s = 32,000 GPU-seconds > 8 GPUs × 3,700 s = 29,600
        [run("t0", team="b", devices=range(4), age_s=8000), UNSAVED[1]],
        "wait:no-capacity",
        set(),
    ),
    "the whole set counts against the budget": _budget_case(
        # 2 × 4 GPUs × 4,000 s = 32,000 GPU-seconds in all, each one within 29,600
        [
            run("t0", team="b", devices=range(4), age_s=4000),
            run("t1", team="c", devices=range(4, 8), age_s=4000),
        ],
        "wait:no-capacity",
        set(),
    ),
    "it grows with the wait": _budget_case(
        [
            run("t0", team="b", devices=range(4), age_s=4000),
            run("t1", team="c", devices=range(4, 8), age_s=4000),
        ],
        "wait:preempting",
        {"t0#1", "t1#1"},
        waited_s=4100,
    ),
    "never inference, whatever the wait": _budget_case(
        [
            run("i0", team="b", cls="inference", devices=range(4), age_s=60),
            UNSAVED[1],
        ],
        "wait:no-capacity",
        set(),
        waited_s=20000,
    ),
    "it prefers the node whose victims checkpointed last": _budget_case(
        # n1's attempt loses 8 × 3,000 = 24,000 GPU-seconds, n2's 8 × 1,000 = 8,000
        [
            run("t1", team="b", node="n1", devices=range(8), age_s=7200, checkpoint_age_s=3000),
            run("t2", team="c", node="n2", devices=range(8), age_s=7200, checkpoint_age_s=1000),
        ],
        "wait:preempting",
        {"t2#1"},
        nodes=2,
    ),
    "past its bound it takes a notebook of its band that started after it": _budget_case(
        # interactive work never checkpoints: 8 GPUs × 3,000 s = 24,000 GPU-seconds
        [run("nb", team="b", cls="interactive", devices=range(8), age_s=3000)],
        "wait:preempting",
        {"nb#1"},
    ),
    "a notebook within its team's quota stays protected": Case(
        snapshot(
            [node("n1", gpus=8)],
            pending=[req("in", cls="interactive", gpus=8, created_s=3700)],
            running=[run("nb", team="b", cls="interactive", devices=range(8), age_s=3000)],
            quotas=[quota("a", 8), quota("b", 8)],
        ),
        {"in": "wait:no-capacity"},
        set(),
        rules(max_victim_loss_gpu_s=7200, starving_loss_ratio=1.0, max_reservations=0),
    ),
    "a retry keeps the fixed cap (no chain of preemptions)": _budget_case(
        UNSAVED, "wait:no-capacity", set(), attempts=1
    ),
}
CASES.update(BUDGET_CASES)


class PreemptionTableTest(unittest.TestCase):
    def test_cases(self) -> None:
        for name, case in CASES.items():
            with self.subTest(name):
                decisions = schedule(case.snap, policy=case.policy)
                got = outcome(decisions)
                self.assertEqual({k: got.get(k) for k in case.want}, case.want)
                self.assertEqual(set(by_kind(decisions, DecisionKind.PREEMPT)), case.preempted)


class RoomKeptTest(unittest.TestCase):
    def test_the_preemptor_gets_the_room_its_victims_freed(self) -> None:
        # Tick after a reclaim: the victims are gone, two devices are free. A request of a
        # higher band arrives; the preemptor still gets the room (no second preemption).
        snap = snapshot(
            [node("n1", gpus=4)],
            pending=[
                req("pre", team="a", gpus=2, created_s=60, preempting=True),
                req("hi", team="c", cls="interactive", gpus=2),
            ],
            running=[run("b0", team="b", devices=(0, 1))],
            quotas=[quota("a", 2), quota("b", 2)],
        )
        decisions = schedule(snap)
        self.assertEqual(outcome(decisions)["pre"], "admit:fits")
        self.assertEqual(by_kind(decisions, DecisionKind.PREEMPT), [])

    def test_a_firm_reservation_does_not_take_the_room_either(self) -> None:
        # The same room, and a request past its starvation bound: its reservation is firm
        # and made before the pass, but not on the room a preemptor's victims freed.
        snap = snapshot(
            [node("n1", gpus=4), node("n2", gpus=4)],
            pending=[
                req("pre", team="a", gpus=2, created_s=60, preempting=True),
                req("starving", team="c", cls="interactive", gpus=4, created_s=4000),
            ],
            running=[
                run("b0", team="b", devices=(0, 1)),
                run("i0", team="c", cls="inference", node="n2", devices=range(4)),
            ],
            quotas=[quota("a", 2), quota("b", 2), quota("c", 8)],
        )
        decisions = schedule(snap)
        self.assertEqual(outcome(decisions)["pre"], "admit:fits")
        self.assertEqual(by_kind(decisions, DecisionKind.PREEMPT), [])


class ReservationFitTest(unittest.TestCase):
    """Reservations hold only nodes that could host one pod: memory and taints too."""

    def reserved(self, snap: Snapshot) -> list[str]:
        d = {x.request_id: x for x in schedule(snap)}["big"]
        return list(d.facts.get("reserved_nodes", []))  # type: ignore[call-overload]

    def test_memory(self) -> None:
        snap = snapshot(
            [node("n1", gpus=4, memory_gib=64), node("n2", gpus=4, memory_gib=1024)],
            pending=[req("big", gpus=4, memory_gib=512)],
            running=[
                run("x", node="n1", devices=(0,), age_s=9000),
                run("y", node="n2", devices=(0,), age_s=60),
            ],
        )
        self.assertEqual(self.reserved(snap), ["n2"])

    def test_taints(self) -> None:
        taint = Taint("dedicated", "inference")
        snap = snapshot(
            [node("n1", gpus=4, taints=(taint,)), node("n2", gpus=4)],
            pending=[req("big", gpus=4)],
            running=[
                run("x", node="n1", devices=(0,), age_s=9000),
                run("y", node="n2", devices=(0,), age_s=60),
            ],
        )
        self.assertEqual(self.reserved(snap), ["n2"])


class ShippedPolicyTest(unittest.TestCase):
    """`Policy()` is what the portal and the replay run: it waits before preempting, stops
    at most two attempts a tick and only work that checkpointed lately (profile version 6)."""

    def decide(
        self, created_s: int, per_victim: int = 2, checkpoint_age_s: int = 60
    ) -> tuple[str, list[str]]:
        victims = 8 // per_victim
        snap = snapshot(
            [node("n1", gpus=8)],
            pending=[req("a1", team="a", gpus=4, created_s=created_s)],
            running=[
                run(
                    f"b{i}",
                    team="b",
                    devices=range(i * per_victim, (i + 1) * per_victim),
                    age_s=1800,
                    checkpoint_age_s=checkpoint_age_s,
                )
                for i in range(victims)
            ],
            quotas=[quota("a", 4), quota("b", 4)],
        )
        decisions = schedule(snap, policy=Policy())
        stopped = [d.attempt_id for d in decisions if d.kind is DecisionKind.PREEMPT]
        return outcome(decisions)["a1"], stopped

    def test_it_waits_preempt_after_s_first(self) -> None:
        self.assertEqual(Policy().preempt_after_s, 300)
        self.assertEqual(self.decide(created_s=299), ("wait:no-capacity", []))
        self.assertEqual(self.decide(created_s=300), ("wait:preempting", ["b0#1", "b1#1"]))

    def test_a_victim_loses_at_most_120_gpu_seconds_per_gpu_of_the_preemptor(self) -> None:
        # 4 GPUs ask: a 2-GPU victim may lose 480 GPU-seconds, 240 s since its checkpoint
        self.assertEqual(Policy().victim_loss_per_gpu_s, 120)
        self.assertEqual(self.decide(300, checkpoint_age_s=240)[0], "wait:preempting")
        self.assertEqual(self.decide(300, checkpoint_age_s=241)[0], "wait:no-capacity")

    def test_a_plan_of_more_victims_than_two_waits_for_work_to_end(self) -> None:
        # four 1-GPU attempts to stop: more than a tick's two, so none is stopped
        self.assertEqual(Policy().max_preemptions_per_tick, 2)
        self.assertEqual(
            self.decide(300, per_victim=1, checkpoint_age_s=0), ("wait:no-capacity", [])
        )

    def test_past_its_promise_a_request_takes_the_whole_set_it_needs(self) -> None:
        # the same four victims for a request that has waited its class's max_queue_s
        # (training: a day here): the tick's one plan, whatever the rate cap
        state, stopped = self.decide(86400, per_victim=1, checkpoint_age_s=0)
        self.assertEqual(
            (state, sorted(stopped)), ("wait:preempting", ["b0#1", "b1#1", "b2#1", "b3#1"])
        )


class MixedPlanSentenceTest(unittest.TestCase):
    def test_it_says_what_is_reclaimed_and_what_is_preempted(self) -> None:
        case = CASES["Kueue: preempt from all ClusterQueues in cohort"]
        wait = {d.request_id: d for d in schedule(case.snap, policy=case.policy)}["in"]
        self.assertEqual(
            wait.message,
            "waiting: 3 GPUs lent to b will be reclaimed; 3 GPUs of a of a lower class will be "
            "preempted; it starts once they have stopped",
        )


class CandidateIndexTest(unittest.TestCase):
    """What a tick remembers about candidates answers as a fresh computation would."""

    def book_and_groups(self) -> tuple[object, dict[tuple[str, str], list[Running]]]:
        runs = [
            run("a-low", team="a", cls="low", node="n2", devices=(0, 1)),
            run("b-low", team="b", cls="low", node="n1", devices=(0,)),
            run("b-mid", team="b", cls="mid", node="n1", devices=(1, 2)),
            run("c-low", team="c", cls="low", node="n2", devices=(2,), by_preemption=True),
        ]
        book = QuotaBook(
            [pool("a100")],
            [node("n1", gpus=4), node("n2", gpus=4)],
            [quota("a", 2), quota("b", 2), quota("c", 2)],
            runs,
            {c.name: c for c in PRIO},
        ).pools["a100"]
        groups: dict[tuple[str, str], list[Running]] = {}
        for r in runs:
            groups.setdefault((r.team, r.workload_class), []).append(r)
        return book, groups

    def test_a_group_memo_gives_each_requester_what_it_would_get_without_it(self) -> None:
        book, groups = self.book_and_groups()
        classes = {c.name: c for c in PRIO}
        memo: dict[tuple[object, ...], list[preemption.Candidate]] = {}
        asks = [  # (team, band, reclaim): the same terms twice, then other sides of the bands
            ("a", 30, True),
            ("c", 30, True),
            ("a", 20, True),
            ("b", 30, False),
            ("a", 10, True),
        ]
        for team, band, reclaim in asks:
            with self.subTest(team=team, band=band):
                args = (groups, classes, book, team, band, False, reclaim, NOW)
                fresh = preemption.candidates(*args)  # type: ignore[arg-type]
                kept = preemption.candidates(*args, memo=memo)  # type: ignore[arg-type]
                self.assertEqual(kept, fresh)
        self.assertTrue(memo)
        # A group taken from the memo, not built again: the same objects.
        again = preemption.candidates(groups, classes, book, "a", 30, False, True, NOW, memo=memo)  # type: ignore[arg-type]
        first = preemption.candidates(groups, classes, book, "a", 30, False, True, NOW, memo=memo)  # type: ignore[arg-type]
        self.assertTrue(all(x is y for x, y in zip(again, first, strict=True)))

    def test_by_node_counts_what_candidates_free_per_node(self) -> None:
        two_pods = replace(
            run("g", node="n1", devices=(0,)),
            placement=Placement(
                (
                    PodPlacement("n1", (DeviceGrant("n1", 0, 1000),)),
                    PodPlacement("n1", (DeviceGrant("n1", 1, 500),)),
                )
            ),
        )
        shared = run("s", node="n0", devices=(3,), milli=0)
        cands = [
            preemption.Candidate(r, 3, Code.PRIORITY, 10, 0)
            for r in (two_pods, run("w", node="n2", devices=(0, 1)), shared)
        ]
        on = preemption.by_node(cands)
        self.assertEqual([name for name, _, _ in on], ["n0", "n1", "n2"])
        self.assertEqual(on[0][1:], ([cands[2]], 1))  # a grant of 0 milli counts 1
        # Two pods on one node: the candidate is listed per pod, each listing counts both.
        self.assertEqual(on[1][1:], ([cands[0], cands[0]], 2 * 1500))
        self.assertEqual(on[2][1:], ([cands[1]], 2000))


class OverloadSentenceTest(unittest.TestCase):
    """A request past its starvation bound that does not preempt says why."""

    def message(self, snap: Snapshot, policy: Policy) -> str:
        (wait,) = [d for d in schedule(snap, policy=policy) if d.request_id == "in"]
        self.assertEqual(
            (wait.kind, wait.code, wait.facts.get("overloaded")),
            (DecisionKind.WAIT, Code.NO_CAPACITY, True),
        )
        return wait.message

    def test_a_deep_queue(self) -> None:
        msg = self.message(DEEP_QUEUE, rules(max_reservations=4, overload_queue_ratio=0.5))
        self.assertIn(
            "it has waited its class's maximum queue time, but pool a100 is overloaded "
            "(5 requests wait there asking 3.0× its GPUs): it keeps its place by age "
            "instead of preempting",
            msg,
        )

    def test_more_starving_than_reservations(self) -> None:
        msg = self.message(TWO_STARVING, rules(max_reservations=1))
        self.assertIn(
            "pool a100 is overloaded (2 requests there have waited that long, more than the 1 "
            "that may hold nodes)",
            msg,
        )

    def test_a_request_that_preempts_says_nothing_of_it(self) -> None:
        for d in schedule(DEEP_QUEUE, policy=rules(max_reservations=5)):
            self.assertNotIn("overloaded", d.message)
            self.assertNotIn("overloaded", d.facts)
