"""Tick benchmark: one `schedule()` call at portal scale.

`python -m scheduling.bench tick --json [--pending N] [--teams T] [--pools P] [--gpus G]
[--allocated PCT] [--seed S] [--profile NAME|FILE]`

Builds one synthetic snapshot — by default 10,000 pending requests from 30 teams over
5 pools of 8-GPU nodes (8,000 GPUs), 60 % of them already allocated to running
attempts — and times a single tick with the profile's `Policy` (default: the shipped
profile, `scheduling/profiles/default.toml`, as the portal runs it). Prints
`{"pending", "gpus", "seconds", "cpu_seconds", "peak_rss_mb", "decisions", "admitted",
"profile"}`; `seconds` is the wall time of `schedule()` alone, `peak_rss_mb` the
process's peak resident memory (building the snapshot included); `cpu_seconds`, the CPU
time of `schedule()`, is the number to read on a machine shared with other work.
`--pending 100000 --gpus 50000` is issue 33's scale (`docs/performance.md`).

The mix: half whole-GPU requests (1, 2, 4 or 8 GPUs), a third shared slices, the rest
2-pod gangs; classes inference / interactive / training; a quarter name a pool, the
rest take any production pool. Quotas give every team an equal nominal share of each
pool with unlimited borrowing; one pool keeps an inference floor.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from collections.abc import Sequence

from scheduling.cycle import schedule
from scheduling.profile import DEFAULT_PROFILE, ProfileError
from scheduling.profile import load as load_profile
from scheduling.types import (
    Device,
    DeviceGrant,
    Node,
    Partitioning,
    PendingRequest,
    Placement,
    PodPlacement,
    Pool,
    PreemptionPolicy,
    ProfileKind,
    Quota,
    Running,
    Shape,
    Snapshot,
    Team,
    TeamUsage,
    WorkloadClass,
)

NOW_MS = 1_800_000_000_000
CLASSES = (
    WorkloadClass("inference", 300, PreemptionPolicy.NEVER, max_queue_s=600, inference=True),
    WorkloadClass("interactive", 200, PreemptionPolicy.WHEN_BORROWING, 600, max_queue_s=3600),
    WorkloadClass("training", 100, PreemptionPolicy.ALWAYS, 600, max_queue_s=86400),
)
GPUS_PER_NODE = 8


def build(pending: int, teams: int, pools: int, gpus: int, allocated: float, seed: int) -> Snapshot:
    """Return the synthetic snapshot described in the module docstring."""
    rng = random.Random(seed)
    pool_names = [f"pool-{i}" for i in range(pools)]
    team_names = [f"team-{i:02d}" for i in range(teams)]
    nodes = [
        Node(
            f"node-{i:05d}",
            pool_names[i % pools],
            128_000,
            1_048_576,
            tuple(
                Device(d, "A100", 81_920, Partitioning.TIME_SLICING, 4)
                for d in range(GPUS_PER_NODE)
            ),
        )
        for i in range(gpus // GPUS_PER_NODE)
    ]
    running = _fill(nodes, team_names, allocated, rng)
    per_pool = len(nodes) * GPUS_PER_NODE * 1000 // pools
    quotas = tuple(Quota(t, p, per_pool // teams) for p in pool_names for t in team_names)
    snap_pools = tuple(
        Pool(p, Partitioning.TIME_SLICING, inference_floor_milli=40_000 if i == 0 else 0)
        for i, p in enumerate(pool_names)
    )
    reqs = tuple(_request(i, rng, team_names, pool_names) for i in range(pending))
    usage = tuple(TeamUsage(t, rng.randrange(10**9)) for t in team_names)
    return Snapshot(
        NOW_MS,
        snap_pools,
        tuple(nodes),
        tuple(running),
        reqs,
        tuple(Team(t) for t in team_names),
        quotas,
        CLASSES,
        usage,
    )


def _fill(
    nodes: list[Node], teams: list[str], allocated: float, rng: random.Random
) -> list[Running]:
    """Give whole nodes' devices to running attempts until `allocated` of all GPUs are taken."""
    running: list[Running] = []
    target = int(len(nodes) * GPUS_PER_NODE * allocated)
    taken = 0
    for node in nodes:
        d = 0
        while d < GPUS_PER_NODE and taken < target:
            count = min(rng.choice((1, 2, 4)), GPUS_PER_NODE - d, target - taken)
            grants = tuple(DeviceGrant(node.name, d + k) for k in range(count))
            i = len(running)
            running.append(
                Running(
                    f"run-{i}",
                    f"run-{i}#1",
                    rng.choice(teams),
                    rng.choice(("training", "interactive", "inference")),
                    node.pool,
                    Shape(count=count, cpu_milli=4000, memory_mib=16_384),
                    Placement((PodPlacement(node.name, grants, 4000, 16_384),)),
                    NOW_MS - rng.randrange(1, 86_400_000),
                )
            )
            d += count
            taken += count
    return running


def _request(i: int, rng: random.Random, teams: list[str], pools: list[str]) -> PendingRequest:
    roll = rng.random()
    if roll < 0.5:
        shape = Shape(count=rng.choice((1, 1, 2, 4, 8)), cpu_milli=8000, memory_mib=32_768)
    elif roll < 0.85:
        shape = Shape(
            ProfileKind.SHARED, 1, rng.choice((250, 500)), 20_480, cpu_milli=2000, memory_mib=8192
        )
    else:
        shape = Shape(count=rng.choice((2, 4)), pods=2, cpu_milli=8000, memory_mib=32_768)
    return PendingRequest(
        f"req-{i:05d}",
        rng.choice(teams),
        rng.choice(("training", "training", "interactive", "inference")),
        shape,
        NOW_MS - rng.randrange(1, 7_200_000),
        pool=rng.choice(pools) if rng.random() < 0.25 else "",
        priority=rng.randint(-5, 5),
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.bench tick")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--teams", type=int, default=30)
    parser.add_argument("--pools", type=int, default=5)
    parser.add_argument("--gpus", type=int, default=8_000)
    parser.add_argument("--allocated", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help="scheduling profile: a shipped name or a TOML file (default: the shipped one)",
    )
    args = parser.parse_args(list(argv))
    try:
        profile = load_profile(args.profile)
    except ProfileError as exc:
        parser.error(f"--profile: {exc}")
    snap = build(args.pending, args.teams, args.pools, args.gpus, args.allocated, args.seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    decisions = schedule(snap, policy=profile.policy())
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    assert len({d.request_id for d in decisions if d.kind != "preempt"}) == args.pending
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform != "darwin" else 1024  # macOS reports bytes
    result = {
        "pending": args.pending,
        "gpus": sum(len(n.devices) for n in snap.nodes),
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "peak_rss_mb": round(rss_kb / scale / 1024, 1),
        "decisions": len(decisions),
        "admitted": sum(d.kind == "admit" for d in decisions),
        "profile": f"{profile.name} v{profile.version}",
    }
    print(json.dumps(result) if args.json else " ".join(f"{k}={v}" for k, v in result.items()))
    return 0
