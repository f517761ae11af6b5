"""Hypothesis: invariants of `schedule()` over random snapshots and random event sequences.

After every tick: one decision per pending request; no device slot double-booked; no
borrowing admission past `nominal + borrowing_limit` or the cohort's lendable capacity;
the inference floor kept from non-preemptible work; at most the preemption cap; and the
same input gives the same output.
"""

from __future__ import annotations

import random
import unittest
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling import schedule
from scheduling.queue import FairQueue, Resources
from scheduling.quota import QuotaBook, preemptible
from scheduling.types import (
    Decision,
    DecisionKind,
    Partitioning,
    PendingRequest,
    Policy,
    Running,
    Snapshot,
    Team,
)
from tests.scheduling.builders import CLASSES, NOW, S, node, pool, quota, req, snapshot

TEAMS = ("a", "b", "c")
CLASS_NAMES = tuple(c.name for c in CLASSES)


def random_world(rng: random.Random) -> Snapshot:
    nodes = []
    for p, part in (("x", Partitioning.EXCLUSIVE), ("y", Partitioning.TIME_SLICING)):
        for i in range(rng.randint(1, 3)):
            nodes.append(node(f"{p}{i}", pool=p, gpus=rng.choice((1, 2, 4, 8)), partitioning=part))
    quotas = []
    for p in ("x", "y"):
        for t in TEAMS:
            if rng.random() < 0.8:
                quotas.append(
                    quota(
                        t,
                        rng.randint(0, 6),
                        pool=p,
                        borrow=rng.choice((None, 0, 1, 3)),
                        lend=rng.choice((None, 0, 2)),
                    )
                )
    pools = [pool("x", floor=rng.choice((0, 0, 2))), pool("y", floor=rng.choice((0, 1)))]
    return snapshot(nodes, pools=pools, quotas=quotas, teams=TEAMS)


def random_request(rng: random.Random, n: int, now_ms: int) -> PendingRequest:
    shared = rng.random() < 0.3
    r = req(
        f"r{n}",
        team=rng.choice(TEAMS),
        gpus=1 if shared else rng.choice((1, 1, 2, 4, 8)),
        cls=rng.choice(CLASS_NAMES),
        pool=rng.choice(("", "", "x", "y")),
        milli=rng.choice((250, 500)) if shared else 1000,
        pods=rng.choice((1, 1, 1, 2)),
        priority=rng.randint(-2, 2),
    )
    created = now_ms - rng.randint(0, 4000) * S
    return PendingRequest(r.id, r.team, r.workload_class, r.shape, created, r.pool, r.priority)


class Checker(unittest.TestCase):
    def check_tick(self, snap: Snapshot, decisions: list[Decision], policy: Policy) -> None:
        own = [d.request_id for d in decisions if d.kind is not DecisionKind.PREEMPT]
        self.assertEqual(Counter(own), Counter(r.id for r in snap.pending))
        stops = [d for d in decisions if d.kind is DecisionKind.PREEMPT]
        if len(stops) > policy.max_preemptions_per_tick:
            # only a starving request's set, the tick's one plan, may be larger than the cap
            self.assertGreater(policy.max_preemptions_per_tick, 0)
            self.assertEqual(len({d.facts["preemptor"] for d in stops}), 1)
        self.check_slots(snap, decisions)
        self.check_quota(snap, decisions)
        self.assertEqual(decisions, schedule(snap, snap.now_ms, policy))

    def check_slots(self, snap: Snapshot, decisions: list[Decision]) -> None:
        milli: Counter[tuple[str, int]] = Counter()
        whole: Counter[tuple[str, int]] = Counter()
        placements = [r.placement for r in snap.running]
        placements += [d.placement for d in decisions if d.placement is not None]
        for placement in placements:
            for pod in placement.pods:
                for g in pod.grants:
                    milli[(g.node, g.device)] += g.milli
                    whole[(g.node, g.device)] += g.milli == 1000
        for slot, used in milli.items():
            self.assertLessEqual(used, 1000, slot)
            if whole[slot]:
                self.assertEqual(used, 1000, slot)

    def check_quota(self, snap: Snapshot, decisions: list[Decision]) -> None:
        classes = {c.name: c for c in snap.classes}
        book = QuotaBook(snap.pools, snap.nodes, snap.quotas, snap.running, classes)
        pending = {r.id: r for r in snap.pending}
        for d in decisions:
            if d.kind is not DecisionKind.ADMIT:
                continue
            r = pending[d.request_id]
            pb = book.pools[d.pool]
            cls = classes[r.workload_class]
            book.add(r.team, d.pool, r.shape.gpus_milli, r.workload_class, d.borrowing)
            if not cls.inference and not preemptible(cls, d.borrowing) and pb.floor:
                self.assertLessEqual(pb.locked_used, pb.capacity - pb.floor)
            if d.borrowing:
                limit = pb.borrowing_limit.get(r.team)
                if limit is not None:
                    self.assertLessEqual(pb.used[r.team], pb.nominal[r.team] + limit)
                self.assertLessEqual(pb.cohort_used, pb.cohort_capacity)
            else:
                self.assertLessEqual(
                    pb.used[r.team], max(pb.nominal.get(r.team, 0), 0) or pb.used[r.team]
                )


