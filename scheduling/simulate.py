"""The replay simulator: jobs run through `schedule()` on a simulated clock, the way the
portal's tick runs them.

`Simulation` holds the cluster, the jobs and what became of them; `drive` feeds it the
jobs' arrivals, their departures, requeues with backoff (`requeue_delay_s`) and the wakes
at the policy's waiting thresholds, and ticks it whenever something happened. Each tick
builds the `Snapshot` the portal would (pending requests, running attempts with their last
checkpoint, decayed team usage, the learned shape history) and applies the decisions:
ADMIT starts a job, PREEMPT stops it at once and requeues it, WAIT and REJECT are noted.
`Outcome` is the record every measurement reads (`record_stop`: an attempt's GPU-time,
the work its checkpoints kept and what preemption lost).

The replay benchmark runs its Quartermaster policy on it, and `scheduling.whatif` a
site's own history under its current and a proposed setting.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from scheduling.backoff import requeue_delay_s
from scheduling.cycle import cluster_state, schedule
from scheduling.explain import Code
from scheduling.packer import ClusterState
from scheduling.trace import TRACE_POOL
from scheduling.types import (
    Decision,
    DecisionKind,
    Node,
    Partitioning,
    PendingRequest,
    Placement,
    Policy,
    Pool,
    PoolWorkload,
    PreemptionPolicy,
    Quota,
    Running,
    Shape,
    Snapshot,
    Team,
    TeamUsage,
    WorkloadClass,
)
from scheduling.usage_decay import decay_usage, interval_usage
from scheduling.workload import ShapeHistory

#: the classes of the replay benchmark's jobs, and a `Simulation`'s default: `qos` LS →
#: inference, BE → training, the rest interactive
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


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    team: str
    cls: str
    shape: Shape
    runtime_ms: int
    arrival_ms: int
    #: the runtime the scheduler is told (None = no estimate); see the replay benchmark's
    #: `with_estimates`
    estimate_ms: int | None = None
    #: how often the job writes a checkpoint (ms), None = never; see the replay
    #: benchmark's `with_checkpoints`
    checkpoint_ms: int | None = None
    #: the pool it names ("" = any production pool)
    pool: str = ""


@dataclass(slots=True)
class Outcome:
    """What one policy did to the jobs."""

    first_start_ms: dict[str, int] = field(default_factory=dict)
    #: (team, milli, start_ms, end_ms, useful) of every attempt
    intervals: list[tuple[str, int, int, int, bool]] = field(default_factory=list)
    #: (team, from_ms, to_ms): a request of the team waited (arrival or requeue to start)
    waiting: list[tuple[str, int, int]] = field(default_factory=list)
    preemptions: int = 0
    lost_milli_ms: int = 0
    decisions: int = 0
    seconds: float = 0.0
    #: per team: preemptions and milli-ms of work lost to them
    preempted_by_team: dict[str, int] = field(default_factory=dict)
    lost_by_team: dict[str, int] = field(default_factory=dict)
    #: jobs the core rejected (a what-if whose cluster can no longer hold them)
    rejected: list[str] = field(default_factory=list)
    #: per request not yet started, per cause (`held_by`), the ticks it waited past its
    #: class's maximum queue time: what kept it from starting once its promise was due
    held_past_promise: dict[str, dict[str, int]] = field(default_factory=dict)
    #: with `Simulation.probe_overruns`: per such request, the seconds past its promise
    #: of the first tick at which it would have started (or preempted to start) had it
    #: been the only request pending (`alone`)
    startable_alone_s: dict[str, float] = field(default_factory=dict)
    #: with `Simulation.probe_overruns`: per such request, the seconds past its promise
    #: of the first tick at which it would have started alone and the room or victims it
    #: would have used went to a request not past its own starvation bound, or to none:
    #: from there on its wait is the scheduler's choice, not other overdue requests'
    chance_lost_s: dict[str, float] = field(default_factory=dict)


#: `held_by`'s causes, in the order that breaks a tie in `overrun_cause`
HELD_BY = (
    "pool overloaded",
    "tick's preemption cap",
    "quota",
    "no allowed victim set",
    "victims stopping",
    "backoff",
)


def held_by(d: Decision, capped: bool) -> str:
    """Why a request past its class's maximum queue time waits, from its decision:

    - "pool overloaded": the pool is overloaded (`Policy.overload_queue_ratio`, or more
      requests past their bound than may hold nodes): the cycle did not look for
      victims (it may have found some);
    - "tick's preemption cap": preemptions earlier in the tick had spent
      `Policy.max_preemptions_per_tick` or left it less than a request past its bound
      may otherwise take (every running attempt): a plan within the rules may exist;
    - "quota": quota holds it (a quota code): the starvation rule preempts for room, not
      for quota;
    - "no allowed victim set": no room, and no set of victims the rules allow (its band
      or lower, older than it, past their minimum runtime, never inference, within its
      loss budget) makes room;
    - "victims stopping": victims were chosen and it waits for them to stop;
    - "backoff": a requeued request waits out its backoff;
    - any other wait, its code.
    `capped`: the tick had preempted before this decision."""
    code = d.code
    if code in (Code.PREEMPTING, Code.AWAITING_STOP):
        return "victims stopping"
    if code == Code.BACKOFF:
        return "backoff"
    if code in (Code.NO_CAPACITY, Code.AWAITING_NODES):
        if d.facts and d.facts.get("overloaded"):
            return "pool overloaded"
        return "tick's preemption cap" if capped else "no allowed victim set"
    if code in (Code.BORROWING_LIMIT, Code.COHORT_EXHAUSTED, Code.INFERENCE_FLOOR):
        return "quota"
    return str(code)


def overrun_cause(causes: dict[str, int] | None) -> str:
    """The cause an overrun is counted under: of the causes its waits past the promise
    said (`held_by`, one per tick), the one said most often (a tie: the first in
    `HELD_BY`); "between ticks" when it got no decision past its promise (it started at
    the first tick after)."""
    if not causes:
        return "between ticks"
    order = {c: i for i, c in enumerate(HELD_BY)}
    return min(causes, key=lambda c: (-causes[c], order.get(c, len(order)), c))


def alone(snap: Snapshot, req: PendingRequest, policy: Policy) -> bool:
    """Whether the tick would start the request, or preempt for it, were it the only one
    pending: some victim set the rules allow (or room) was there for it, whatever the
    requests ahead of it, the nodes held for others and the tick's preemption cap did.
    Alone, a request past its bound is not in an overloaded pool and its plan may take
    as many victims as it needs (`scheduling.cycle._Tick._preempt`)."""
    return alone_decision(snap, req, policy) is not None


def alone_decision(snap: Snapshot, req: PendingRequest, policy: Policy) -> Decision | None:
    """`alone`'s decision for the request when it starts or preempts, else None."""
    for d in schedule(replace(snap, pending=(req,)), snap.now_ms, policy):
        if d.request_id == req.id and (
            d.kind is DecisionKind.ADMIT or d.code in (Code.PREEMPTING, Code.AWAITING_STOP)
        ):
            return d
    return None


