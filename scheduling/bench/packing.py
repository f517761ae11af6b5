"""Packing benchmark on the openb trace, after the FGD paper's procedure.

    python -m scheduling.bench packing --json [--policy NAME|all] [--seeds 42-51] ...

For each policy and seed:

1. the cluster is the node list (`--replicate K`: K copies, names of copy k > 0 get `-k`);
2. the target workload is the most popular pod shapes (CPU, GPU count, GPU share, GPU
   models) covering 95 % of the original pods, CPU-only pods included;
3. the pods are sorted by name and shuffled with `random.Random(seed)`;
4. pods drawn uniformly with replacement from them are appended until the next draw would
   take the total GPU request past `--tune` (1.3) × cluster GPU capacity;
5. pods are submitted one by one (`find` then `take`); nothing departs; a pod that does not
   fit fails and is not retried.

After each arrival the arrived GPU request (failed pods included) as a % of capacity is
rounded half up to a whole number, its bin; a bin's value is the mean allocation ratio
(allocated GPU milli / capacity, %) over the arrivals in it; `alloc_at_100` is bin 100.
Empty bins are `null`.

`--per-tick N` runs the production path instead of step 2 and the `find`/`take` of step 5:
the arrivals are submitted N per tick to `scheduling.cycle.schedule()` — the function the
portal's tick calls — with `Policy()` (its `packer` and `shape_half_life_s`; `--half-life-s`
overrides the latter). The cluster is one pool, one team and one workload class that never
preempts; what is admitted stays as a running attempt in the next tick's snapshot. The target
workload is the pool's `scheduling.workload.ShapeHistory`, started cold from the prior of the
nodes (`--warm`: from the counts of the whole trace) and fed every arrival before its tick, as
the portal's submit does. Ticks are `N × (trace span / pods)` apart (the trace's mean arrival
rate), so the half-life means what it would on that cluster. A request the tick does not admit
is withdrawn and counts as failed (the FGD procedure's "does not fit").

One JSON object per policy and seed goes to stdout, one per line. With more than one seed a
table (mean ± sd of `alloc_at_100` beside the FGD authors' published means) goes to stderr.
`--placements FILE` writes `seq,pod,node,gpus` in arrival order; with several runs the file
name gets `-POLICY-SEED` before its extension.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import resource
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from scheduling.cycle import schedule
from scheduling.packer import DEFAULT_POLICY, POLICIES, TIE_BREAKS, ClusterState, target_workload
from scheduling.trace import TracePod, load_nodes, load_pods, workload_name
from scheduling.types import (
    WHOLE_GPU_MILLI,
    DecisionKind,
    Node,
    PendingRequest,
    Placement,
    Policy,
    Pool,
    PreemptionPolicy,
    Running,
    Shape,
    Snapshot,
    Team,
    WorkloadClass,
)
from scheduling.workload import ShapeHistory

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACE_DIR = REPO_ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023"
DEFAULT_NODES = TRACE_DIR / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = TRACE_DIR / "openb_pod_list_default.csv"
EXPECTED = (
    REPO_ROOT.parent / "shared" / "traces" / "fgd-expected-results" / "analysis_allo_discrete.csv"
)

#: the policies `--policy all` runs (firstfit is the legacy placeholder, left out)
ALL_POLICIES = tuple(p for p in POLICIES if p != "firstfit")
#: our policy name -> the FGD artifact's `sc_policy`
PUBLISHED_NAMES = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
    # our FGD variants are compared with FGD's published numbers
    "fgd-bestfit": "06-FGD",
    "fgd-exact": "06-FGD",
}
BINS = 131


class _Curve:
    """Allocation (% of capacity) averaged per bin of arrived GPU request (% of capacity)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.sums = [0.0] * BINS
        self.counts = [0] * BINS
        self.arrived = 0

    def add(self, request_milli: int, allocated: int) -> None:
        self.arrived += request_milli
        b = (self.arrived * 200 + self.capacity) // (2 * self.capacity)
        if b < BINS:
            self.sums[b] += allocated * 100 / self.capacity
            self.counts[b] += 1

    def points(self) -> list[float | None]:
        return [round(s / c, 3) if c else None for s, c in zip(self.sums, self.counts, strict=True)]


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    seed: int
    workload: str
    curve: list[float | None]
    pods: int
    failed: int
    seconds: float
    placements: list[tuple[str, Placement | None]]

    @property
    def alloc_at_100(self) -> float | None:
        return self.curve[100]


