"""The replay's baselines and measures on small hand-made clusters (the trace is not needed)."""

from __future__ import annotations

import random
import unittest
from dataclasses import replace

from scheduling.bench.replay import (
    measure,
    overruns,
    overruns_alone,
    run_fifo_strict,
    run_light,
    run_quartermaster,
    share_error,
    with_checkpoints,
    with_estimates,
)
from scheduling.cycle import schedule
from scheduling.explain import Code
from scheduling.simulate import (
    Job,
    Outcome,
    Simulation,
    alone,
    held_by,
    last_checkpoint_ms,
    overrun_cause,
    record_stop,
)
from scheduling.types import (
    Decision,
    DecisionKind,
    Device,
    Node,
    Partitioning,
    PendingRequest,
    Placement,
    PodPlacement,
    ProfileKind,
    Shape,
)
from tests.scheduling.builders import NOW, node, quota, req, rules, run, snapshot

H = 3600 * 1000


def gpu_node(name: str, gpus: int = 2) -> Node:
    devices = tuple(Device(i, "G2", 16 * 1024, Partitioning.TIME_SLICING) for i in range(gpus))
    return Node(name, "openb", 64_000, 256 * 1024, devices)


def job(
    i: int, gpus: int = 1, milli: int = 1000, at_s: int = 0, run_h: float = 1.0, **kw: str
) -> Job:
    kind = ProfileKind.SHARED if milli < 1000 else ProfileKind.WHOLE
    return Job(
        f"job-{i:06d}",
        kw.get("team", "team-0"),
        kw.get("cls", "training"),
        Shape(kind=kind, count=gpus, milli=milli, cpu_milli=1000),
        int(run_h * H),
        at_s * 1000,
    )


class BaselineTest(unittest.TestCase):
    def test_fifo_strict_blocks_the_head_of_the_line(self) -> None:
        jobs = [job(0, gpus=1), job(1, gpus=2, at_s=1), job(2, gpus=1, at_s=2)]
        out = run_fifo_strict([gpu_node("n1")], jobs)
        # job 1 waits for job 0, and job 2 waits behind job 1
        self.assertEqual(out.first_start_ms["job-000002"], out.first_start_ms["job-000001"] + H)

    def test_kube_scheduler_sets_aside_what_does_not_fit(self) -> None:
        jobs = [job(0, gpus=1), job(1, gpus=2, at_s=1), job(2, gpus=1, at_s=2)]
        out = run_light("kube-scheduler", [gpu_node("n1")], jobs, 2000, 1)
        self.assertEqual(out.first_start_ms["job-000002"], 2000)

    def test_whole_devices_only_except_binpack(self) -> None:
        jobs = [job(0, milli=500), job(1, milli=500, at_s=1), job(2, milli=500, at_s=2)]
        whole = run_light("kube-scheduler", [gpu_node("n1")], jobs, 2000, 1)
        shared = run_light("binpack", [gpu_node("n1")], jobs, 2000, 1)
        self.assertEqual(whole.first_start_ms["job-000002"], H)  # two slices, two GPUs
        self.assertEqual(shared.first_start_ms["job-000002"], 2000)

    def test_kube_scheduler_preempts_a_lower_priority(self) -> None:
        jobs = [job(0, gpus=2, run_h=5), job(1, gpus=1, at_s=60, cls="inference")]
        out = run_light("kube-scheduler", [gpu_node("n1")], jobs, 2000, 1)
        self.assertEqual(out.preemptions, 1)
        self.assertEqual(out.first_start_ms["job-000001"], 60_000)

    def test_kueue_reclaims_from_a_borrower(self) -> None:
        # two teams, nominal one GPU each; team-1 borrows the second GPU, team-0 takes it back
        jobs = [
            job(0, gpus=1, run_h=5, team="team-1"),
            job(1, gpus=1, at_s=1, run_h=5, team="team-1"),
            job(2, gpus=1, at_s=60, team="team-0"),
        ]
        out = run_light("kueue", [gpu_node("n1")], jobs, 2000, 2)
        self.assertEqual(out.preemptions, 1)
        self.assertEqual(out.first_start_ms["job-000002"], 60_000)

    def test_quartermaster_runs_the_portal_policy(self) -> None:
        jobs = [job(0, gpus=1), job(1, gpus=2, at_s=1), job(2, gpus=1, at_s=2)]
        out = run_quartermaster([gpu_node("n1")], jobs, 2000, 1, 10_000, 1)
        self.assertEqual(set(out.first_start_ms), {j.id for j in jobs})


