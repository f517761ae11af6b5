"""Small seeded replays of every policy, compared with a golden recorded before the replay
was made faster (issue 33, item 5): an optimisation of the simulator or the packer may make
a replay cheaper, never change what it measures.

The cluster and the pod rows are synthetic (seeded, openb-like: shared slices, 1–8 GPU
requests, GPU-model constraints, the three QoS classes), so the shared traces are not
needed. Each case compares the full summary of `measure` (but `decisions_per_s`, a
timing) and a digest of the outcome's records: every start, attempt and wait.

Regenerate (only when a change of results is intended, and say why in the commit):
    python -m tests.scheduling.test_replay_golden --write
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import unittest
from pathlib import Path

from scheduling.bench.replay import (
    CHECKPOINT_S,
    POLICIES,
    draw_jobs,
    measure,
    run_policy,
    with_checkpoints,
    with_estimates,
)
from scheduling.profile import DEFAULT_PROFILE
from scheduling.profile import load as load_profile
from scheduling.simulate import Outcome
from scheduling.trace import TracePod
from scheduling.types import Device, Node, Partitioning

GOLDEN = Path(__file__).with_name("golden") / "replay_summaries.json"
TEAMS = 5
TICK_MS = 10_000
#: (load %, estimates, jobs): under load, overloaded, and without estimates
CASES = ((90.0, "over3", 300), (110.0, "over3", 300), (90.0, "none", 300))
#: (model, GPUs, cores, nodes)
NODE_KINDS = (("G2", 8, 96, 5), ("T4", 2, 32, 4), ("V100M32", 8, 96, 1), ("P100", 2, 64, 2))


def nodes() -> list[Node]:
    out: list[Node] = []
    for model, gpus, cores, n in NODE_KINDS:
        mem = 32 * 1024 if model == "V100M32" else 16 * 1024
        for i in range(n):
            devices = tuple(Device(d, model, mem, Partitioning.TIME_SLICING) for d in range(gpus))
            out.append(Node(f"{model.lower()}-{i}", "openb", cores * 1000, 512 * 1024, devices))
    return out


def pods(seed: int = 7, n: int = 400) -> list[TracePod]:
    rng = random.Random(seed)
    rows: list[TracePod] = []
    for i in range(n):
        num = rng.choice((1, 1, 1, 1, 1, 1, 2, 4, 8))
        milli = rng.choice((230, 320, 470, 650, 810)) if num == 1 and rng.random() < 0.45 else 1000
        spec = frozenset({"V100M32"}) if num >= 4 and rng.random() < 0.2 else frozenset()
        runtime = int(rng.expovariate(1 / 5400)) + 60
        rows.append(
            TracePod(
                f"pod-{i}",
                rng.choice((2000, 4000, 8000, 16000)) * num,
                rng.choice((8, 16, 32)) * 1024 * num,
                num,
                milli,
                spec,
                rng.choice(("LS", "LS", "BE", "BE", "Burstable")),
                "Running",
                0,
                1000 + runtime,
                1000,
            )
        )
    return rows


def digest(out: Outcome) -> str:
    records = {
        "first_start_ms": sorted(out.first_start_ms.items()),
        "intervals": sorted(out.intervals),
        "waiting": sorted(out.waiting),
        "preemptions": out.preemptions,
        "lost_milli_ms": out.lost_milli_ms,
        "preempted_by_team": sorted(out.preempted_by_team.items()),
        "lost_by_team": sorted(out.lost_by_team.items()),
        "rejected": sorted(out.rejected),
    }
    return hashlib.sha256(json.dumps(records).encode()).hexdigest()


def replay_all() -> dict[str, dict[str, object]]:
    cluster, rows = nodes(), pods()
    policy = load_profile(DEFAULT_PROFILE).policy()
    results: dict[str, dict[str, object]] = {}
    for load, estimates, n in CASES:
        jobs, capacity = draw_jobs(rows, cluster, n, load, TEAMS, seed=1)
        jobs = with_checkpoints(with_estimates(jobs, estimates, 1), CHECKPOINT_S)
        for name in POLICIES:
            out = run_policy(name, cluster, jobs, capacity, TEAMS, TICK_MS, 1, policy)
            summary: dict[str, object] = dict(measure(out, jobs, capacity, TEAMS))
            summary.pop("decisions_per_s")
            summary["digest"] = digest(out)
            results[f"load={load:g} estimates={estimates} jobs={n} {name}"] = summary
    return results


class ReplayGoldenTest(unittest.TestCase):
    def test_every_policy_measures_what_it_measured_before(self) -> None:
        golden = json.loads(GOLDEN.read_text())
        got = replay_all()
        self.assertEqual(sorted(got), sorted(golden))
        for case, summary in golden.items():
            with self.subTest(case=case):
                self.assertEqual(got[case], summary)

    def test_the_cases_exercise_preemption_and_waiting(self) -> None:
        # a golden of idle replays would prove nothing about the paths an optimisation takes
        golden = json.loads(GOLDEN.read_text())
        qm = [s for c, s in golden.items() if c.endswith(" quartermaster")]
        self.assertTrue(any(s["preemptions"] > 0 for s in qm))
        self.assertTrue(all(s["wait_max_s"] > 0 for s in qm))


if __name__ == "__main__":
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(replay_all(), indent=1, sort_keys=True) + "\n")
    else:
        unittest.main()