def replicate(nodes: list[Node], k: int) -> list[Node]:
    """The node list repeated k times; copy i > 0 has names suffixed `-i`."""
    out = list(nodes)
    for i in range(1, k):
        out.extend(replace(n, name=f"{n.name}-{i}") for n in nodes)
    return out


def target_shapes(pods: list[TracePod]) -> list[tuple[Shape, int]]:
    """FGD's target workload: popular (CPU, GPU count, share, models) shapes, 95 % of pods."""
    return target_workload(replace(p.to_shape(), memory_mib=0) for p in pods)


def arrivals(pods: list[TracePod], seed: int, capacity_milli: int, tune: float) -> list[TracePod]:
    """Sorted by name, shuffled with the seed, inflated with replacement to `tune` × capacity."""
    rng = random.Random(seed)
    out = sorted(pods, key=lambda p: p.name)
    rng.shuffle(out)
    total = sum(p.gpu_request_milli for p in out)
    limit = tune * capacity_milli
    base = list(out)
    while base:
        pod = base[rng.randrange(len(base))]
        if total + pod.gpu_request_milli > limit:
            break
        out.append(pod)
        total += pod.gpu_request_milli
    return out


def run_once(
    nodes: list[Node],
    pods: list[TracePod],
    *,
    policy: str,
    seed: int,
    tie_break: str,
    workload: str,
    tune: float = 1.3,
    keep_placements: bool = False,
) -> RunResult:
    capacity = WHOLE_GPU_MILLI * sum(1 for n in nodes for d in n.devices if d.healthy)
    sequence = arrivals(pods, seed, capacity, tune)
    shapes = {p.name: p.to_shape() for p in pods}
    state = ClusterState(
        nodes, policy, seed=seed, tie_break=tie_break, shape_weights=target_shapes(pods)
    )
    curve_of = _Curve(capacity)
    allocated = 0
    failed = 0
    placements: list[tuple[str, Placement | None]] = []
    find, take = state.find, state.take
    start = time.perf_counter()
    for pod in sequence:
        shape = shapes[pod.name]
        placement = find(shape)
        if placement is None:
            failed += 1
        else:
            take(placement)
            allocated += pod.gpu_request_milli
        if keep_placements:
            placements.append((pod.name, placement))
        curve_of.add(pod.gpu_request_milli, allocated)
    seconds = time.perf_counter() - start
    curve = curve_of.points()
    return RunResult(policy, seed, workload, curve, len(sequence), failed, seconds, placements)


#: the benchmark's one team and class: the FGD procedure has no priorities or preemption
TEAM = Team("bench")
CLASS = WorkloadClass("bench", band=0, preemption=PreemptionPolicy.NEVER)
#: the first tick's clock (any epoch ms; only differences matter)
START_MS = 1_700_000_000_000