class MeasureTest(unittest.TestCase):
    def test_useful_work_leaves_out_preempted_attempts(self) -> None:
        jobs = [job(i, at_s=i * 3600) for i in range(10)]
        out = Outcome(first_start_ms={j.id: j.arrival_ms for j in jobs})
        out.intervals = [("team-0", 1000, 0, 10 * H, True), ("team-0", 1000, 0, 10 * H, False)]
        m = measure(out, jobs, 2000, 1)
        self.assertEqual(m["utilization"], 100.0)
        self.assertEqual(m["useful_utilization"], 50.0)

    def test_the_queue_time_promise_overall_and_per_class(self) -> None:
        # interactive promises 3,600 s, inference 1,800 s (`REPLAY_CLASSES`)
        jobs = [
            job(0, cls="interactive"),
            job(1, cls="interactive", at_s=10),
            job(2, cls="inference", at_s=20),
            job(3, cls="inference", at_s=30),
        ]
        waited_s = {0: 3600, 1: 4000, 2: 60, 3: 1800}
        out = Outcome(
            first_start_ms={j.id: j.arrival_ms + waited_s[i] * 1000 for i, j in enumerate(jobs)}
        )
        m = measure(out, jobs, 2000, 1)
        self.assertEqual(m["slo_attainment"], 0.75)
        self.assertEqual(m["slo_overrun_max_s"], 400.0)
        self.assertEqual(m["slo_attainment_interactive"], 0.5)
        self.assertEqual(m["slo_overrun_max_s_interactive"], 400.0)
        self.assertEqual(m["slo_attainment_inference"], 1.0)
        self.assertEqual(m["slo_overrun_max_s_inference"], 0.0)
        self.assertNotIn("slo_attainment_training", m)

    def test_share_error_counts_only_teams_with_demand(self) -> None:
        out = Outcome()
        # team-0 holds everything for 4 hours while team-1 waits: error 0.5 per window
        out.intervals = [("team-0", 2000, 0, 4 * H, True)]
        out.waiting = [("team-1", 0, 4 * H)]
        self.assertAlmostEqual(share_error(out, 2000, 2, 0, 4 * H), 0.5)
        # a team that got its entitlement has no error; a short wait is no demand
        out.intervals = [("team-0", 1000, 0, 4 * H, True), ("team-1", 1000, 0, 4 * H, True)]
        out.waiting = [("team-1", 0, 4 * H), ("team-0", 0, 10_000)]
        self.assertAlmostEqual(share_error(out, 2000, 2, 0, 4 * H), 0.0)

    def test_estimates_over3_never_under_estimate(self) -> None:
        jobs = [job(i) for i in range(50)]
        for j in with_estimates(jobs, "over3", 1):
            assert j.estimate_ms is not None
            self.assertTrue(j.runtime_ms <= j.estimate_ms <= 3 * j.runtime_ms)


M = 60 * 1000


