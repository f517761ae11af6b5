"""Replay benchmark: the openb trace's request shapes under drawn arrivals, one set of jobs
for every policy, so Quartermaster is measured against what a user would pick instead.

`python -m scheduling.bench replay --json [--policies a,b,...] [--load L] [--seed S]
[--estimates over3|exact|none] [--checkpoint-s C] [--profile NAME|FILE] [--nodes CSV]
[--pods CSV] [--every K] [--jobs N] [--teams T] [--tick-s D] [--probe-overruns]`

The openb pod list is a snapshot made for packing studies, not a load trace, so the
replay keeps its request shapes and runtimes and draws the arrivals. Procedure:

1. **Cluster**: every K-th node of `openb_node_list_gpu_node.csv` (default K = 8: 152
   nodes, 770 GPUs), loaded with `scheduling.trace.load_nodes` (one pool, `openb`, every
   GPU time-sliced).
2. **Jobs**: N (default 30,000) rows drawn with replacement (seeded) from the rows of
   `openb_pod_list_default.csv` that have both `scheduled_time` and `deletion_time` and
   whose shape fits at least one node of the cluster when it is empty
   (`scheduling.fit.can_ever_host`, so no policy is stuck on an impossible request).
   Each keeps its CPU, memory, GPU count, milli share, `gpu_spec` and `qos`
   (`TracePod.to_shape`); its runtime is `deletion_time - scheduled_time`, capped at 6 h.
3. **Arrivals**: a Poisson process whose rate makes the offered load — arrival rate ×
   mean requested GPU-time per job ÷ GPU capacity — equal L % (default 90).
   `offered_load_whole_gpus` is the same load counted as whole-device schedulers see it
   (a shared slice holds a whole GPU).
4. **Teams**: T (default 5), assigned by CRC-32 of the pod name, equal weights, nominal
   quotas summing to the capacity, borrowing allowed without limit. Classes come from
   `qos`: LS → inference (band 300, never preempted), BE → training (band 100), the rest
   interactive (band 200, preemptible while its team borrows) (`REPLAY_CLASSES`); the
   baselines use the bands as pod priorities.
5. **Runtime estimates** (`--estimates`, default `over3`): `over3` tells the scheduler
   the true runtime × U(1, 3) (users over-estimate); `exact` the true runtime (a perfect
   estimate no user gives); `none` nothing. Only `quartermaster` reads them.
   **Checkpoints** (`--checkpoint-s`, default 1800): training jobs write a checkpoint
   every C seconds of their run, the other classes never (`with_checkpoints`; 0 = no
   job checkpoints). A preempted attempt keeps the work up to its last checkpoint — its
   retry runs only what is left — and loses the rest; it is requeued.
6. **Policies** (`--policies`, default all five), on the same jobs and arrivals.
   - `fifo-strict`: strict FIFO with head-of-line blocking, whole devices only (a shared
     request takes a whole GPU), first fit in node order, no quotas, no preemption. No
     real scheduler behaves like this; it is the floor.
   - `kube-scheduler`: the default kube-scheduler with NVIDIA's device plugin
     (kubernetes.io/docs/concepts/scheduling-eviction/: "Pod Priority and Preemption",
     "Scheduling Framework", "Resource Bin Packing"; NVIDIA k8s-device-plugin). The
     active queue is ordered by priority (the band), then arrival. A pod that does not
     fit goes to the unschedulable queue and is retried when a pod ends (no
     head-of-line blocking; a retry can only succeed on the node that freed room, so it
     is tried there). Whole devices only: `nvidia.com/gpu` is an integer extended
     resource, so a fractional request takes a whole GPU (the device plugin offers no
     MIG in this trace). Node choice: NodeResourcesFit `LeastAllocated` with the
     default CPU and memory weights 1:1, ties to the first node. No quotas. Preemption
     by priority only (PostFilter, DefaultPreemption): on the node where stopping pods
     of lower priority makes it fit, the fewest and lowest-priority victims (victims
     put back highest priority first while it still fits), the node with the lowest
     highest victim priority, then fewest victims. PostFilter runs for a pod's first
     attempt and, after each pod end, for the highest-priority pod still waiting.
   - `kueue`: Kueue's defaults on kube-scheduler (kueue.sigs.k8s.io/docs/concepts/:
     "Cluster Queue", "Preemption", "Fair Sharing"). One ClusterQueue per team, all in
     one cohort, each with the team's nominal quota in whole GPUs (the same nominal
     quotas Quartermaster gets), unlimited borrowing. `BestEffortFIFO`: inside a
     ClusterQueue by priority then creation; an inadmissible workload does not block
     the next. Fair sharing on: ClusterQueue heads go lowest dominant resource share
     (usage above nominal ÷ the cohort's lendable quota) first. Preemption
     `withinClusterQueue: LowerPriority`, `reclaimWithinCohort: Any`: a workload that
     does not fit the quota may preempt, in Kueue's candidate order (other
     ClusterQueues' workloads first — only while their ClusterQueue borrows, and only
     if the preemptor stays within its nominal —, lower priority first, most recently
     admitted first), the minimal set that makes quota fit (and, so that the victims
     do not lose their work for nothing, the pods fit on a node). Admission here also
     requires the pods to fit a node now (kube-scheduler binds them at once; Kueue
     itself does not look at nodes). Whole devices; `LeastAllocated` as kube-scheduler.
   - `binpack`: HAMi / Volcano-style GPU sharing (github.com/Project-HAMi/HAMi:
     `nvidia.com/gpucores`, node and GPU scheduler policy `binpack`; volcano.sh "binpack
     plugin"). Fractional requests share a device by compute share (and GPU memory when
     a cap is given), MostAllocated: the node with the least GPU left after placement
     (then CPU), the fullest device that fits. FIFO by arrival without head-of-line
     blocking, no quotas, no preemption.
   - `quartermaster`: `schedule()` called the way the portal's tick calls it (the replay
     simulator, `scheduling.simulate`) — only
     pending requests in the snapshot, running ones as `Running`, the decayed team
     usage as `TeamUsage`, each attempt's last checkpoint as `last_checkpoint_ms` — with
     the `Policy` of a scheduling profile (`--profile`, default the shipped
     `scheduling/profiles/default.toml`, which the portal loads as its active profile; no
     knob is set here), on a clock of D
     seconds (default 10) whenever something happened since the last tick. ADMIT starts
     the job at the tick; PREEMPT stops it at once and requeues it with
     `requeue_delay_s(attempt, 60, 3600, jitter)`. Like the portal, a request whose last
     decision was `preempting` is passed with `PendingRequest.preempting` and admitted
     with `Running.admitted_by_preemption`. The simulator keeps one `ClusterState`
     across ticks instead of the portal's one per tick (`schedule(state=...)`): the
     same decisions, less CPU.
   The baselines place at every event (no tick), which favours them slightly.
7. **Measurement**: the window runs from the arrival of job N/5 (after warm-up) to the
   last arrival; the replay goes on until every job has started.
   - `utilization`: requested GPU-time (milli share × time) running in the window ÷
     capacity × window; `useful_utilization` the same for work that was not thrown
     away (a preempted attempt counts up to its last checkpoint);
   - waits run from arrival to first start: `wait_mean_s`, `wait_p95_s`, `wait_p99_s`,
     `wait_max_s`, and `wait_p95_large_s` over requests of 8 or more GPUs;
   - the queue-time promise (`scheduling.slo`), over every job: `slo_attainment`, the
     share that started within their class's `max_queue_s` (`REPLAY_CLASSES`: inference
     1,800 s, interactive 3,600 s, training 21,600 s), and `slo_overrun_max_s`, the
     longest wait beyond it; the same per class as `slo_attainment_<class>` and
     `slo_overrun_max_s_<class>`; for Quartermaster, `quartermaster_overruns` (beside
     `policies`): the requests that overran, per cause (`scheduling.simulate.held_by`:
     what its decisions said once its promise was due — pool overloaded, the tick's
     preemption cap, quota, no allowed victim set, victims stopping — counted under the
     one said most often), with their longest overrun; with `--probe-overruns`, also
     `quartermaster_overruns_alone`: the overruns split by whether, at some tick past
     its promise, the tick would have started the request (or preempted for it) had it
     been the only one pending (`scheduling.simulate.alone`) — "startable alone", with
     the longest wait after a request first was — or never ("never startable alone": no
     room and no victim set the rules allow, even for it alone); "lost a chance": those
     that, at such a tick, saw the room or victims they needed go to a request not past
     its own starvation bound, or to none; and the ten longest;
   - `jain`: Jain's index over teams of received ÷ entitled GPU-time in the window
     (entitled = nominal share × capacity × window);
   - `share_error`: per 1-hour window, the teams with demand are those with a request
     waiting at least 5 minutes inside it (`DEMAND_WAIT_MS`; waiting for the next tick is
     no unmet demand); entitlements are max-min fair (equal weights): a team without
     demand is entitled to what it used up to the level every demanding team gets;
     the mean over demanding teams of |received − entitlement| ÷ window capacity,
     averaged over the windows (a fraction of capacity: 0.05 = 5 points);
   - `preemptions` and `gpu_hours_lost` count the stopped attempts and their work since
     their last checkpoint (or start), over the whole replay; `gpu_hours_delivered` is
     all GPU-time given to attempts over the whole replay, the base for `gpu_hours_lost`;
     `decisions_per_s` is decisions (baselines: placement attempts) per second spent
     inside the policy's scheduling code.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gc
import heapq
import json
import math
import random
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from scheduling.cycle import remembering
from scheduling.fit import can_ever_host
from scheduling.profile import DEFAULT_PROFILE, ProfileError
from scheduling.profile import load as load_profile
from scheduling.simulate import (
    REPLAY_CLASSES,
    Job,
    Outcome,
    Simulation,
    drive,
    overrun_cause,
    record_stop,
)
from scheduling.slo import promises
from scheduling.trace import TRACE_POOL, TracePod, load_nodes, load_pods
from scheduling.types import WHOLE_GPU_MILLI, Node, Policy, ProfileKind, Quota, Shape, Team
from scheduling.workload import ShapeHistory

TRACE_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "alibaba-gpu-v2023"
RUNTIME_CAP_S = 6 * 3600
POLICIES = ("fifo-strict", "kube-scheduler", "kueue", "binpack", "quartermaster")
#: requests of at least this many GPUs count as large (`wait_p95_large_s`)
LARGE_MILLI = 8 * WHOLE_GPU_MILLI
SHARE_WINDOW_MS = 3600 * 1000
#: a team has demand in a window when one of its requests waited this long inside it (a
#: wait for the next tick is no unmet demand)
DEMAND_WAIT_MS = 300 * 1000

QOS_CLASS = {"LS": "inference", "BE": "training"}
#: classes whose jobs checkpoint (`--checkpoint-s`): batch training does, notebooks and
#: inference servers have nothing to resume from
CHECKPOINTING = ("training",)
#: the default checkpoint interval of training jobs, seconds
CHECKPOINT_S = 1800
BAND = {c.name: c.band for c in REPLAY_CLASSES}
#: the bands, lowest first
BANDS = sorted(set(BAND.values()))
#: each class's queue-time promise, seconds (`slo_attainment`)
MAX_QUEUE_S = {c.name: c.max_queue_s for c in REPLAY_CLASSES}


def draw_jobs(
    pods: Sequence[TracePod], nodes: Sequence[Node], n: int, load_pct: float, teams: int, seed: int
) -> tuple[list[Job], int]:
    """Return N jobs with Poisson arrivals for the offered load, and the GPU capacity (milli)."""
    usable = [p for p in pods if p.scheduled_time is not None and p.deletion_time is not None]
    usable = [p for p in usable if any(can_ever_host(node, p.to_shape()) for node in nodes)]
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


def whole_milli(shape: Shape) -> int:
    """GPU milli a whole-device scheduler holds for the shape (a slice takes a whole GPU)."""
    return shape.count * shape.pods * WHOLE_GPU_MILLI


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


def with_checkpoints(jobs: Sequence[Job], interval_s: int) -> list[Job]:
    """Return the jobs with their checkpoint interval: training jobs (the classes that are
    preempted whenever a stronger claim comes) checkpoint every `interval_s` seconds, the
    others never; 0 = no job checkpoints."""
    ms = interval_s * 1000 if interval_s > 0 else None
    return [replace(j, checkpoint_ms=ms if j.cls in CHECKPOINTING else None) for j in jobs]


def _runtime_ms(pod: TracePod) -> int:
    assert pod.deletion_time is not None and pod.scheduled_time is not None
    return max(1, min(pod.deletion_time - pod.scheduled_time, RUNTIME_CAP_S)) * 1000


# -- fifo-strict --------------------------------------------------------------------------


def run_fifo_strict(nodes: Sequence[Node], jobs: Sequence[Job]) -> Outcome:
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
            out.waiting.append((job.team, job.arrival_ms, now))
            out.intervals.append((job.team, job.shape.gpus_milli, now, now + job.runtime_ms, True))
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


# -- kube-scheduler, kueue, binpack ---------------------------------------------------------


@dataclass(slots=True)
class _Att:
    """A running attempt in the light simulator."""

    id: str
    job: Job
    node: int
    grants: tuple[tuple[int, int], ...]
    start: int
    #: GPU milli the quota counts (kueue): whole devices
    quota: int


def _recent_first(att: _Att) -> tuple[int, str]:
    """Kueue's candidate order within a queue and band: most recently admitted first."""
    return (-att.start, att.id)