def mean_gap_ms(pods: list[TracePod]) -> int:
    """The trace's mean time between arrivals (creation times), at least 1 ms."""
    times = [p.creation_time for p in pods if p.creation_time is not None]
    if len(times) < 2:
        return 1000
    return max(1, (max(times) - min(times)) * 1000 // len(times))


def run_per_tick(
    nodes: list[Node],
    pods: list[TracePod],
    *,
    per_tick: int,
    seed: int,
    workload: str,
    policy: Policy,
    tune: float = 1.3,
    warm: bool = False,
    keep_placements: bool = False,
) -> RunResult:
    """The FGD procedure on the production path: N arrivals per `schedule()` tick."""
    capacity = WHOLE_GPU_MILLI * sum(1 for n in nodes for d in n.devices if d.healthy)
    sequence = arrivals(pods, seed, capacity, tune)
    shapes = {p.name: p.to_shape() for p in pods}
    pools = tuple(Pool(name) for name in sorted({n.pool for n in nodes}))
    snap_nodes = tuple(nodes)
    tick_ms = per_tick * mean_gap_ms(pods)
    histories: dict[str, ShapeHistory] = {}
    for pool in pools:
        members = [n for n in nodes if n.pool == pool.name]
        h = ShapeHistory.from_prior(members, policy.shape_half_life_s, START_MS)
        if warm:
            h.counts = {}
            for p in pods:
                h.observe(shapes[p.name], START_MS)
        histories[pool.name] = h
    curve_of = _Curve(capacity)
    allocated = 0
    failed = 0
    placements: list[tuple[str, Placement | None]] = []
    running: list[Running] = []
    start = time.perf_counter()
    for first in range(0, len(sequence), per_tick):
        now = START_MS + (first // per_tick) * tick_ms
        batch = sequence[first : first + per_tick]
        pending = []
        for k, pod in enumerate(batch):
            seq = first + k
            shape = shapes[pod.name]
            # what the portal's submit does: every arrival feeds the history of the pools
            # that may serve it (here the one pool) before the tick sees it
            for h in histories.values():
                h.observe(shape, now)
            # one team, one class: the queue goes by age, so arrival order is kept
            created = now - len(batch) + k
            pending.append(PendingRequest(f"{seq:08d}", TEAM.name, CLASS.name, shape, created))
        snap = Snapshot(
            now_ms=now,
            pools=pools,
            nodes=snap_nodes,
            running=tuple(running),
            pending=tuple(pending),
            teams=(TEAM,),
            classes=(CLASS,),
            workloads=tuple(h.to_workload(pool) for pool, h in histories.items()),
        )
        admitted: dict[str, tuple[Placement, str]] = {}
        for d in schedule(snap, now, policy):
            if d.kind is DecisionKind.PREEMPT:
                raise RuntimeError(f"tick at {now} preempted {d.attempt_id}; nothing may")
            if d.kind is DecisionKind.ADMIT and d.placement is not None:
                admitted[d.request_id] = (d.placement, d.pool)
        for req, pod in zip(pending, batch, strict=True):
            placement, where = admitted.get(req.id, (None, ""))
            if placement is None:
                failed += 1  # withdrawn: it did not fit in its tick
            else:
                allocated += pod.gpu_request_milli
                running.append(
                    Running(req.id, req.id, TEAM.name, CLASS.name, where, req.shape, placement, now)
                )
            if keep_placements:
                placements.append((pod.name, placement))
            curve_of.add(pod.gpu_request_milli, allocated)
    seconds = time.perf_counter() - start
    curve = curve_of.points()
    name = policy.packer if policy.packer != "default" else DEFAULT_POLICY
    return RunResult(name, seed, workload, curve, len(sequence), failed, seconds, placements)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def to_json(r: RunResult) -> str:
    return json.dumps(
        {
            "policy": r.policy,
            "seed": r.seed,
            "workload": r.workload,
            "alloc_at_100": r.alloc_at_100,
            "curve": {str(i): v for i, v in enumerate(r.curve)},
            "pods": r.pods,
            "failed": r.failed,
            "seconds": round(r.seconds, 3),
            "placements_per_s": round(r.pods / r.seconds, 1) if r.seconds > 0 else None,
            "peak_rss_mb": peak_rss_mb(),
        }
    )


def grants_text(placement: Placement | None) -> tuple[str, str]:
    if placement is None:
        return "", ""
    pod = placement.pods[0]
    return pod.node, ";".join(f"{g.device}:{g.milli}" for g in pod.grants)


def write_placements(path: Path, r: RunResult) -> None:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["seq", "pod", "node", "gpus"])
        for seq, (name, placement) in enumerate(r.placements):
            out.writerow([seq, name, *grants_text(placement)])


def published(workload: str) -> dict[str, list[float]]:
    """alloc at 100 % per FGD policy name for one workload, from the authors' results."""
    out: dict[str, list[float]] = defaultdict(list)
    if not EXPECTED.exists():
        return out
    with open(EXPECTED, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["workload"] == f"openb_pod_list_{workload}":
                out[row["sc_policy"]].append(float(row["100"]))
    return out


def mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):6.2f} ± {sd:4.2f}"


