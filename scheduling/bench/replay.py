"""Replay benchmark: the openb trace's request shapes under drawn arrivals, through `schedule()`.

`python -m scheduling.bench replay --json [--nodes CSV] [--pods CSV] [--every K] [--jobs N]
[--load L] [--teams T] [--seed S] [--tick-s D] [--estimates exact|over3|none]`

The openb pod list is a snapshot made for packing studies, not a load trace, so the
replay keeps its request shapes and runtimes and draws the arrivals. Procedure:

1. **Cluster**: every K-th node of `openb_node_list_gpu_node.csv` (default K = 8: 152
   nodes, 770 GPUs), loaded with `scheduling.trace.load_nodes` (one pool, `openb`).
2. **Jobs**: N (default 30,000) rows drawn with replacement (seeded) from the rows of
   `openb_pod_list_default.csv` that have both `scheduled_time` and `deletion_time` and
   whose shape fits at least one node of the cluster when it is empty (so that no
   policy is stuck on an impossible request). Each keeps its CPU, memory, GPU count,
   milli share, `gpu_spec` and `qos` (`TracePod.to_shape`); its runtime is
   `deletion_time - scheduled_time`, capped at 6 hours.
3. **Arrivals**: a Poisson process whose rate makes the offered load — arrival rate ×
   mean requested GPU-time per job ÷ GPU capacity — equal L % (default 90).
4. **Teams**: T (default 5), assigned by CRC-32 of the pod name, equal weights, nominal
   quotas summing to the capacity, borrowing allowed without limit. Classes come from
   `qos`: LS → inference, BE → training, the rest interactive (`REPLAY_CLASSES`).
5. **Policies**, side by side on the same jobs and arrivals:
   - `k8s-default`: strict FIFO, whole devices only (a shared request takes a whole
     GPU), first fit in node order, no quotas, no preemption; it places on every event;
   - `quartermaster`: `schedule()` called the way the portal's tick calls it — only
     pending requests in the snapshot, running ones as `Running`, the decayed team
     usage as `TeamUsage` — on a clock of D seconds (default 10) whenever something
     happened since the last tick (an arrival, a departure, a requeue coming due).
     The policy is `Policy()` except `preempt_after_s = 300` and
     `max_victim_loss_gpu_s = 7200` (`REPLAY_*`). ADMIT starts the job at the tick; PREEMPT stops it at once (all work since its
     start is lost: the trace has no checkpoints) and requeues it with
     `requeue_delay_s(attempt, 60, 3600, jitter)`. Like the portal, it admits a request
     whose last decision was `preempting` with `Running.admitted_by_preemption`.
     **Runtime estimates** (`--estimates`): by default (`exact`) every request carries
     its true runtime as `PendingRequest.expected_runtime_ms` and every attempt
     `Running.expected_end_ms = start + runtime` — a *perfect* estimate, which no real
     user gives, so this is the best case for the reservation rule (nodes expected to
     drain soonest) and for EASY backfill onto reserved nodes; `over3` multiplies each
     runtime by U(1, 3) (users over-estimate), `none` gives no estimates (the rule
     without them: nodes untouched longest, no backfill on reserved nodes).
6. **Measurement**: the window runs from the arrival of job N/5 (after warm-up) to the
   last arrival. Utilization is the requested GPU-time (milli share × time) running in
   the window over capacity × window. A job's wait runs from its arrival to its first
   start; the replay goes on until every job has started. `jain` is Jain's index over
   teams of received ÷ entitled GPU-time in the window (entitled = the team's nominal
   share of capacity × window). `preemptions` and `gpu_hours_lost` count the stopped
   attempts and their lost work; `decisions_per_s` is decisions (k8s-default:
   placement attempts) per second spent inside the policy's scheduling function.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from scheduling.backoff import decay_usage, interval_usage, requeue_delay_s
from scheduling.cycle import schedule
from scheduling.trace import TRACE_POOL, TracePod, load_nodes, load_pods
from scheduling.types import (
    DecisionKind,
    Node,
    Partitioning,
    PendingRequest,
    Placement,
    Policy,
    Pool,
    PreemptionPolicy,
    Quota,
    Running,
    Shape,
    Snapshot,
    Team,
    TeamUsage,
    WorkloadClass,
)

TRACE_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "alibaba-gpu-v2023"
RUNTIME_CAP_S = 6 * 3600

REPLAY_CLASSES = (
    WorkloadClass(
        "inference",
        band=300,
        preemption=PreemptionPolicy.NEVER,
        max_queue_s=1800,
        inference=True,
    ),
    WorkloadClass(
        "interactive",
        band=200,
        preemption=PreemptionPolicy.WHEN_BORROWING,
        min_runtime_s=600,
        max_queue_s=3600,
    ),
    WorkloadClass(
        "training",
        band=100,
        preemption=PreemptionPolicy.ALWAYS,
        min_runtime_s=600,
        max_queue_s=6 * 3600,
    ),
)
QOS_CLASS = {"LS": "inference", "BE": "training"}
#: the replay's tuned knobs (everything else is `Policy()`): an entitled request first
#: waits this long for natural departures (one every few seconds at this size) before it
#: preempts anybody, and no victim may lose more than 2 GPU-hours (the trace has no
#: checkpoints, so every preemption loses all work since the start)
REPLAY_PREEMPT_AFTER_S = 300
REPLAY_MAX_VICTIM_LOSS_GPU_S = 2 * 3600


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    team: str
    cls: str
    shape: Shape
    runtime_ms: int
    arrival_ms: int
    #: the runtime the scheduler is told (None = no estimate); see `with_estimates`
    estimate_ms: int | None = None


@dataclass(slots=True)
class Outcome:
    """What one policy did to the jobs."""

    first_start_ms: dict[str, int] = field(default_factory=dict)
    #: (team, milli, start_ms, end_ms) of every attempt
    intervals: list[tuple[str, int, int, int]] = field(default_factory=list)
    preemptions: int = 0
    lost_milli_ms: int = 0
    decisions: int = 0
    seconds: float = 0.0


def draw_jobs(
    pods: Sequence[TracePod], nodes: Sequence[Node], n: int, load_pct: float, teams: int, seed: int
) -> tuple[list[Job], int]:
    """Return N jobs with Poisson arrivals for the offered load, and the GPU capacity (milli)."""
    usable = [p for p in pods if p.scheduled_time is not None and p.deletion_time is not None]
    usable = [p for p in usable if any(_could_host(node, p.to_shape()) for node in nodes)]
    rng = random.Random(seed)
    drawn = [rng.choice(usable) for _ in range(n)]
    capacity = sum(1000 * len(node.devices) for node in nodes)
    runtimes = [_runtime_ms(p) for p in drawn]
    mean_gpu_ms = sum(p.to_shape().gpus_milli * r for p, r in zip(drawn, runtimes, strict=True)) / n
    rate_per_ms = load_pct / 100 * capacity / mean_gpu_ms
    jobs: list[Job] = []
    t = 0.0
    for i, (pod, runtime) in enumerate(zip(drawn, runtimes, strict=True)):
        t += rng.expovariate(rate_per_ms)
        team = f"team-{zlib.crc32(pod.name.encode()) % teams}"
        cls = QOS_CLASS.get(pod.qos, "interactive")
        jobs.append(Job(f"job-{i:06d}", team, cls, pod.to_shape(), runtime, int(t)))
    return jobs, capacity


def with_estimates(jobs: Sequence[Job], mode: str, seed: int) -> list[Job]:
    """Return the jobs with the runtime estimate the scheduler is told.

    `exact`: the true runtime (a perfect estimate, which real users never give);
    `over3`: the true runtime × U(1, 3), drawn per job from its own seeded stream (users
    over-estimate, never under-estimate); `none`: no estimate (the rule without them).
    """
    if mode == "none":
        return [replace(j, estimate_ms=None) for j in jobs]
    if mode == "exact":
        return [replace(j, estimate_ms=j.runtime_ms) for j in jobs]
    if mode == "over3":
        rng = random.Random(seed + 7919)
        return [replace(j, estimate_ms=int(j.runtime_ms * rng.uniform(1, 3))) for j in jobs]
    raise ValueError(f"unknown estimate mode {mode!r}")


def _runtime_ms(pod: TracePod) -> int:
    assert pod.deletion_time is not None and pod.scheduled_time is not None
    return max(1, min(pod.deletion_time - pod.scheduled_time, RUNTIME_CAP_S)) * 1000


def _could_host(node: Node, shape: Shape) -> bool:
    if node.cpu_milli < shape.cpu_milli or node.memory_mib < shape.memory_mib:
        return False
    fit = [d for d in node.devices if not shape.gpu_models or d.model in shape.gpu_models]
    return len(fit) >= shape.count


# -- k8s-default --------------------------------------------------------------------------


def run_baseline(nodes: Sequence[Node], jobs: Sequence[Job]) -> Outcome:
    """Strict FIFO, whole devices, first fit in node order, no quotas, no preemption."""
    out = Outcome()
    free_gpu = [[d.model for d in n.devices] for n in nodes]
    free_cpu = [n.cpu_milli for n in nodes]
    free_mem = [n.memory_mib for n in nodes]
    queue: list[Job] = []
    head = 0
    ends: list[tuple[int, int, int, list[int]]] = []  # (end, seq, node, gpu models taken)
    seq = 0
    i = 0
    while i < len(jobs) or head < len(queue):
        t_arr = jobs[i].arrival_ms if i < len(jobs) else math.inf
        t_end = ends[0][0] if ends else math.inf
        now = int(min(t_arr, t_end))
        while ends and ends[0][0] <= now:
            _, _, k, taken = heapq.heappop(ends)
            job = jobs[taken[0]]
            free_gpu[k].extend(nodes[k].devices[x].model for x in taken[1:])
            free_cpu[k] += job.shape.cpu_milli
            free_mem[k] += job.shape.memory_mib
        while i < len(jobs) and jobs[i].arrival_ms <= now:
            queue.append(jobs[i])
            i += 1
        started = time.perf_counter()
        while head < len(queue):
            job = queue[head]
            out.decisions += 1
            k, picked = _first_fit(nodes, free_gpu, free_cpu, free_mem, job.shape)
            if k < 0:
                break
            head += 1
            free_cpu[k] -= job.shape.cpu_milli
            free_mem[k] -= job.shape.memory_mib
            index = int(job.id.rsplit("-", 1)[1])
            heapq.heappush(ends, (now + job.runtime_ms, seq, k, [index, *picked]))
            seq += 1
            out.first_start_ms[job.id] = now
            out.intervals.append((job.team, job.shape.gpus_milli, now, now + job.runtime_ms))
        out.seconds += time.perf_counter() - started
    return out


def _first_fit(
    nodes: Sequence[Node],
    free_gpu: list[list[str]],
    free_cpu: list[int],
    free_mem: list[int],
    shape: Shape,
) -> tuple[int, list[int]]:
    want = shape.count  # a shared slice takes a whole device
    for k, node in enumerate(nodes):
        if free_cpu[k] < shape.cpu_milli or free_mem[k] < shape.memory_mib:
            continue
        models = free_gpu[k]
        ok = [j for j, m in enumerate(models) if not shape.gpu_models or m in shape.gpu_models]
        if len(ok) < want:
            continue
        picked = ok[:want]
        taken_models = [models[j] for j in picked]
        for j in reversed(picked):
            models.pop(j)
        # Remember which device indexes of the node's model list were taken (by model).
        idx = [next(x for x, d in enumerate(node.devices) if d.model == m) for m in taken_models]
        return k, idx
    return -1, []


# -- quartermaster --------------------------------------------------------------------------


@dataclass(slots=True)
class _Sim:
    nodes: tuple[Node, ...]
    jobs: dict[str, Job]
    teams: tuple[Team, ...]
    quotas: tuple[Quota, ...]
    policy: Policy
    rng: random.Random
    pending: dict[str, PendingRequest] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)
    out: Outcome = field(default_factory=Outcome)
    #: (time, seq, kind, id): kind 0 = departure, 1 = requeue due, 2 = wake
    events: list[tuple[int, int, int, str]] = field(default_factory=list)
    seq: int = 0
    #: requests whose last decision was "preempting": admitted with admitted_by_preemption
    preemptors: set[str] = field(default_factory=set)

    def push(self, t: int, kind: int, ident: str) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, ident))
        self.seq += 1

    def end(self, attempt: str, now: int, preempted: bool) -> None:
        run = self.running.pop(attempt)
        milli = run.shape.gpus_milli
        self.out.intervals.append((run.team, milli, run.started_at_ms, now))
        value, as_of = self.usage.get(run.team, (0, now))
        h = self.policy.usage_half_life_s
        value = decay_usage(value, now - as_of, h) + interval_usage(
            milli, run.started_at_ms, now, now, h
        )
        self.usage[run.team] = (value, now)
        if preempted:
            self.out.preemptions += 1
            self.out.lost_milli_ms += milli * (now - run.started_at_ms)

    def tick(self, now: int) -> None:
        snap = Snapshot(
            now_ms=now,
            pools=(Pool(TRACE_POOL, Partitioning.TIME_SLICING),),
            nodes=self.nodes,
            running=tuple(self.running.values()),
            pending=tuple(self.pending.values()),
            teams=self.teams,
            quotas=self.quotas,
            classes=REPLAY_CLASSES,
            usage=tuple(TeamUsage(t, v, a) for t, (v, a) in self.usage.items()),
        )
        started = time.perf_counter()
        decisions = schedule(snap, now, self.policy)
        self.out.seconds += time.perf_counter() - started
        self.out.decisions += len(decisions)
        woke = False
        for d in decisions:
            if d.kind is DecisionKind.ADMIT:
                self.admit(d.request_id, d.placement, now)
            elif d.kind is DecisionKind.PREEMPT:
                self.preempt(d.attempt_id, now)
                woke = True
            elif d.kind is DecisionKind.WAIT:
                if d.code == "preempting":
                    self.preemptors.add(d.request_id)
                else:
                    self.preemptors.discard(d.request_id)
            elif d.kind is DecisionKind.REJECT:
                raise RuntimeError(f"replay job {d.request_id} rejected: {d.message}")
        if woke:
            self.push(now + 1, 2, "")

    def admit(self, request_id: str, placement: Placement | None, now: int) -> None:
        req = self.pending.pop(request_id)
        job = self.jobs[request_id]
        n = self.attempts.get(request_id, 0) + 1
        self.attempts[request_id] = n
        attempt = f"{request_id}#{n}"
        assert placement is not None
        self.running[attempt] = Running(
            request_id,
            attempt,
            req.team,
            req.workload_class,
            TRACE_POOL,
            req.shape,
            placement,
            now,
            admitted_by_preemption=request_id in self.preemptors,
            expected_end_ms=None if job.estimate_ms is None else now + job.estimate_ms,
        )
        self.preemptors.discard(request_id)
        self.out.first_start_ms.setdefault(request_id, now)
        self.push(now + job.runtime_ms, 0, attempt)

    def preempt(self, attempt: str, now: int) -> None:
        run = self.running[attempt]
        self.end(attempt, now, preempted=True)
        job = self.jobs[run.request_id]
        n = self.attempts[run.request_id]
        delay = requeue_delay_s(n, 60, 3600, self.rng.uniform(0, 6))
        due = now + int(delay * 1000)
        self.pending[run.request_id] = PendingRequest(
            job.id,
            job.team,
            job.cls,
            job.shape,
            job.arrival_ms,
            attempts=n,
            not_before_ms=due,
            expected_runtime_ms=job.estimate_ms,
        )
        self.push(due, 1, run.request_id)


def run_quartermaster(
    nodes: Sequence[Node], jobs: Sequence[Job], capacity: int, teams: int, tick_ms: int, seed: int
) -> Outcome:
    names = tuple(f"team-{i}" for i in range(teams))
    share, rest = divmod(capacity, teams)
    quotas = tuple(
        Quota(t, TRACE_POOL, share + (rest if i == 0 else 0)) for i, t in enumerate(names)
    )
    sim = _Sim(
        nodes=tuple(nodes),
        jobs={j.id: j for j in jobs},
        teams=tuple(Team(t) for t in names),
        quotas=quotas,
        policy=Policy(
            seed=seed,
            preempt_after_s=REPLAY_PREEMPT_AFTER_S,
            max_victim_loss_gpu_s=REPLAY_MAX_VICTIM_LOSS_GPU_S,
        ),
        rng=random.Random(seed + 1),
    )
    i = 0
    while i < len(jobs) or sim.pending or sim.events:
        t_next = min(
            jobs[i].arrival_ms if i < len(jobs) else math.inf,
            sim.events[0][0] if sim.events else math.inf,
        )
        if t_next == math.inf:
            raise RuntimeError(f"{len(sim.pending)} requests pending with nothing left to happen")
        now = int(math.ceil(t_next / tick_ms) * tick_ms) if tick_ms > 0 else int(t_next)
        while sim.events and sim.events[0][0] <= now:
            t, _, kind, ident = heapq.heappop(sim.events)
            if kind == 0 and ident in sim.running:
                sim.end(ident, t, preempted=False)
        while i < len(jobs) and jobs[i].arrival_ms <= now:
            job = jobs[i]
            sim.pending[job.id] = PendingRequest(
                job.id,
                job.team,
                job.cls,
                job.shape,
                job.arrival_ms,
                expected_runtime_ms=job.estimate_ms,
            )
            i += 1
        if sim.pending:
            sim.tick(now)
    return sim.out


# -- measurement ---------------------------------------------------------------------------


def measure(out: Outcome, jobs: Sequence[Job], capacity: int, teams: int) -> dict[str, float]:
    w0 = jobs[len(jobs) // 5].arrival_ms
    w1 = jobs[-1].arrival_ms
    span = max(w1 - w0, 1)
    received: dict[str, float] = {f"team-{i}": 0.0 for i in range(teams)}
    total = 0.0
    for team, milli, start, end in out.intervals:
        overlap = max(0, min(end, w1) - max(start, w0))
        total += milli * overlap
        received[team] = received.get(team, 0.0) + milli * overlap
    entitled = capacity * span / teams
    ratios = [r / entitled for r in received.values()]
    jain = sum(ratios) ** 2 / (len(ratios) * sum(x * x for x in ratios)) if any(ratios) else 0.0
    waits = sorted((out.first_start_ms[j.id] - j.arrival_ms) / 1000 for j in jobs)
    return {
        "utilization": round(100 * total / (capacity * span), 2),
        "wait_mean_s": round(sum(waits) / len(waits), 1),
        "wait_p95_s": round(_pct(waits, 95), 1),
        "wait_p99_s": round(_pct(waits, 99), 1),
        "wait_max_s": round(waits[-1], 1),
        "jain": round(jain, 4),
        "preemptions": out.preemptions,
        "gpu_hours_lost": round(out.lost_milli_ms / 1000 / 3_600_000, 2),
        "decisions_per_s": round(out.decisions / out.seconds, 1) if out.seconds else 0.0,
    }


def _pct(sorted_values: Sequence[float], pct: int) -> float:
    k = max(0, math.ceil(pct / 100 * len(sorted_values)) - 1)
    return sorted_values[k]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.bench replay")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--nodes", default=str(TRACE_DIR / "openb_node_list_gpu_node.csv"))
    parser.add_argument("--pods", default=str(TRACE_DIR / "openb_pod_list_default.csv"))
    parser.add_argument("--every", type=int, default=8, help="keep every K-th node")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--load", type=float, default=90.0, help="offered load, %% of GPU capacity")
    parser.add_argument("--teams", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tick-s", type=float, default=10.0, help="tick period; 0 = every event")
    parser.add_argument("--policies", default="quartermaster,k8s-default")
    parser.add_argument(
        "--estimates",
        default="exact",
        choices=("exact", "over3", "none"),
        help="runtime estimates given to quartermaster: exact (perfect), over3 (x U(1,3)), none",
    )
    args = parser.parse_args(list(argv))
    nodes = load_nodes(args.nodes)[:: args.every]
    jobs, capacity = draw_jobs(
        load_pods(args.pods), nodes, args.jobs, args.load, args.teams, args.seed
    )
    jobs = with_estimates(jobs, args.estimates, args.seed)
    result: dict[str, object] = {
        "offered_load": args.load,
        "estimates": args.estimates,
        "gpus": capacity // 1000,
        "jobs": len(jobs),
    }
    policies: dict[str, dict[str, float]] = {}
    for name in args.policies.split(","):
        if name == "quartermaster":
            out = run_quartermaster(
                nodes, jobs, capacity, args.teams, int(args.tick_s * 1000), args.seed
            )
        elif name == "k8s-default":
            out = run_baseline(nodes, jobs)
        else:
            parser.error(f"unknown policy {name!r}")
        policies[name] = measure(out, jobs, capacity, args.teams)
    result["policies"] = policies
    if args.json:
        print(json.dumps(result))
    else:
        for name, m in policies.items():
            print(name, " ".join(f"{k}={v}" for k, v in m.items()))
    return 0