@dataclass(slots=True)
class _LNode:
    node: Node
    cpu: int
    mem: int
    #: free milli per device position
    free: list[int]
    running: set[str] = field(default_factory=set)
    #: bumped by every start and stop on the node (`_Light._victims` remembers by it)
    version: int = 0


@dataclass(frozen=True, slots=True)
class Mode:
    """How a baseline behaves (see the module docstring)."""

    #: "priority" (band, then arrival) or "fifo" (arrival)
    order: str
    #: whole devices only (a slice takes a whole GPU)
    whole: bool
    #: node score: "least" (LeastAllocated CPU+memory) or "most" (least GPU left, then CPU)
    score: str
    #: "none", "priority" (kube-scheduler) or "kueue"
    preempt: str
    quotas: bool


MODES = {
    "kube-scheduler": Mode("priority", True, "least", "priority", False),
    "kueue": Mode("priority", True, "least", "kueue", True),
    "binpack": Mode("fifo", False, "most", "none", False),
}


class _Light:
    """Event-driven simulator for the Kubernetes-style baselines: every event places at once."""

    def __init__(
        self, nodes: Sequence[Node], jobs: Sequence[Job], capacity: int, teams: int, mode: Mode
    ) -> None:
        self.mode = mode
        self.nodes = [_LNode(n, n.cpu_milli, n.memory_mib, [1000] * len(n.devices)) for n in nodes]
        self.jobs = jobs
        self.out = Outcome()
        self.running: dict[str, _Att] = {}
        self.capacity = capacity
        names = [f"team-{i}" for i in range(teams)]
        share, rest = divmod(capacity, teams)
        self.nominal = {t: share + (rest if i == 0 else 0) for i, t in enumerate(names)}
        self.used = dict.fromkeys(names, 0)
        self.total_used = 0
        #: pending: group key -> sorted list of (order key, job); a group is one shape of one
        #: queue (team and band for kueue), so a failure skips the whole group in a pass
        self.groups: dict[tuple[object, ...], list[tuple[tuple[int, ...], Job]]] = {}
        self.ends: list[tuple[int, int, str]] = []
        self.seq = 0
        self.attempts: dict[str, int] = {}
        self.waiting_since: dict[str, int] = {}
        #: work kept by the checkpoints of a job's preempted attempts (ms)
        self.progress: dict[str, int] = {}
        #: per shape, the nodes that could hold it empty (`fit.can_ever_host`)
        self._hosts: dict[Shape, tuple[list[int], set[int]]] = {}
        #: kueue: per (team, band), the running attempts most recently admitted first (ties
        #: by id): Kueue's candidate order is read from these instead of sorting every
        #: running attempt at each preemption
        self.ranked: dict[tuple[str, int], list[_Att]] = {}
        #: kube-scheduler: (node, shape, band) -> (the node's version, its victims): a
        #: node nothing started or stopped on since answers the same
        self._victim_memo: dict[tuple[int, Shape, int], tuple[int, list[_Att] | None]] = {}
        #: kueue: per (team, band), the quota its running attempts hold
        self.band_used: dict[tuple[str, int], int] = {}

    def hosts(self, shape: Shape) -> tuple[list[int], set[int]]:
        found = self._hosts.get(shape)
        if found is None:
            ks = [k for k, ln in enumerate(self.nodes) if can_ever_host(ln.node, shape)]
            found = self._hosts[shape] = (ks, set(ks))
        return found

    # -- queue ----------------------------------------------------------------------------

    def _key(self, job: Job) -> tuple[int, ...]:
        if self.mode.order == "priority":
            return (-BAND[job.cls], job.arrival_ms, int(job.id[4:]))
        return (job.arrival_ms, int(job.id[4:]))

    def _group(self, job: Job) -> tuple[object, ...]:
        team = job.team if self.mode.quotas else ""
        band = BAND[job.cls] if self.mode.order == "priority" else 0
        return (team, band, job.shape)

    def enqueue(self, job: Job, now: int) -> None:
        bisect.insort(self.groups.setdefault(self._group(job), []), (self._key(job), job))
        self.waiting_since[job.id] = now

    def _ordered(self) -> list[tuple[object, ...]]:
        if not self.mode.quotas:
            return sorted(self.groups, key=lambda g: self.groups[g][0][0])
        # Kueue's fair sharing: ClusterQueue heads by dominant resource share, then priority
        # and creation.
        lendable = max(self.capacity, 1)

        def key(g: tuple[object, ...]) -> tuple[object, ...]:
            team = str(g[0])
            drs = max(0, self.used[team] - self.nominal[team]) * 1000 // lendable
            return (drs, self.groups[g][0][0])

        return sorted(self.groups, key=key)

    # -- fit --------------------------------------------------------------------------------

    def _units(self, shape: Shape) -> tuple[int, int]:
        """(devices, milli per device) one pod takes."""
        if shape.count <= 0:
            return 0, 0
        if self.mode.whole or shape.kind is not ProfileKind.SHARED:
            return shape.count, WHOLE_GPU_MILLI
        return shape.count, shape.milli

    def _fit_on(self, k: int, shape: Shape) -> tuple[tuple[int, int], ...] | None:
        ln = self.nodes[k]
        if ln.cpu < shape.cpu_milli or ln.mem < shape.memory_mib:
            return None
        count, milli = self._units(shape)
        if count == 0:
            return ()
        free = ln.free
        if milli == WHOLE_GPU_MILLI and not shape.gpu_models:
            # whole devices: the first `count` idle ones (counted in C first: most nodes of a
            # loaded cluster are answered here)
            if free.count(WHOLE_GPU_MILLI) < count:
                return None
            ok = [p for p, f in enumerate(free) if f == WHOLE_GPU_MILLI]
            return tuple((p, milli) for p in ok[:count])
        if shape.gpu_models:
            models, devs = shape.gpu_models, ln.node.devices
            ok = [p for p, f in enumerate(free) if f >= milli and devs[p].model in models]
        else:
            ok = [p for p, f in enumerate(free) if f >= milli]
        if len(ok) < count:
            return None
        if milli < WHOLE_GPU_MILLI:
            ok.sort(key=lambda p: (ln.free[p], p))  # the fullest device that fits (binpack)
        return tuple((p, milli) for p in ok[:count])

    def _score(self, k: int, shape: Shape, grants: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
        ln = self.nodes[k]
        if self.mode.score == "least":
            # LeastAllocated: (free CPU ÷ capacity + free memory ÷ capacity) ÷ 2, higher first
            n = ln.node
            cpu = (ln.cpu - shape.cpu_milli) * 1000 // max(n.cpu_milli, 1)
            mem = (ln.mem - shape.memory_mib) * 1000 // max(n.memory_mib, 1)
            return (-(cpu + mem), k)
        gpu_left = sum(ln.free) - sum(m for _, m in grants)
        return (gpu_left, ln.cpu - shape.cpu_milli, k)

    def _place(
        self, shape: Shape, candidates: Sequence[int] | None = None
    ) -> tuple[int, tuple[tuple[int, int], ...]] | None:
        """The best node among the candidates (None: every node) that could hold the shape."""
        every, able = self.hosts(shape)
        nodes = every if candidates is None else [k for k in candidates if k in able]
        best: tuple[tuple[int, ...], int, tuple[tuple[int, int], ...]] | None = None
        for k in nodes:
            grants = self._fit_on(k, shape)
            if grants is None:
                continue
            score = self._score(k, shape, grants)
            if best is None or score < best[0]:
                best = (score, k, grants)
        return None if best is None else (best[1], best[2])

    # -- start and stop ---------------------------------------------------------------------

    def start(self, job: Job, k: int, grants: tuple[tuple[int, int], ...], now: int) -> None:
        n = self.attempts.get(job.id, 0) + 1
        self.attempts[job.id] = n
        att = _Att(f"{job.id}#{n}", job, k, grants, now, whole_milli(job.shape))
        ln = self.nodes[k]
        ln.cpu -= job.shape.cpu_milli
        ln.mem -= job.shape.memory_mib
        for p, m in grants:
            ln.free[p] -= m
        ln.running.add(att.id)
        ln.version += 1
        self.running[att.id] = att
        if self.mode.preempt == "kueue":
            ranked = self.ranked.setdefault((job.team, BAND[job.cls]), [])
            bisect.insort(ranked, att, key=_recent_first)
            key = (job.team, BAND[job.cls])
            self.band_used[key] = self.band_used.get(key, 0) + att.quota
        self.used[job.team] += att.quota
        self.total_used += att.quota
        self.out.first_start_ms.setdefault(job.id, now)
        self.out.waiting.append((job.team, self.waiting_since.pop(job.id), now))
        # a retry resumes from the checkpoints of earlier attempts
        heapq.heappush(
            self.ends, (now + job.runtime_ms - self.progress.get(job.id, 0), self.seq, att.id)
        )
        self.seq += 1

    def stop(self, att_id: str, now: int, preempted: bool) -> int:
        att = self.running.pop(att_id)
        if self.mode.preempt == "kueue":
            ranked = self.ranked[(att.job.team, BAND[att.job.cls])]
            del ranked[bisect.bisect_left(ranked, _recent_first(att), key=_recent_first)]
            self.band_used[(att.job.team, BAND[att.job.cls])] -= att.quota
        ln = self.nodes[att.node]
        ln.cpu += att.job.shape.cpu_milli
        ln.mem += att.job.shape.memory_mib
        for p, m in att.grants:
            ln.free[p] += m
        ln.running.discard(att_id)
        ln.version += 1
        self.used[att.job.team] -= att.quota
        self.total_used -= att.quota
        milli = att.job.shape.gpus_milli
        kept = record_stop(self.out, att.job, milli, att.start, now, preempted)
        if kept:
            self.progress[att.job.id] = self.progress.get(att.job.id, 0) + kept
        if preempted:
            self.enqueue(att.job, now)
        return att.node

    # -- passes ------------------------------------------------------------------------------

    def _quota_ok(self, job: Job) -> bool:
        """Kueue: the cohort has the request's quota left (unlimited borrowing; nominal
        quota others borrowed comes back only by preemption)."""
        if not self.mode.quotas:
            return True
        return self.total_used + whole_milli(job.shape) <= self.capacity

    def place_pass(self, candidates: Sequence[int], now: int) -> None:
        """Try every pending group in order on the candidate nodes (no head-of-line blocking)."""
        for g in self._ordered():
            items = self.groups.get(g)
            while items:
                job = items[0][1]
                self.out.decisions += 1
                if not self._quota_ok(job):
                    break
                found = self._place(job.shape, candidates)
                if found is None:
                    break
                items.pop(0)
                self.start(job, found[0], found[1], now)
            if not items:
                self.groups.pop(g, None)

    def _pending_heads(self) -> list[Job]:
        return [self.groups[g][0][1] for g in self._ordered()]

    def try_preempt(self, job: Job, now: int, nodes: Sequence[int] | None = None) -> bool:
        """Preempt for `job` as the mode's peer would (kube-scheduler: on `nodes`, None =
        every node); start it if that works."""
        if self.mode.preempt == "priority":
            return self._preempt_priority(job, now, nodes)
        if self.mode.preempt == "kueue":
            return self._preempt_kueue(job, now)
        return False

    def _remove_pending(self, job: Job) -> None:
        g = self._group(job)
        items = self.groups[g]
        items.remove((self._key(job), job))
        if not items:
            del self.groups[g]

    def _preempt_priority(self, job: Job, now: int, nodes: Sequence[int] | None) -> bool:
        band = BAND[job.cls]
        best: tuple[tuple[int, int, int], int, list[_Att]] | None = None
        every, able = self.hosts(job.shape)
        for k in every if nodes is None else [k for k in nodes if k in able]:
            victims = self._victims(k, job.shape, band)
            if victims is None:
                continue
            score = (max(BAND[v.job.cls] for v in victims), len(victims), k)
            if best is None or score < best[0]:
                best = (score, k, victims)
        if best is None:
            return False
        for v in best[2]:
            self.stop(v.id, now, preempted=True)
        grants = self._fit_on(best[1], job.shape)
        assert grants is not None
        self._remove_pending(job)
        self.start(job, best[1], grants, now)
        return True

    def _victims(self, k: int, shape: Shape, band: int) -> list[_Att] | None:
        """The fewest pods of lower priority than `band` on node k whose stop makes room for
        the shape (`_minimal`), None where none does; remembered while the node is unchanged
        (a deep queue asks again node after node, pod after pod)."""
        ln = self.nodes[k]
        key = (k, shape, band)
        hit = self._victim_memo.get(key)
        if hit is not None and hit[0] == ln.version:
            return hit[1]
        # (in any order: `_minimal` orders them)
        lower = [a for a in map(self.running.__getitem__, ln.running) if BAND[a.job.cls] < band]
        victims = self._minimal(k, shape, lower) if lower else None
        self._victim_memo[key] = (ln.version, victims)
        return victims

    def _minimal(self, k: int, shape: Shape, cands: list[_Att]) -> list[_Att] | None:
        """Stop every candidate on node k; if the shape fits, put back (highest priority, then
        longest running first, then by id) every victim it fits without (kube-scheduler's reprieve)."""
        ln = self.nodes[k]
        saved = (ln.cpu, ln.mem, list(ln.free))

        def apply(att: _Att, sign: int) -> None:
            ln.cpu += sign * att.job.shape.cpu_milli
            ln.mem += sign * att.job.shape.memory_mib
            for p, m in att.grants:
                ln.free[p] += sign * m

        for a in cands:
            apply(a, +1)
        if self._fit_on(k, shape) is None:
            ln.cpu, ln.mem, ln.free = saved
            return None
        victims = []
        for a in sorted(cands, key=lambda a: (-BAND[a.job.cls], a.start, a.id)):
            apply(a, -1)
            if self._fit_on(k, shape) is None:
                apply(a, +1)
                victims.append(a)
        ln.cpu, ln.mem, ln.free = saved
        return victims

    def _preempt_kueue(self, job: Job, now: int) -> bool:
        """Kueue: quota does not fit; minimal victims in Kueue's candidate order."""
        need = whole_milli(job.shape)
        team = job.team
        band = BAND[job.cls]
        within = self.used[team] + need <= self.nominal[team]
        # Where stopping every candidate would not free the quota, none is chosen: say so
        # before walking them (most preemption attempts of an overloaded cohort end so).
        most = sum(self.band_used.get((team, b), 0) for b in BANDS if b < band)
        if within:
            most += sum(u for t, u in self.used.items() if t != team and u > self.nominal[t])
        if self.total_used - most + need > self.capacity:
            return False
        cands = self._kueue_candidates(team, band, within)
        chosen: list[_Att] = []
        freed: dict[str, int] = {}
        used_total = self.total_used
        # Where it fits already, any victims that free the quota do; else only the nodes
        # the victims free can change the answer. The victims' room is given back on their
        # nodes as they are chosen (and taken again below), and `fitting` holds the touched
        # nodes where the shape fits now: each step changes one node, so one check a step.
        anywhere = self._place(job.shape) is not None
        _, able = self.hosts(job.shape)
        fitting: set[int] = set()

        def release(a: _Att, sign: int) -> None:
            ln = self.nodes[a.node]
            ln.cpu += sign * a.job.shape.cpu_milli
            ln.mem += sign * a.job.shape.memory_mib
            for p, m in a.grants:
                ln.free[p] += sign * m
            if anywhere:
                return  # `fits_now` does not ask which nodes
            if a.node in able and self._fit_on(a.node, job.shape) is not None:
                fitting.add(a.node)
            else:
                fitting.discard(a.node)

        def fits_now() -> bool:
            if used_total + need > self.capacity:
                return False
            return anywhere or bool(fitting)

        ok = False
        for a in cands:
            t = a.job.team
            if t != team and self.used[t] - freed.get(t, 0) <= self.nominal[t]:
                continue  # no longer borrowing
            chosen.append(a)
            release(a, +1)
            freed[t] = freed.get(t, 0) + a.quota
            used_total -= a.quota
            if fits_now():
                ok = True
                break
        if ok:
            for a in list(reversed(chosen)):
                chosen.remove(a)
                release(a, -1)
                freed[a.job.team] -= a.quota
                used_total += a.quota
                if not fits_now():
                    chosen.append(a)
                    release(a, +1)
                    freed[a.job.team] += a.quota
                    used_total -= a.quota
        for a in chosen:
            release(a, -1)  # the nodes as they were; `stop` frees the room for real
        if not ok:
            return False
        for a in chosen:
            self.stop(a.id, now, preempted=True)
        found = self._place(job.shape)
        if found is None or not self._quota_ok(job):
            return True  # the victims are gone; the job waits for its turn
        self._remove_pending(job)
        self.start(job, found[0], found[1], now)
        return True

    def _kueue_candidates(self, team: str, band: int, within: bool) -> Iterator[_Att]:
        """Kueue's preemption candidates in its order: other ClusterQueues' workloads first
        (only if the preemptor stays within its nominal quota, and only of those that
        borrow), then its own of lower priority; lower priority first, most recently
        admitted first. Lazily: a preemption mostly stops after a few."""
        if within:
            borrowing = [t for t in self.used if t != team and self.used[t] > self.nominal[t]]
            for b in BANDS:
                lists = [self.ranked.get((t, b), []) for t in borrowing]
                yield from heapq.merge(*lists, key=_recent_first)
        for b in BANDS:
            if b >= band:
                break
            yield from self.ranked.get((team, b), [])

    def run(self) -> Outcome:
        jobs = self.jobs
        i = 0
        while i < len(jobs) or self.ends:
            t_arr = jobs[i].arrival_ms if i < len(jobs) else math.inf
            t_end = self.ends[0][0] if self.ends else math.inf
            now = int(min(t_arr, t_end))
            started = time.perf_counter()
            freed: set[int] = set()
            while self.ends and self.ends[0][0] <= now:
                _, _, att = heapq.heappop(self.ends)
                if att in self.running:
                    freed.add(self.stop(att, now, preempted=False))
            if freed:
                self.place_pass(sorted(freed), now)
                self._retry_preemption(now, sorted(freed))
            while i < len(jobs) and jobs[i].arrival_ms <= now:
                job = jobs[i]
                i += 1
                self.enqueue(job, now)
                self.out.decisions += 1
                found = self._place(job.shape) if self._quota_ok(job) else None
                if found is not None and self._is_head(job):
                    self._remove_pending(job)
                    self.start(job, found[0], found[1], now)
                elif self.mode.preempt == "priority" or (
                    self.mode.preempt == "kueue" and not self._quota_ok(job)
                ):
                    # Kueue preempts only for quota; kube-scheduler for any pod that does not fit
                    self.try_preempt(job, now)
            self.out.seconds += time.perf_counter() - started
        if self.groups:
            raise RuntimeError(f"{sum(map(len, self.groups.values()))} jobs never started")
        return self.out

    def _is_head(self, job: Job) -> bool:
        """Whether nothing ahead of the job in its group waits (same shape: FIFO inside)."""
        return self.groups[self._group(job)][0][1] is job

    def _retry_preemption(self, now: int, freed: Sequence[int]) -> None:
        """After a pod ends, the first waiting pod in order that may preempt tries once more
        (kube-scheduler's PostFilter on a retry, on the nodes that freed room; Kueue's
        requeue of inadmissible ClusterQueue heads)."""
        if self.mode.preempt == "none" or not self.groups:
            return
        teams: set[str] = set()
        for job in self._pending_heads():
            if self.mode.preempt == "priority":
                if BAND[job.cls] <= min(BAND.values()):
                    continue
                self.out.decisions += 1
                self.try_preempt(job, now, freed)
                return
            # Kueue: each ClusterQueue's head, when quota is what holds it back
            if job.team in teams:
                continue
            teams.add(job.team)
            if self._quota_ok(job):
                continue
            self.out.decisions += 1
            if self.try_preempt(job, now):
                return


def run_light(
    name: str, nodes: Sequence[Node], jobs: Sequence[Job], capacity: int, teams: int
) -> Outcome:
    return _Light(nodes, jobs, capacity, teams, MODES[name]).run()


# -- quartermaster --------------------------------------------------------------------------


def run_quartermaster(
    nodes: Sequence[Node],
    jobs: Sequence[Job],
    capacity: int,
    teams: int,
    tick_ms: int,
    seed: int,
    policy: Policy | None = None,
    probe_overruns: bool = False,
) -> Outcome:
    """Replay the jobs through `schedule()` with a profile's `Policy` (default: the
    shipped profile, as the portal runs it). `probe_overruns`: see `Simulation`."""
    names = tuple(f"team-{i}" for i in range(teams))
    share, rest = divmod(capacity, teams)
    quotas = tuple(
        Quota(t, TRACE_POOL, share + (rest if i == 0 else 0)) for i, t in enumerate(names)
    )
    sim = Simulation(
        nodes=tuple(nodes),
        jobs={j.id: j for j in jobs},
        teams=tuple(Team(t) for t in names),
        quotas=quotas,
        policy=policy or load_profile(DEFAULT_PROFILE).policy(),
        # the requeue jitter: the one random draw inside the simulation
        rng=random.Random(seed + 1),
        probe_overruns=probe_overruns,
    )
    sim.history = ShapeHistory(half_life_s=sim.policy.shape_half_life_s)
    # the ticks meet the same free capacities again and again: remember the packer's and
    # the reservations' evaluations across them (the same decisions, less CPU)
    with remembering():
        return drive(sim, jobs, tick_ms)


# -- measurement ---------------------------------------------------------------------------


def measure(out: Outcome, jobs: Sequence[Job], capacity: int, teams: int) -> dict[str, float]:
    w0 = jobs[len(jobs) // 5].arrival_ms
    w1 = jobs[-1].arrival_ms
    span = max(w1 - w0, 1)
    received: dict[str, float] = {f"team-{i}": 0.0 for i in range(teams)}
    total = useful = delivered = 0.0
    for team, milli, start, end, kept in out.intervals:
        delivered += milli * (end - start)
        overlap = max(0, min(end, w1) - max(start, w0))
        total += milli * overlap
        if kept:
            useful += milli * overlap
        received[team] = received.get(team, 0.0) + milli * overlap
    entitled = capacity * span / teams
    ratios = [r / entitled for r in received.values()]
    jain = sum(ratios) ** 2 / (len(ratios) * sum(x * x for x in ratios)) if any(ratios) else 0.0
    waits = sorted((out.first_start_ms[j.id] - j.arrival_ms) / 1000 for j in jobs)
    large = sorted(
        (out.first_start_ms[j.id] - j.arrival_ms) / 1000
        for j in jobs
        if j.shape.gpus_milli >= LARGE_MILLI
    )
    promise, by_class = promises(
        ((j.cls, (out.first_start_ms[j.id] - j.arrival_ms) / 1000) for j in jobs), MAX_QUEUE_S
    )
    slo = {
        "slo_attainment": round(promise.attainment, 5),
        "slo_overrun_max_s": round(promise.overrun_max_s, 1),
    }
    for cls, p in by_class.items():
        slo[f"slo_attainment_{cls}"] = round(p.attainment, 5)
        slo[f"slo_overrun_max_s_{cls}"] = round(p.overrun_max_s, 1)
    return {
        "utilization": round(100 * total / (capacity * span), 2),
        "useful_utilization": round(100 * useful / (capacity * span), 2),
        "wait_mean_s": round(sum(waits) / len(waits), 1),
        "wait_p95_s": round(_pct(waits, 95), 1),
        "wait_p99_s": round(_pct(waits, 99), 1),
        "wait_max_s": round(waits[-1], 1),
        "wait_p95_large_s": round(_pct(large, 95), 1) if large else 0.0,
        **slo,
        "jain": round(jain, 4),
        "share_error": round(share_error(out, capacity, teams, w0, w1), 4),
        "preemptions": out.preemptions,
        "gpu_hours_lost": round(out.lost_milli_ms / 1000 / 3_600_000, 2),
        "gpu_hours_delivered": round(delivered / 1000 / 3_600_000, 2),
        "decisions_per_s": round(out.decisions / out.seconds, 1) if out.seconds else 0.0,
    }


@dataclass(slots=True)
class Overruns:
    """The requests that started after their class's maximum queue time, of one cause."""

    #: those counted under it (`overrun_cause`: the cause its waits said most often)
    requests: int = 0
    overrun_max_s: float = 0.0
    #: their waits past the promise by what each said (`held_by`; one per tick)
    waits: dict[str, int] = field(default_factory=dict)
    #: those with at least one wait of this cause, whatever they are counted under: where a
    #: rule of ours (pool overloaded, the tick's preemption cap) held one even once, a
    #: victim set the granted rules allow may have started it then
    touched: int = 0
    touched_overrun_max_s: float = 0.0


def _overran(out: Outcome, jobs: Sequence[Job]) -> Iterator[tuple[Job, float]]:
    """The jobs that started after their class's maximum queue time, with by how much (s)."""
    for j in jobs:
        limit = MAX_QUEUE_S.get(j.cls, 0)
        over = round((out.first_start_ms[j.id] - j.arrival_ms) / 1000 - limit, 1)
        if limit > 0 and over > 0:
            yield j, over


def overruns(out: Outcome, jobs: Sequence[Job]) -> dict[str, Overruns]:
    """The requests that started after their class's maximum queue time, per cause
    (`scheduling.simulate.overrun_cause`), the longest overrun first. Only
    Quartermaster's replay records causes."""
    found: dict[str, Overruns] = {}
    for j, over in _overran(out, jobs):
        causes = out.held_past_promise.get(j.id) or {}
        row = found.setdefault(overrun_cause(causes), Overruns())
        row.requests += 1
        row.overrun_max_s = max(row.overrun_max_s, over)
        for cause, n in causes.items():
            row.waits[cause] = row.waits.get(cause, 0) + n
            seen = found.setdefault(cause, Overruns())
            seen.touched += 1
            seen.touched_overrun_max_s = max(seen.touched_overrun_max_s, over)
    return dict(
        sorted(found.items(), key=lambda kv: (-kv[1].overrun_max_s, -kv[1].touched_overrun_max_s))
    )


def overruns_alone(out: Outcome, jobs: Sequence[Job]) -> dict[str, object]:
    """The overruns split by whether the request would have started (or preempted to
    start) at some tick past its promise had it been the only one pending
    (`Outcome.startable_alone_s`, `Simulation.probe_overruns`): "startable alone" and
    "never startable alone" (no room and no victim set the rules allow, even for it
    alone), each with its longest overrun; for a startable one also how long it waited
    after it first was (`after_startable_max_s`: the part of an overrun that requests
    ahead of it, nodes held for others or the tick's cap made); "lost a chance": the
    overruns of requests that, past their promise, would have started alone at a tick
    where the room or victims they needed went to a request not past its own bound, or
    to none (`Outcome.chance_lost_s`). `longest`: the ten longest overruns as (job,
    class, overrun s, first startable s past the promise or None, first such lost
    chance s or None)."""
    found: dict[str, dict[str, float]] = {}
    rows: list[tuple[float, str, str, float | None, float | None]] = []
    for j, over in _overran(out, jobs):
        first = out.startable_alone_s.get(j.id)
        lost = out.chance_lost_s.get(j.id)
        rows.append(
            (
                over,
                j.id,
                j.cls,
                None if first is None else round(first, 1),
                None if lost is None else round(lost, 1),
            )
        )
        kind = "never startable alone" if first is None else "startable alone"
        row = found.setdefault(kind, {"requests": 0, "overrun_max_s": 0.0})
        row["requests"] += 1
        row["overrun_max_s"] = max(row["overrun_max_s"], over)
        if first is not None:
            after = round(over - first, 1)
            row["after_startable_max_s"] = max(row.get("after_startable_max_s", 0.0), after)
        if lost is not None:
            chance = found.setdefault("lost a chance", {"requests": 0, "overrun_max_s": 0.0})
            chance["requests"] += 1
            chance["overrun_max_s"] = max(chance["overrun_max_s"], over)
    rows.sort(key=lambda r: (-r[0], r[1]))
    longest = [list(r[1:3]) + [r[0], r[3], r[4]] for r in rows[:10]]
    return {**found, "longest": longest}


def share_error(out: Outcome, capacity: int, teams: int, w0: int, w1: int) -> float:
    """Mean over 1-hour windows of |received − entitlement| ÷ window capacity over the teams
    with demand (a request waiting 5 minutes or more in the window); see the module
    docstring."""
    n = max(1, (w1 - w0) // SHARE_WINDOW_MS)
    got = [[0.0] * teams for _ in range(n)]
    demand = [[False] * teams for _ in range(n)]

    def windows(start: int, end: int) -> range:
        a = max(0, (start - w0) // SHARE_WINDOW_MS)
        b = min(n - 1, (end - 1 - w0) // SHARE_WINDOW_MS)
        return range(a, b + 1)

    for team, milli, start, end, _ in out.intervals:
        t = int(team.rsplit("-", 1)[1])
        for w in windows(max(start, w0), min(end, w0 + n * SHARE_WINDOW_MS)):
            lo = w0 + w * SHARE_WINDOW_MS
            got[w][t] += milli * max(0, min(end, lo + SHARE_WINDOW_MS) - max(start, lo))
    for team, start, end in out.waiting:
        if end - start < DEMAND_WAIT_MS:
            continue
        t = int(team.rsplit("-", 1)[1])
        for w in windows(max(start, w0), min(end, w0 + n * SHARE_WINDOW_MS)):
            lo = w0 + w * SHARE_WINDOW_MS
            if min(end, lo + SHARE_WINDOW_MS) - max(start, lo) >= DEMAND_WAIT_MS:
                demand[w][t] = True
    cap = capacity * SHARE_WINDOW_MS
    errors: list[float] = []
    for w in range(n):
        needy = [t for t in range(teams) if demand[w][t]]
        if not needy:
            continue
        # max-min fair: a team without demand is entitled to what it used, up to the level
        # every demanding team is entitled to (equal weights)
        level = _water_level(cap, [got[w][t] for t in range(teams) if not demand[w][t]], len(needy))
        errors.append(sum(abs(got[w][t] - level) for t in needy) / len(needy) / cap)
    return sum(errors) / len(errors) if errors else 0.0


def _water_level(cap: float, satisfied: list[float], demanding: int) -> float:
    """The max-min fair level: teams in `satisfied` take min(their use, level), the
    `demanding` ones the level, and together they fill `cap`."""
    left, k = cap, demanding + len(satisfied)
    for used in sorted(satisfied):
        if used * k <= left:
            left -= used
            k -= 1
        else:
            break
    return left / k


def _pct(sorted_values: Sequence[float], pct: int) -> float:
    k = max(0, math.ceil(pct / 100 * len(sorted_values)) - 1)
    return sorted_values[k]


def run_policy(
    name: str,
    nodes: Sequence[Node],
    jobs: Sequence[Job],
    capacity: int,
    teams: int,
    tick_ms: int,
    seed: int,
    policy: Policy | None = None,
    probe_overruns: bool = False,
) -> Outcome:
    """Run one policy of `POLICIES` on the jobs; `policy` is Quartermaster's profile."""
    if name == "quartermaster":
        return run_quartermaster(
            nodes, jobs, capacity, teams, tick_ms, seed, policy, probe_overruns
        )
    if name == "fifo-strict":
        return run_fifo_strict(nodes, jobs)
    if name in MODES:
        return run_light(name, nodes, jobs, capacity, teams)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


#: the collector's thresholds while a replay runs (`_fewer_collections`)
REPLAY_GC_THRESHOLDS = (10_000, 10, 10)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Run the cyclic collector less often: each tick pauses it (`scheduling.cycle`), and
    the first allocation after a tick then starts a collection that walks what the tick
    left alive. With the default thresholds a replay spent about 6 % of its CPU there,
    most of it in full collections over the memos it keeps (seed 6, load 110, 8,000
    jobs: 0.91 CPU-s of 14.9; with these, 0.27). The results are the same."""
    before = gc.get_threshold()
    gc.set_threshold(*REPLAY_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.bench replay")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--nodes", default=str(TRACE_DIR / "openb_node_list_gpu_node.csv"))
    parser.add_argument("--pods", default=str(TRACE_DIR / "openb_pod_list_default.csv"))
    parser.add_argument("--every", type=int, default=8, help="keep every K-th node")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--load", type=float, default=90.0, help="offered load, %% of GPU capacity")
    parser.add_argument("--teams", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1, help="draws the jobs, arrivals, estimates")
    parser.add_argument("--tick-s", type=float, default=10.0, help="tick period; 0 = every event")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--estimates",
        default="over3",
        choices=("over3", "exact", "none"),
        help="runtime estimates given to quartermaster: over3 (x U(1,3)), exact, none",
    )
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help="quartermaster's scheduling profile: a shipped name or a TOML file",
    )
    parser.add_argument(
        "--checkpoint-s",
        type=int,
        default=CHECKPOINT_S,
        help="checkpoint interval of training jobs, seconds; 0 = no checkpoints",
    )
    parser.add_argument(
        "--probe-overruns",
        action="store_true",
        help="for each wait past a request's promise, ask what the tick would decide for it"
        " alone (quartermaster_overruns_alone; slower)",
    )
    args = parser.parse_args(list(argv))
    try:
        profile = load_profile(args.profile)
    except ProfileError as exc:
        parser.error(f"--profile: {exc}")
    if args.checkpoint_s < 0:
        parser.error("--checkpoint-s: must be 0 or more")
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
    try:
        nodes = load_nodes(args.nodes)[:: args.every]
        pods = load_pods(args.pods)
    except OSError as exc:
        parser.error(f"cannot read the trace: {exc}")
    jobs, capacity = draw_jobs(pods, nodes, args.jobs, args.load, args.teams, args.seed)
    jobs = with_checkpoints(with_estimates(jobs, args.estimates, args.seed), args.checkpoint_s)
    asked = sum(j.shape.gpus_milli * j.runtime_ms for j in jobs)
    whole = sum(whole_milli(j.shape) * j.runtime_ms for j in jobs)
    result: dict[str, object] = {
        "offered_load": args.load,
        "offered_load_whole_gpus": round(args.load * whole / asked, 1) if asked else 0.0,
        "estimates": args.estimates,
        "checkpoint_s": args.checkpoint_s,
        "profile": profile.name,
        "profile_version": profile.version,
        "seed": args.seed,
        "gpus": capacity // 1000,
        "jobs": len(jobs),
    }
    policies: dict[str, dict[str, float]] = {}
    late: dict[str, Overruns] = {}
    tick_ms = int(args.tick_s * 1000)
    for name in names:
        with _fewer_collections():
            out = run_policy(
                name,
                nodes,
                jobs,
                capacity,
                args.teams,
                tick_ms,
                args.seed,
                profile.policy(),
                args.probe_overruns,
            )
        policies[name] = measure(out, jobs, capacity, args.teams)
        if name == "quartermaster":
            late = overruns(out, jobs)
            result["quartermaster_overruns"] = {c: asdict(o) for c, o in late.items()}
            if args.probe_overruns:
                result["quartermaster_overruns_alone"] = overruns_alone(out, jobs)
    result["policies"] = policies
    if args.json:
        print(json.dumps(result))
    else:
        for name, m in policies.items():
            print(name, " ".join(f"{k}={v}" for k, v in m.items()))
        for cause, row in late.items():
            print(
                f"quartermaster overruns, {cause}: requests={row.requests}",
                f"overrun_max_s={row.overrun_max_s} waits={row.waits}",
                f"touched={row.touched} touched_overrun_max_s={row.touched_overrun_max_s}",
            )
    return 0