def table(results: list[RunResult]) -> str:
    lines = []
    for workload in sorted({r.workload for r in results}):
        pub = published(workload)
        lines.append(f"workload {workload}: alloc_at_100 (%), mean ± sd over seeds")
        lines.append(f"{'policy':<12} {'seeds':>5} {'ours':>15} {'published':>15} {'pods/s':>8}")
        for policy in dict.fromkeys(r.policy for r in results):
            runs = [r for r in results if r.policy == policy and r.workload == workload]
            ours = [r.alloc_at_100 for r in runs if r.alloc_at_100 is not None]
            rate = statistics.mean(r.pods / r.seconds for r in runs if r.seconds > 0)
            ref = pub.get(PUBLISHED_NAMES.get(policy, ""), [])
            lines.append(
                f"{policy:<12} {len(runs):>5} {mean_sd(ours):>15} {mean_sd(ref):>15} {rate:8.0f}"
            )
    return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part.strip()[1:]:
            lo, hi = part.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        elif part.strip():
            seeds.append(int(part))
    return seeds


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m scheduling.bench packing", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--json", action="store_true", help="print JSON lines (always on; kept for scripts)"
    )
    ap.add_argument("--nodes", default=str(DEFAULT_NODES))
    ap.add_argument("--pods", default=str(DEFAULT_PODS))
    ap.add_argument(
        "--policy",
        default=None,
        help=f"one of {', '.join(POLICIES)}, default, or all (default: the default packer;"
        " with --per-tick, Policy()'s)",
    )
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seeds", default=None, help="e.g. 42-51 or 42,43")
    ap.add_argument("--tie-break", default="name", choices=TIE_BREAKS)
    ap.add_argument("--replicate", type=int, default=1)
    ap.add_argument("--placements", default=None)
    ap.add_argument("--tune", type=float, default=1.3, help="inflate to this × GPU capacity")
    ap.add_argument(
        "--limit", type=int, default=0, help="use only the first N pods by name (tests)"
    )
    ap.add_argument(
        "--per-tick",
        type=int,
        default=0,
        help="submit N requests per schedule() tick with Policy() (the production path)",
    )
    ap.add_argument(
        "--half-life-s",
        type=int,
        default=None,
        help="--per-tick: the shape history's half-life (default Policy().shape_half_life_s)",
    )
    ap.add_argument(
        "--warm",
        action="store_true",
        help="--per-tick: start the shape history from the whole trace instead of the prior",
    )
    args = ap.parse_args(argv)
    if args.per_tick < 0:
        print("--per-tick must be at least 1", file=sys.stderr)
        return 2

    if args.policy is None:
        policies = [Policy().packer if args.per_tick else DEFAULT_POLICY]
    elif args.policy == "all":
        policies = list(ALL_POLICIES)
    elif args.policy == "default":
        policies = [DEFAULT_POLICY]
    elif args.policy in POLICIES:
        policies = [args.policy]
    else:
        print(f"unknown policy {args.policy!r}", file=sys.stderr)
        return 2
    seeds = parse_seeds(args.seeds) if args.seeds else [args.seed if args.seed is not None else 42]
    nodes = replicate(load_nodes(args.nodes), max(1, args.replicate))
    pods = load_pods(args.pods)
    if args.limit:
        pods = sorted(pods, key=lambda p: p.name)[: args.limit]
    workload = workload_name(args.pods)
    results: list[RunResult] = []
    for policy in policies:
        for seed in seeds:
            if args.per_tick:
                prod = Policy() if args.policy is None else Policy(packer=policy)
                if args.half_life_s is not None:
                    prod = replace(prod, shape_half_life_s=args.half_life_s)
                r = run_per_tick(
                    nodes,
                    pods,
                    per_tick=args.per_tick,
                    seed=seed,
                    workload=workload,
                    policy=prod,
                    tune=args.tune,
                    warm=args.warm,
                    keep_placements=args.placements is not None,
                )
            else:
                r = run_once(
                    nodes,
                    pods,
                    policy=policy,
                    seed=seed,
                    tie_break=args.tie_break,
                    workload=workload,
                    tune=args.tune,
                    keep_placements=args.placements is not None,
                )
            results.append(r)
            print(to_json(r), flush=True)
            if args.placements:
                path = Path(args.placements)
                if len(policies) * len(seeds) > 1:
                    path = path.with_name(f"{path.stem}-{policy}-{seed}{path.suffix}")
                write_placements(path, r)
    if len(seeds) > 1:
        print(table(results), file=sys.stderr)
    return 0