class PropertyTest(Checker):
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(0, 2**32))
    def test_one_tick_keeps_the_invariants(self, seed: int) -> None:
        rng = random.Random(seed)
        world = random_world(rng)
        pending = tuple(random_request(rng, i, NOW) for i in range(rng.randint(0, 25)))
        snap = Snapshot(**{**world.__dict__, "pending": pending})
        policy = Policy(max_preemptions_per_tick=rng.choice((0, 2, 8)))
        self.check_tick(snap, schedule(snap, NOW, policy), policy)

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(0, 2**32))
    def test_event_sequences_keep_the_invariants(self, seed: int) -> None:
        rng = random.Random(seed)
        world = random_world(rng)
        policy = Policy(max_preemptions_per_tick=rng.choice((1, 4)), preempt_after_s=0)
        pending: dict[str, PendingRequest] = {}
        running: dict[str, Running] = {}
        now = NOW
        n = 0
        for _ in range(12):
            now += rng.randint(1, 600) * S
            for _ in range(rng.randint(0, 6)):
                r = random_request(rng, n, now)
                pending[r.id] = r
                n += 1
            for attempt in [a for a in running if rng.random() < 0.25]:
                del running[attempt]
            snap = Snapshot(
                **{
                    **world.__dict__,
                    "now_ms": now,
                    "pending": tuple(pending.values()),
                    "running": tuple(running.values()),
                }
            )
            decisions = schedule(snap, now, policy)
            self.check_tick(snap, decisions, policy)
            for d in decisions:
                if d.kind is DecisionKind.ADMIT:
                    r = pending.pop(d.request_id)
                    assert d.placement is not None
                    running[f"{r.id}#1"] = Running(
                        r.id,
                        f"{r.id}#1",
                        r.team,
                        r.workload_class,
                        d.pool,
                        r.shape,
                        d.placement,
                        now,
                    )
                elif d.kind is DecisionKind.PREEMPT:
                    running.pop(d.attempt_id)
                elif d.kind is DecisionKind.REJECT:
                    pending.pop(d.request_id)


class QuotaMemoTest(unittest.TestCase):
    """`QuotaBook.check` remembers answers across admissions of other teams; every answer
    must be the one a book that never answered before gives after the same changes."""

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(0, 2**32))
    def test_remembered_answers_equal_fresh_ones(self, seed: int) -> None:
        rng = random.Random(seed)
        world = random_world(rng)
        classes = {c.name: c for c in world.classes}

        def fresh(changes: list[tuple[str, ...]]) -> QuotaBook:
            book = QuotaBook(world.pools, world.nodes, world.quotas, (), classes)
            for op, *args in changes:
                if op == "add":
                    team, p, milli, cls, borrowing = args
                    book.add(team, p, int(milli), cls, borrowing == "1")
                else:
                    book.hold_back(args[0], int(args[1]))
            return book

        book = fresh([])
        changes: list[tuple[str, ...]] = []
        # (few distinct questions, so that one is asked again after others' changes)
        for _ in range(60):
            team, p = rng.choice(TEAMS), rng.choice(("x", "y"))
            milli, cls = rng.choice((1000, 4000)), rng.choice(CLASS_NAMES)
            roll = rng.random()
            if roll < 0.3:
                borrowing = "1" if rng.random() < 0.5 else ""
                change = ("add", team, p, str(milli), cls, borrowing)
                book.add(team, p, milli, cls, borrowing == "1")
                changes.append(change)
            elif roll < 0.35:
                book.hold_back(p, milli)
                changes.append(("hold", p, str(milli)))
            else:
                got = book.check(team, p, milli, cls)
                want = fresh(changes).check(team, p, milli, cls)
                self.assertEqual(got, want, (team, p, milli, cls, changes))


class FairQueueOrderTest(unittest.TestCase):
    """`FairQueue.pop` hands out runs of one team without its heap; each pop must still
    be the smallest next entry over all teams, with the shares as charged so far."""

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(0, 2**32))
    def test_each_pop_is_the_smallest_entry_of_any_team(self, seed: int) -> None:
        rng = random.Random(seed)
        teams = [f"t{i}" for i in range(rng.randint(1, 5))]
        pending = [
            req(
                f"r{i}",
                team=rng.choice(teams),
                gpus=rng.choice((1, 2, 4)),
                cls=rng.choice(("inference", "interactive", "training")),
                created_s=rng.randrange(0, 7200),
                priority=rng.choice((0, 0, 5)),
                preempting=rng.random() < 0.05,
            )
            for i in range(rng.randint(1, 120))
        ]
        queue = FairQueue(
            pending,
            {c.name: c for c in CLASSES},
            [Team(t, weight=rng.choice((1, 1, 2))) for t in teams],
            [],
            [],
            Resources(64_000, 512_000, 2_000_000),
            NOW,
            7 * 24 * 3600,
            0.5,
        )
        by_id = {r.id: r for r in pending}
        seen = []
        while True:
            heads = [
                (items[i][0], queue.share(team), items[i][1], items[i][2])
                for team, items in queue._lists.items()
                if (i := queue._next[team]) < len(items)
            ]
            got = queue.pop()
            if got is None:
                self.assertEqual(heads, [])
                break
            self.assertEqual(got.id, min(heads)[3])
            seen.append(got.id)
            roll = rng.random()
            if roll < 0.3:  # admitted: its team's share grows
                queue.charge(got.team, got.shape)
            elif roll < 0.35:  # a preemptor of another team charged for its plan
                other = by_id[rng.choice(seen)]
                queue.charge(other.team, other.shape)
        self.assertEqual(sorted(seen), sorted(by_id))