def _nodes_of(d: Decision) -> set[str]:
    """The nodes a decision takes, frees for its request or holds for it."""
    if d.placement is not None:
        return set(d.placement.nodes)
    facts = d.facts or {}
    found: set[str] = set()
    for key in ("nodes", "reserved_nodes"):
        names = facts.get(key)
        if isinstance(names, list | tuple):
            found.update(str(n) for n in names)
    return found


def last_checkpoint_ms(started_ms: int, interval_ms: int | None, now_ms: int) -> int | None:
    """The last checkpoint an attempt started at `started_ms` finished by `now_ms`."""
    if not interval_ms:
        return None
    done = (now_ms - started_ms) // interval_ms
    return started_ms + done * interval_ms if done > 0 else None


def record_stop(out: Outcome, job: Job, milli: int, start: int, now: int, preempted: bool) -> int:
    """Record an attempt's GPU-time; return the work (ms) its checkpoints kept.

    A finished attempt's time is all useful. A preempted one keeps the work up to its last
    checkpoint (the retry resumes from it) and loses the rest. The same for every policy:
    checkpoints are the job's, not the scheduler's."""
    if not preempted:
        out.intervals.append((job.team, milli, start, now, True))
        return 0
    kept = last_checkpoint_ms(start, job.checkpoint_ms, now) or start
    if kept > start:
        out.intervals.append((job.team, milli, start, kept, True))
    out.intervals.append((job.team, milli, kept, now, False))
    out.preemptions += 1
    out.lost_milli_ms += milli * (now - kept)
    out.preempted_by_team[job.team] = out.preempted_by_team.get(job.team, 0) + 1
    out.lost_by_team[job.team] = out.lost_by_team.get(job.team, 0) + milli * (now - kept)
    return kept - start