class CheckpointTest(unittest.TestCase):
    def test_only_training_jobs_checkpoint(self) -> None:
        jobs = with_checkpoints([job(0), job(1, cls="interactive"), job(2, cls="inference")], 600)
        self.assertEqual([j.checkpoint_ms for j in jobs], [600_000, None, None])
        self.assertEqual([j.checkpoint_ms for j in with_checkpoints(jobs, 0)], [None] * 3)

    def test_the_last_checkpoint_is_the_last_whole_interval(self) -> None:
        cases = {
            "none yet": ((0, 30 * M, 29 * M), None),
            "exactly one": ((0, 30 * M, 30 * M), 30 * M),
            "two and some": ((5 * M, 30 * M, 70 * M), 65 * M),
            "no interval": ((0, None, 70 * M), None),
        }
        for name, (args, want) in cases.items():
            with self.subTest(name):
                self.assertEqual(last_checkpoint_ms(*args), want)

    def test_a_preempted_attempt_loses_only_the_work_since_its_checkpoint(self) -> None:
        out = Outcome()
        j = replace(job(0, gpus=2), checkpoint_ms=30 * M)
        kept = record_stop(out, j, 2000, 0, 100 * M, preempted=True)
        self.assertEqual(kept, 90 * M)
        self.assertEqual(out.lost_milli_ms, 2000 * 10 * M)
        self.assertEqual(
            out.intervals,
            [("team-0", 2000, 0, 90 * M, True), ("team-0", 2000, 90 * M, 100 * M, False)],
        )
        # without checkpoints everything since the start is lost
        out = Outcome()
        self.assertEqual(record_stop(out, job(0, gpus=2), 2000, 0, 100 * M, preempted=True), 0)
        self.assertEqual(out.lost_milli_ms, 2000 * 100 * M)
        self.assertEqual(out.intervals, [("team-0", 2000, 0, 100 * M, False)])

    def test_useful_utilization_counts_preempted_work_up_to_the_checkpoint(self) -> None:
        jobs = [job(i, at_s=i * 3600) for i in range(10)]
        out = Outcome(first_start_ms={j.id: j.arrival_ms for j in jobs})
        ckpt = replace(jobs[0], checkpoint_ms=H)
        record_stop(out, ckpt, 1000, 0, 10 * H, preempted=False)
        # preempted half an hour after its checkpoint at 5 h: 5 of 5.5 hours kept
        record_stop(out, ckpt, 1000, 0, 5 * H + H // 2, preempted=True)
        m = measure(out, jobs, 2000, 1)
        # the window runs from 2 h to 9 h: 7 + 3.5 GPU-hours used of 14, 7 + 3 useful
        self.assertEqual(m["utilization"], 75.0)
        self.assertEqual(m["useful_utilization"], round(100 * 10 / 14, 2))
        self.assertEqual(m["gpu_hours_lost"], 0.5)
        self.assertEqual(m["gpu_hours_delivered"], 15.5)

    def test_quartermaster_picks_the_victim_with_a_recent_checkpoint_and_resumes_it(self) -> None:
        # team-1 borrows both GPUs with two training jobs; team-0 reclaims one. The job
        # that checkpointed keeps its work, so the core takes it; its retry runs the rest.
        first = replace(job(0, run_h=4, team="team-1"), checkpoint_ms=20 * M)
        second = job(1, at_s=1, run_h=4, team="team-1")
        reclaim = job(2, at_s=50 * 60, run_h=1, team="team-0", cls="interactive")
        out = run_quartermaster([gpu_node("n1")], [first, second, reclaim], 2000, 2, 10_000, 1)
        self.assertEqual(out.preemptions, 1)
        lost = [i for i in out.intervals if not i[4]]
        self.assertEqual(len(lost), 1)
        # the shipped profile lets a 1-GPU reclaim cost a victim 120 GPU-seconds: past
        # preempt_after_s (55 minutes) it waits for a checkpoint and stops the job at one,
        # losing nothing; the replay ticks on events, here the reclaim's reservation wait
        # (reserve_after_s) at 80 minutes, where the portal's tick comes within seconds
        _, milli, start, end, _ = lost[0]
        self.assertEqual((start, end), (80 * M, 80 * M))
        self.assertEqual(out.lost_milli_ms, 0)
        # its work is all delivered in the end: 4 h useful, over two attempts
        useful = sum(e - s for t, _, s, e, kept in out.intervals if kept and t == "team-1")
        self.assertEqual(useful, 8 * H)


if __name__ == "__main__":
    unittest.main()


def wait(code: Code, **facts: object) -> Decision:
    return Decision(DecisionKind.WAIT, "job-000001", code, "waiting", facts=facts)


class OverrunCauseTest(unittest.TestCase):
    """What held a request past its class's maximum queue time (issue 33's load-90 target)."""

    def test_each_wait_says_what_held_it(self) -> None:
        self.assertEqual(held_by(wait(Code.NO_CAPACITY), False), "no allowed victim set")
        self.assertEqual(held_by(wait(Code.AWAITING_NODES), False), "no allowed victim set")
        self.assertEqual(held_by(wait(Code.NO_CAPACITY), True), "tick's preemption cap")
        overloaded = wait(Code.NO_CAPACITY, overloaded=True)
        self.assertEqual(held_by(overloaded, True), "pool overloaded")
        self.assertEqual(held_by(wait(Code.PREEMPTING), False), "victims stopping")
        self.assertEqual(held_by(wait(Code.AWAITING_STOP), True), "victims stopping")
        self.assertEqual(held_by(wait(Code.COHORT_EXHAUSTED), False), "quota")
        self.assertEqual(held_by(wait(Code.BORROWING_LIMIT), False), "quota")
        self.assertEqual(held_by(wait(Code.BACKOFF), False), "backoff")
        self.assertEqual(held_by(wait(Code.POOL_MAINTENANCE), False), "pool-maintenance")

    def test_an_overrun_counts_under_what_held_it_most_often(self) -> None:
        self.assertEqual(overrun_cause(None), "between ticks")
        self.assertEqual(overrun_cause({}), "between ticks")
        causes = {"no allowed victim set": 536, "tick's preemption cap": 14}
        self.assertEqual(overrun_cause(causes), "no allowed victim set")
        # a tie goes to the rule of ours before the limits of the granted one
        tie = {"no allowed victim set": 3, "pool overloaded": 3}
        self.assertEqual(overrun_cause(tie), "pool overloaded")

    def test_overruns_count_each_request_under_one_cause_and_as_touched_by_each(self) -> None:
        jobs = [job(1, cls="inference"), job(2, cls="inference"), job(3, cls="interactive")]
        out = Outcome(
            first_start_ms={
                "job-000001": 2300 * 1000,  # 500 s over inference's 1,800
                "job-000002": 1810 * 1000,  # 10 s over
                "job-000003": 3600 * 1000,  # kept interactive's 3,600
            },
            held_past_promise={
                "job-000001": {"no allowed victim set": 10, "tick's preemption cap": 1},
                "job-000002": {"victims stopping": 1},
            },
        )
        late = overruns(out, jobs)
        self.assertEqual(
            list(late), ["no allowed victim set", "victims stopping", "tick's preemption cap"]
        )
        none, stopping, cap = late.values()
        self.assertEqual((none.requests, none.overrun_max_s, none.touched), (1, 500.0, 1))
        self.assertEqual(none.waits, {"no allowed victim set": 10, "tick's preemption cap": 1})
        self.assertEqual((stopping.requests, stopping.overrun_max_s), (1, 10.0))
        # the cap held job 1 once: it may have had a victim set then
        self.assertEqual((cap.requests, cap.touched, cap.touched_overrun_max_s), (0, 1, 500.0))

    def test_a_request_no_victim_may_make_room_for_overruns_under_that_cause(self) -> None:
        # Inference holds the one node for 5 hours and is never a victim: the inference
        # request arriving at 60 s waits past its 1,800 s promise. Training requests
        # arriving every 10 minutes give the replay ticks while it waits.
        jobs = [
            job(0, gpus=2, run_h=5, cls="inference"),
            job(1, gpus=1, at_s=60, cls="inference"),
            *(job(i, gpus=1, at_s=600 * i, run_h=0.1) for i in range(2, 12)),
        ]
        # (nominal quota of 4 GPUs: quota does not hold it, the node does)
        out = run_quartermaster([gpu_node("n1")], jobs, 4000, 1, 10_000, 1)
        self.assertEqual(out.first_start_ms["job-000001"], 5 * H)
        held = out.held_past_promise["job-000001"]
        self.assertEqual(set(held), {"no allowed victim set"})
        # a tick at least at each arrival past 1,860 s: 2,400, 3,000, ... 6,600 s
        self.assertGreaterEqual(held["no allowed victim set"], 8)
        late = overruns(out, jobs)
        self.assertEqual(list(late), ["no allowed victim set"])
        row = late["no allowed victim set"]
        self.assertEqual(row.requests, 1)
        self.assertEqual(row.overrun_max_s, 5 * 3600 - 60 - 1800)
        self.assertEqual(row.waits, held)
        self.assertEqual((row.touched, row.touched_overrun_max_s), (1, row.overrun_max_s))

    def test_quota_that_holds_a_request_past_its_promise_is_its_cause(self) -> None:
        jobs = [
            job(0, gpus=2, run_h=5, cls="inference"),
            job(1, gpus=1, at_s=60, cls="inference"),
            *(job(i, gpus=1, at_s=600 * i, run_h=0.1) for i in range(2, 12)),
        ]
        # nominal quota of 2 GPUs, held by job 0: job 1 would borrow from no one
        out = run_quartermaster([gpu_node("n1")], jobs, 2000, 1, 10_000, 1)
        self.assertEqual(set(out.held_past_promise["job-000001"]), {"quota"})
        self.assertEqual(list(overruns(out, jobs)), ["quota"])

    def test_the_probe_tells_a_request_no_victim_could_start_even_alone(self) -> None:
        jobs = [
            job(0, gpus=2, run_h=5, cls="inference"),
            job(1, gpus=1, at_s=60, cls="inference"),
            *(job(i, gpus=1, at_s=600 * i, run_h=0.1) for i in range(2, 12)),
        ]
        out = run_quartermaster([gpu_node("n1")], jobs, 4000, 1, 10_000, 1, probe_overruns=True)
        self.assertEqual(out.startable_alone_s, {})
        late = overruns_alone(out, jobs)
        over = 5 * 3600 - 60 - 1800
        self.assertEqual(late["never startable alone"], {"requests": 1, "overrun_max_s": over})
        self.assertNotIn("startable alone", late)
        self.assertEqual(late["longest"], [["job-000001", "inference", over, None, None]])
        self.assertEqual(out.chance_lost_s, {})

    def test_a_startable_request_counts_what_it_waited_after_it_first_was(self) -> None:
        jobs = [job(1, cls="inference"), job(2, cls="inference")]
        out = Outcome(
            first_start_ms={"job-000001": 2300 * 1000, "job-000002": 1900 * 1000},
            startable_alone_s={"job-000001": 100.0},  # 100 s past its promise
            chance_lost_s={"job-000001": 150.0},
        )
        late = overruns_alone(out, jobs)
        self.assertEqual(
            late["startable alone"],
            {"requests": 1, "overrun_max_s": 500.0, "after_startable_max_s": 400.0},
        )
        self.assertEqual(late["never startable alone"], {"requests": 1, "overrun_max_s": 100.0})
        self.assertEqual(late["lost a chance"], {"requests": 1, "overrun_max_s": 500.0})
        self.assertEqual(
            late["longest"],
            [
                ["job-000001", "inference", 500.0, 100.0, 150.0],
                ["job-000002", "inference", 100.0, None, None],
            ],
        )

    def test_a_chance_lost_to_a_request_not_yet_overdue_is_told_apart(self) -> None:
        # A waited past interactive's 3,600 s; alone it would start on n1. Who got n1 in the
        # real tick decides whether its chance was lost (`Outcome.chance_lost_s`).
        overdue = req("A", cls="interactive", gpus=2, created_s=4000)
        snap = snapshot([node(gpus=2)], [overdue], [], [quota("a", 8)])
        wait = Decision(DecisionKind.WAIT, "A", Code.NO_CAPACITY, "waiting")

        def probe(*others: PendingRequest) -> dict[str, float]:
            sim = Simulation(
                nodes=snap.nodes,
                jobs={},
                teams=snap.teams,
                quotas=snap.quotas,
                policy=rules(),
                rng=random.Random(1),
                classes=snap.classes,
            )
            taken = [
                Decision(
                    DecisionKind.ADMIT,
                    o.id,
                    Code.FITS,
                    "admitted",
                    placement=Placement((PodPlacement("n1", ()),)),
                )
                for o in others
            ]
            both = replace(snap, pending=(overdue, *others))
            sim._probe(both, [*taken, wait], [(overdue, 3600 * 1000)], NOW)
            self.assertEqual(sim.out.startable_alone_s, {"A": 400.0})
            return sim.out.chance_lost_s

        young = req("B", cls="inference", gpus=2, created_s=100)  # inference promises 600 s
        self.assertEqual(probe(young), {"A": 400.0})
        old = req("C", cls="inference", gpus=2, created_s=700)
        self.assertEqual(probe(old), {})  # another overdue request took it
        self.assertEqual(probe(old, young), {"A": 400.0})  # not only overdue ones did
        self.assertEqual(probe(), {"A": 400.0})  # no one took it

    def test_alone_a_request_gets_the_room_a_request_ahead_of_it_took(self) -> None:
        # one GPU free: the older request takes it, the younger one would have had it alone
        first, second = req("first", created_s=20), req("second", created_s=10)
        snap = snapshot(
            [node(gpus=2)],
            [first, second],
            [run("busy", devices=(0,))],
            [quota("a", 8)],
        )
        together = {d.request_id: d.kind for d in schedule(snap, policy=rules())}
        self.assertEqual(together["second"], DecisionKind.WAIT)
        self.assertTrue(alone(snap, second, rules()))
        held = snapshot(
            [node(gpus=2)],
            [second],
            [
                run("busy", devices=(0,), cls="inference"),
                run("more", devices=(1,), cls="inference"),
            ],
            [quota("a", 8)],
        )
        # inference is never a victim: alone or not, nothing makes room
        self.assertFalse(alone(held, second, rules()))