@dataclass(slots=True)
class Simulation:
    """The cluster, the jobs and their state between ticks; `drive` runs it."""

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
    #: when each pending request started waiting (arrival, or the preemption that requeued it)
    waiting_since: dict[str, int] = field(default_factory=dict)
    #: work kept by the checkpoints of a request's preempted attempts (ms)
    progress: dict[str, int] = field(default_factory=dict)
    #: requests whose waiting thresholds already have a wake event
    timed: set[str] = field(default_factory=set)
    #: the pool's learned request shapes, fed at each arrival as the portal feeds its
    #: `ShapeHistory` at each submit (FGD's target; empty: the nodes' prior)
    history: ShapeHistory | None = None
    #: a site's pools and classes (scheduling.whatif); empty: the trace's one pool
    pools: tuple[Pool, ...] = ()
    classes: tuple[WorkloadClass, ...] = REPLAY_CLASSES
    #: fixed target workloads per pool, when `history` is None
    workloads: tuple[PoolWorkload, ...] | None = None
    #: record a rejected job and go on (a what-if) instead of failing the replay
    rejects_ok: bool = False
    node_pool: dict[str, str] = field(default_factory=dict)
    #: running attempts of jobs that checkpoint, and their interval (ms)
    checkpointing: dict[str, int] = field(default_factory=dict)
    #: (when, attempt): the next checkpoint of each checkpointing attempt, soonest first:
    #: `_checkpoints` visits only the attempts that wrote one since the last tick
    checkpoint_due: list[tuple[int, str]] = field(default_factory=list)
    #: the nodes' free capacity with every running attempt taken, kept from tick to tick
    #: (each tick takes its admissions, `end` gives back what stops) rather than rebuilt
    #: by every tick from all running attempts: the same decisions, less CPU
    state: ClusterState | None = None
    #: ask, for each wait past a request's promise, what the tick would have decided for
    #: it alone (`Outcome.startable_alone_s`): a diagnostic of the replay, CPU-costly
    probe_overruns: bool = False

    def push(self, t: int, kind: int, ident: str) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, ident))
        self.seq += 1

    def end(self, attempt: str, now: int, preempted: bool) -> None:
        run = self.running.pop(attempt)
        self.checkpointing.pop(attempt, None)
        if self.state is not None:
            self.state.give(run.placement)
        milli = run.shape.gpus_milli
        job = self.jobs[run.request_id]
        kept = record_stop(self.out, job, milli, run.started_at_ms, now, preempted)
        if kept:
            self.progress[job.id] = self.progress.get(job.id, 0) + kept
        value, as_of = self.usage.get(run.team, (0, now))
        h = self.policy.usage_half_life_s
        value = decay_usage(value, now - as_of, h) + interval_usage(
            milli, run.started_at_ms, now, now, h
        )
        self.usage[run.team] = (value, now)

    def _checkpoints(self, now: int) -> None:
        """Tell the core each attempt's last checkpoint, as the portal's snapshot does."""
        due = self.checkpoint_due
        while due and due[0][0] <= now:
            _, attempt = heapq.heappop(due)
            interval = self.checkpointing.get(attempt)
            if interval is None:
                continue  # the attempt has ended
            run = self.running[attempt]
            last = last_checkpoint_ms(run.started_at_ms, interval, now)
            if last != run.last_checkpoint_ms:
                self.running[attempt] = replace(run, last_checkpoint_ms=last)
            start = run.started_at_ms
            heapq.heappush(due, (start + ((now - start) // interval + 1) * interval, attempt))

    def tick(self, now: int) -> None:
        self._checkpoints(now)
        snap = Snapshot(
            now_ms=now,
            pools=self.pools or (Pool(TRACE_POOL, Partitioning.TIME_SLICING),),
            nodes=self.nodes,
            running=tuple(self.running.values()),
            pending=tuple(self.pending.values()),
            teams=self.teams,
            quotas=self.quotas,
            classes=self.classes,
            usage=tuple(TeamUsage(t, v, a) for t, (v, a) in self.usage.items()),
            workloads=(self.history.to_workload(TRACE_POOL),) if self.history else self.workloads,
        )
        started = time.perf_counter()
        # (the random packer's draws follow the order a state made its groups in: a kept
        # state would draw differently from the new one each tick builds)
        if self.state is None and self.policy.packer != "random":
            self.state = cluster_state(snap, self.policy)
        decisions = schedule(snap, now, self.policy, self.state)
        self.out.seconds += time.perf_counter() - started
        self.out.decisions += len(decisions)
        woke = False
        pending, timed = self.pending, self.timed
        wait, admit, preempt = DecisionKind.WAIT, DecisionKind.ADMIT, DecisionKind.PREEMPT
        promise = {c.name: c.max_queue_s * 1000 for c in self.classes if c.max_queue_s > 0}
        begun, held = self.out.first_start_ms, self.out.held_past_promise
        overdue: list[tuple[PendingRequest, int]] = []  # waits past the promise (a probe)
        preempted = 0  # PREEMPTs so far in this tick's decisions (they come in queue order)
        for d in decisions:
            kind = d.kind
            # (waits first: nearly every decision of a deep queue is one)
            if kind is wait:
                rid = d.request_id
                req = pending[rid]
                code = d.code
                flag = code == "preempting" or code == "awaiting-stop"
                if req.preempting is not flag:
                    pending[rid] = replace(req, preempting=flag)
                if rid not in timed:
                    timed.add(rid)
                    self._wake_at_thresholds(req.created_at_ms, now)
                due = promise.get(req.workload_class)
                if due is not None and now - req.created_at_ms > due and rid not in begun:
                    causes = held.setdefault(rid, {})
                    # Earlier preemptions of the tick leave a starving request the cap's
                    # rest, not every running attempt (`_Tick._preempt`).
                    cause = held_by(d, preempted > 0)
                    causes[cause] = causes.get(cause, 0) + 1
                    if self.probe_overruns:
                        overdue.append((req, due))
            elif kind is admit:
                self.admit(d.request_id, d.placement, now)
            elif kind is preempt:
                self.preempt(d.attempt_id, now)
                preempted += 1
                woke = True
            elif kind is DecisionKind.REJECT:
                if not self.rejects_ok:
                    raise RuntimeError(f"replay job {d.request_id} rejected: {d.message}")
                self.pending.pop(d.request_id)
                self.waiting_since.pop(d.request_id, None)
                self.out.rejected.append(d.request_id)
        if self.probe_overruns:
            self._probe(snap, decisions, overdue, now)
        if woke:
            self.push(now + 1, 2, "")

    def _probe(
        self,
        snap: Snapshot,
        decisions: Sequence[Decision],
        overdue: Sequence[tuple[PendingRequest, int]],
        now: int,
    ) -> None:
        """`probe_overruns`: for each request waiting past its promise, whether it would
        have started alone (`alone`), and if so whether the nodes it would have used went
        to a request not past its own starvation bound, or to none
        (`Outcome.chance_lost_s`)."""
        if not overdue:
            return
        out = self.out
        by_id = {r.id: r for r in snap.pending}
        bound = {
            c.name: self.policy.starvation_after * c.max_queue_s * 1000
            for c in self.classes
            if c.max_queue_s > 0 and self.policy.starvation_after > 0
        }
        for req, due in overdue:
            mine = alone_decision(snap, req, self.policy)
            if mine is None:
                continue
            late_s = (now - req.created_at_ms - due) / 1000
            out.startable_alone_s.setdefault(req.id, late_s)
            wanted = _nodes_of(mine)
            takers = {
                d.request_id for d in decisions if d.request_id != req.id and _nodes_of(d) & wanted
            }
            overdue_takers = [
                (t := by_id.get(rid)) is not None
                and t.workload_class in bound
                and now - t.created_at_ms >= bound[t.workload_class]
                for rid in takers
            ]
            if not overdue_takers or not all(overdue_takers):
                out.chance_lost_s.setdefault(req.id, late_s)

    def _wake_at_thresholds(self, created_ms: int, now: int) -> None:
        """The portal ticks every few seconds, this replay when something happens: a
        request kept waiting gets a tick when its wait crosses a threshold of the policy
        (preempt, reserve), as the portal's next tick would see it."""
        for after_s in (self.policy.preempt_after_s, self.policy.reserve_after_s):
            due = created_ms + after_s * 1000
            if due > now:
                self.push(due, 2, "")

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
            self.node_pool.get(placement.pods[0].node, TRACE_POOL),
            req.shape,
            placement,
            now,
            admitted_by_preemption=req.preempting,
            expected_end_ms=None if job.estimate_ms is None else now + job.estimate_ms,
        )
        if job.checkpoint_ms is not None:
            self.checkpointing[attempt] = job.checkpoint_ms
        if job.checkpoint_ms:  # 0 never writes one (`last_checkpoint_ms`)
            heapq.heappush(self.checkpoint_due, (now + job.checkpoint_ms, attempt))
        self.out.first_start_ms.setdefault(request_id, now)
        self.out.waiting.append((job.team, self.waiting_since.pop(request_id), now))
        # a retry resumes from the checkpoints of earlier attempts
        self.push(now + job.runtime_ms - self.progress.get(request_id, 0), 0, attempt)

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
            pool=job.pool,
            attempts=n,
            not_before_ms=due,
            expected_runtime_ms=job.estimate_ms,
        )
        self.waiting_since[run.request_id] = now
        self.push(due, 1, run.request_id)


def drive(
    sim: Simulation,
    jobs: Sequence[Job],
    tick_ms: int,
    until_ms: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Outcome:
    """Run the jobs (in arrival order) through the simulation: arrivals, departures,
    requeues and ticks. `until_ms`: stop there, with what still waits left waiting (a
    what-if whose settings hold some work back for good); `progress(done, total)` is
    told as arrivals are taken in."""
    i = 0
    reported = 0
    while i < len(jobs) or sim.pending or sim.events:
        t_next = min(
            jobs[i].arrival_ms if i < len(jobs) else math.inf,
            sim.events[0][0] if sim.events else math.inf,
        )
        if t_next == math.inf:
            if until_ms is not None:
                break
            raise RuntimeError(f"{len(sim.pending)} requests pending with nothing left to happen")
        now = int(math.ceil(t_next / tick_ms) * tick_ms) if tick_ms > 0 else int(t_next)
        if until_ms is not None and now > until_ms:
            break
        if progress is not None and i - reported >= 500:
            progress(i, len(jobs))
            reported = i
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
                pool=job.pool,
                expected_runtime_ms=job.estimate_ms,
            )
            sim.waiting_since[job.id] = job.arrival_ms
            if sim.history is not None:
                sim.history.observe(job.shape, job.arrival_ms)
            i += 1
        if sim.pending:
            sim.tick(now)
    return sim.out
