"""One scheduling pass (a tick): exactly one decision per pending request.

`schedule(snapshot)` is a pure function of frozen data. Steps:

1. **Index** the snapshot: pools, classes, free capacity (`ClusterState` with every
   running attempt taken; FGD's target workload per pool from `Snapshot.workloads`, or
   the prior of the pool's nodes, `scheduling.workload`), quota books (`scheduling.quota`) and fair-share state.
2. **Order** the pending requests (`scheduling.queue.FairQueue`): preemptors of an
   earlier tick first (the room their victims free is theirs), band, escalation,
   priority, weighted dominant share with decayed usage, age, id — re-ranked after
   every admission.
3. For each request in that order:
   a. reject what can never run (unknown class or pool, a shape no node could hold);
      hold requests still in their requeue backoff and those naming a pool in
      maintenance;
   b. **pools**: the named pool (a canary pool only this way), or every production
      pool; quota (`QuotaBook.check`) keeps those it may use, and pools where it
      borrows nothing come before pools where it borrows; when quota allows none, its
      own lower band may be preempted to make quota room (Kueue's
      `withinClusterQueue: LowerPriority`), with what other teams borrow when devices
      are short too;
   c. **place** with the packer on those pools, skipping nodes held by a
      reservation (a request that borrows nothing ignores the reservations of
      borrowers) or claimed by a preemptor; gangs are placed all or nothing; a request
      that fits elsewhere goes on a scarce node (`scheduling.scarce`) only when nothing
      else fits, and work that is not always preemptible (`never`, `when-borrowing`)
      not before its starvation bound (`Policy.starvation_after` of its class's
      maximum queue time);
   d. if it does not fit: when attempts preempted earlier will free enough room, wait
      for them; else, when it is entitled and has waited `Policy.preempt_after_s`,
      **preempt** (`scheduling.preemption`) within `Policy.max_preemptions_per_tick`
      — only a victim set after which quota still admits it within its team's nominal
      quota (no one loses work so that a team may borrow); past its class's maximum
      queue time also the starvation tier, with victims that lose together up to
      `Policy.starving_loss_ratio` × the GPU-time it has waited, unless the pool is
      overloaded (more starving requests than reservations, or a queue of more requests
      than that asking `Policy.overload_queue_ratio` of its GPUs); the room is claimed for
      it at once and it starts next tick, first in order, once the victims are gone;
   e. else **reserve** (`scheduling.reservation`): the first `Policy.max_reservations`
      blocked requests that are large (`Policy.reserve_min_devices`), escalated or have
      waited `Policy.reserve_after_s` (the oldest first) hold nodes that could host them
      (`scheduling.fit`; `Reservations.reserve`: those expected to drain soonest by
      `Running.expected_end_ms`, else those untouched longest); no later request of the
      tick may use those nodes, so small jobs cannot keep a large one out forever —
      except work expected to end (`PendingRequest.expected_runtime_ms`) before the
      holder's expected start there (`Reservations.backfill`, EASY backfilling); a firm
      reservation (a shape only scarce nodes host, or a request past its starvation
      bound: `Reservations.firm`) comes first, is made before the pass and holds even
      against requests within their nominal;
4. **Explain** every outcome (`scheduling.explain`): a code, a sentence, the facts.

Decisions come back in queue order; the PREEMPT decisions of a preemptor come just
before its own WAIT.

**Alike requests** (same team, class, shape and named pool, runtime estimates that the
reserved nodes' expected starts cannot tell apart for backfilling, on the
same side of the preemption, keep-off and starvation bounds; not a preemptor, a
reservation holder, a request in backoff, nor a starving one that may preempt) cost one
decision: a later one gets the WAIT or REJECT the last one got — its own id, position
and escalation — as long as no preemption, reservation or claim has happened since, and
either no admission either or quota answers it as it did then (with the same figures
when the decision quotes them). Capacity only shrinks during a tick and what found no
room or no victims is remembered (`_Failures`), so the same steps would fail the same
way; `tests/scheduling/test_tick_golden.py` holds the pass to its decisions before this,
and to the decisions each request gets when decided alone.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from scheduling import preemption, reservation, scarce, workload
from scheduling.explain import (
    Code,
    describe,
    gpu_noun,
    gpus,
    quota_sentence,
    reclaim_sentence,
    where,
)
from scheduling.packer import ClusterState, eligible
from scheduling.packer import remembering as packer_remembering
from scheduling.queue import FairQueue, Resources, cluster_capacity
from scheduling.quota import QuotaBook, Verdict, pool_capacity
from scheduling.reservation import Reservations
from scheduling.types import (
    Decision,
    DecisionKind,
    Lifecycle,
    Node,
    PendingRequest,
    Placement,
    Policy,
    Pool,
    PreemptionPolicy,
    Running,
    Shape,
    Snapshot,
    WorkloadClass,
)

ShapeKey = tuple[object, ...]
#: `_Tick.ages` of a class that does not exist
_NO_AGES: tuple[None, None] = (None, None)
#: decisions an alike request may be given as they are (`_Tick.decide`)
_ALIKE_KINDS = (DecisionKind.WAIT, DecisionKind.REJECT)
#: outcomes that say no quota figure: only whether quota allows and borrows matters
_ROOM_CODES = frozenset(
    (Code.NO_CAPACITY, Code.AWAITING_STOP, Code.AWAITING_NODES, Code.NEVER_FITS)
)
#: an outcome that found room (once the stopping attempts are gone): an admission since
#: may have taken it, so it holds only while nothing at all has changed
_FOUND_ROOM = frozenset((Code.AWAITING_STOP,))


@dataclass(slots=True)
class _Seen:
    """The decision an alike request got (`_Tick.decide`): the state it saw and its
    quota answers (`_quota_sig`; None: none asked, it cannot change during the tick)."""

    state: tuple[int, int, int, int]
    quota: tuple[object, ...] | None
    full: bool
    decision: Decision
    #: whether it may still hold after admissions (it found no room: capacity only shrinks)
    failed: bool
    #: the decision's own `__dict__` (never changed: it is frozen), for `_copy`
    fields: dict[str, object]
    #: a WAIT (it says the queue position)
    waits: bool


_new = object.__new__
_set = object.__setattr__


def _copy(seen: _Seen, request_id: str, position: int, escalated: bool) -> Decision:
    """`seen`'s decision for an alike request: the same but for the request's id, queue
    position and escalation. Tens of thousands are made per tick: a copy of the fields
    (the dataclass has no `__post_init__`) takes a fifth of the time of `__init__`'s eleven
    frozen sets, and a copy of an instance's own dict shares its keys (a dict filled
    anew would not: 5x the memory)."""
    fields = seen.fields.copy()
    fields["request_id"] = request_id
    fields["position"] = position if seen.waits else 0
    fields["escalated"] = escalated
    d: Decision = _new(Decision)
    _set(d, "__dict__", fields)
    return d


#: a decision's own dict as `Decision.__init__` fills it, copied by `_made` (keys shared)
_BLANK = vars(Decision(DecisionKind.WAIT, "", "", ""))


def _made(
    kind: DecisionKind,
    request_id: str,
    code: str,
    message: str,
    position: int,
    escalated: bool,
    facts: Mapping[str, object],
) -> Decision:
    """`Decision(kind, request_id, code, message, position=…, escalated=…, facts=…)`, made
    as `_copy` makes one: a tick makes one per request it decides anew."""
    fields = _BLANK.copy()
    fields["kind"] = kind
    fields["request_id"] = request_id
    fields["code"] = code
    fields["message"] = message
    fields["position"] = position
    fields["escalated"] = escalated
    fields["facts"] = facts
    d: Decision = _new(Decision)
    _set(d, "__dict__", fields)
    return d


def _loss_cap(policy: Policy, gpus_milli: int) -> int:
    """`_Tick._victim_loss_cap` of a request of `gpus_milli`."""
    cap = policy.max_victim_loss_gpu_s
    per_gpu = policy.victim_loss_per_gpu_s
    if not per_gpu:
        return cap
    mine = max(1, per_gpu * gpus_milli // 1000)
    return min(cap, mine) if cap else mine


def _quota_sig(verdicts: Iterable[Verdict], full: bool) -> tuple[object, ...]:
    """The quota answers as a decision reads them: with their figures when it says them."""
    if full:
        return tuple((v.ok, v.borrowing, v.code, tuple(sorted(v.facts.items()))) for v in verdicts)
    return tuple((v.ok, v.borrowing, v.code) for v in verdicts)


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Keep what ticks compute again and again from the same inputs (the packer's group
    evaluations, when a node drains for a shape) across the `schedule()` calls made
    inside: a replay's tens of thousands of ticks. The decisions are the same."""
    with reservation.remembering(), packer_remembering():
        yield


_F = TypeVar("_F", bound=Callable[..., Any])
#: `_collector_paused`: ticks under way, and whether the collector ran before the first
_paused_lock = threading.Lock()
_paused = [0, False]


def _collector_paused(fn: _F) -> _F:
    """Run `fn` with the cyclic garbage collector paused, as the portal's tick does
    (`portal.tick.run`) for every caller of the core (replays, what-if, benchmarks).

    A tick at 100,000 pending allocates millions of small objects, all freed by reference
    counting (`test_tick_golden.py` checks that a tick leaves no cycle behind); the
    collector's passes over the snapshot while they come and go were a fifth of its CPU.
    Counted, so that ticks in two threads leave the collector as the first found it."""

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> Any:
        with _paused_lock:
            if not _paused[0]:
                _paused[1] = gc.isenabled()
                gc.disable()
            _paused[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with _paused_lock:
                _paused[0] -= 1
                if not _paused[0] and _paused[1]:
                    gc.enable()

    return cast(_F, paused)


def cluster_state(snapshot: Snapshot, policy: Policy) -> ClusterState:
    """The snapshot's nodes with every running attempt taken, as a tick starts from."""
    state = ClusterState(
        snapshot.nodes,
        policy.packer,
        pool_shape_weights=workload.pool_targets(snapshot.nodes, snapshot.workloads),
    )
    state.take_many(run.placement for run in snapshot.running)
    return state


def schedule(
    snapshot: Snapshot,
    now_ms: int | None = None,
    policy: Policy | None = None,
    state: ClusterState | None = None,
) -> list[Decision]:
    """Return exactly one decision per pending request (plus PREEMPTs), in queue order.

    `state`: the snapshot's nodes with every running attempt taken, kept by a caller that
    ticks again and again (the replay) instead of rebuilt here each tick. The tick takes
    its admissions in it and leaves the rest as it found it; the caller gives back what
    stops."""
    now = snapshot.now_ms if now_ms is None else now_ms
    tick = _Tick(snapshot, now, policy or Policy(), state)
    return tick.run()


@dataclass(slots=True)
class _Failures:
    """Shapes that did not fit this tick, per (shape family, pools); capacity only shrinks
    during a tick, so anything at least as large as a failure fails too."""

    seen: dict[ShapeKey, list[tuple[int, ...]]] = field(default_factory=dict)

    @staticmethod
    def split(shape: Shape, pools: tuple[str, ...]) -> tuple[ShapeKey, tuple[int, ...]]:
        family = (
            shape.kind,
            shape.mig_profile,
            shape.gpu_models,
            shape.tolerations,
            shape.pods,
            pools,
        )
        size = (shape.count, shape.milli, shape.gpu_memory_mib, shape.cpu_milli, shape.memory_mib)
        return family, size

    def known(self, shape: Shape, pools: tuple[str, ...], *more: int) -> bool:
        """`more`: further sizes in which larger fails too (a victim cap, negated)."""
        family, size = self.split(shape, pools)
        size += more
        failed = self.seen.get(family, ())
        # Most asks repeat a size that failed (the same shape, request after request).
        return size in failed or any(
            all(a >= b for a, b in zip(size, f, strict=True)) for f in failed
        )

    def add(self, shape: Shape, pools: tuple[str, ...], *more: int) -> None:
        family, size = self.split(shape, pools)
        self.seen.setdefault(family, []).append(size + more)


class _Tick:
    @_collector_paused
    def __init__(
        self, snapshot: Snapshot, now_ms: int, policy: Policy, state: ClusterState | None = None
    ) -> None:
        self.snap = snapshot
        self.now = now_ms
        self.policy = policy
        self.pools: dict[str, Pool] = {p.name: p for p in snapshot.pools}
        self.classes: dict[str, WorkloadClass] = {c.name: c for c in snapshot.classes}
        self.production = tuple(
            sorted(p.name for p in snapshot.pools if p.lifecycle is Lifecycle.PRODUCTION)
        )
        self.node_pool: dict[str, str] = {n.name: n.pool for n in snapshot.nodes}
        self.node_by_name: dict[str, Node] = {n.name: n for n in snapshot.nodes}
        # FGD's target workload per pool comes from the pool's shape history in the
        # snapshot (or the prior of its nodes), never from this tick's requests alone.
        if state is None:
            state = cluster_state(snapshot, policy)
        elif not state.retarget(workload.pool_targets(snapshot.nodes, snapshot.workloads)):
            raise ValueError("state: built for other pools, or with random tie-breaks")
        self.state = state
        # One pass over the running attempts (tens of thousands; a replay's every tick)
        # sums what quota and the fair shares count and finds what may be preempted.
        #: per (team, pool, class), GPU milli held (stopping attempts too: quota counts them)
        held_by: dict[tuple[str, str, str], int] = {}
        #: per team, [GPU milli, CPU milli, memory MiB] held
        team_held: dict[str, list[int]] = {}
        self.running: list[Running] = []
        self.stopping: list[Running] = []
        #: per pool and (team, class), the running attempts any request might preempt this
        #: tick: a class that allows it, past its minimum runtime (`preemption.candidates`
        #: decides the rest)
        self.preemptible: dict[str, dict[tuple[str, str], list[Running]]] = {}
        #: per class, the start before which an attempt is past its minimum runtime (None:
        #: never preempted)
        ripe: dict[str, int | None] = {
            c.name: None
            if c.preemption is PreemptionPolicy.NEVER
            else now_ms - c.min_runtime_s * 1000
            for c in snapshot.classes
        }
        for run in snapshot.running:
            shape, team, wc = run.shape, run.team, run.workload_class
            key3 = (team, run.pool, wc)
            held_by[key3] = held_by.get(key3, 0) + shape.gpus_milli
            acc = team_held.get(team)
            if acc is None:
                acc = team_held[team] = [0, 0, 0]
            acc[0] += shape.gpus_milli
            acc[1] += shape.cpu_milli * shape.pods
            acc[2] += shape.memory_mib * shape.pods
            if run.stopping:
                self.stopping.append(run)
                continue
            self.running.append(run)
            since = ripe.get(wc)
            if since is not None and run.started_at_ms <= since:
                group = self.preemptible.get(run.pool)
                if group is None:
                    group = self.preemptible[run.pool] = {}
                mine = group.get((team, wc))
                if mine is None:
                    group[(team, wc)] = [run]
                else:
                    mine.append(run)
        self.book = QuotaBook(
            snapshot.pools, snapshot.nodes, snapshot.quotas, (), self.classes, held=held_by
        )
        self.queue = FairQueue(
            snapshot.pending,
            self.classes,
            snapshot.teams,
            snapshot.usage,
            (),
            cluster_capacity(snapshot.nodes),
            now_ms,
            policy.usage_half_life_s,
            policy.escalate_after,
            held={t: Resources(*acc) for t, acc in team_held.items()},
        )
        self.failures = _Failures()
        #: alike requests (`_alike`): the decision the last one got, and the state it saw
        self.alike: dict[tuple[object, ...], _Seen] = {}
        #: bumped by each preemption plan (`_state`; admissions are counted apart)
        self.changes = 0
        #: the quota answers of the last `_decide` (None: it asked none)
        self.verdicts: dict[str, Verdict] | None = None
        self.preempt_ms = policy.preempt_after_s * 1000
        #: per class, the waits (ms) of `starving` and `_kept_off`, None where never
        self.ages: dict[str, tuple[float | None, float | None]] = {}
        after = policy.starvation_after
        for c in snapshot.classes:
            self.ages[c.name] = (
                after * c.max_queue_s * 1000 if after > 0 and c.max_queue_s > 0 else None,
                None
                if c.preemption is PreemptionPolicy.ALWAYS
                else (after if after > 0 else 1.0) * c.max_queue_s * 1000,
            )
        self.no_victims = _Failures()
        self.no_room_after_stops = _Failures()
        self.candidates: dict[tuple[str, ...], list[preemption.Candidate]] = {}
        #: `preemption.by_node` of `candidates[base]`: plans for other shapes ask again
        self.victims_on: dict[tuple[str, ...], list[preemption.OnNode]] = {}
        #: what narrows `candidates[base]` to `candidates[who]` (None: nothing)
        self.kept: dict[tuple[str, ...], Callable[[preemption.Candidate], bool] | None] = {}
        #: `preemption.candidates`'s memo of one group's candidates, kept as long as
        #: `candidates`
        self.candidate_groups: dict[tuple[object, ...], list[preemption.Keyed]] = {}
        #: `preemption.by_node`'s per-attempt sums, kept for the tick
        self.spans: dict[str, tuple[tuple[str, int], ...]] = {}
        #: nodes where a preemptor will start once its victims have stopped
        self.claimed: dict[str, str] = {}
        self.preemptions = 0
        #: preemptors of an earlier tick: the room their victims free is theirs
        self.claimants: set[str] = set()
        self.never: dict[tuple[Shape, tuple[str, ...]], bool] = {}
        #: no node there now could hold the shape (`never` counts autoscaled growth too)
        self.short: dict[tuple[Shape, tuple[str, ...]], bool] = {}
        # One pass over the pending requests (a hundred thousand at a deep queue) for
        # what the rest of the set-up counts. Shapes are told apart by their number
        # (`Shape.number`) here and in `_alike`, not by their dozen fields.
        asked: dict[tuple[str, int], Shape] = {}
        #: requests per (named pool, shape number)
        alike: dict[tuple[str, int], int] = {}
        named: dict[str, int] = {}  # starving requests per named pool ("": any production one)
        ages = self.ages
        for r in snapshot.pending:
            shape = r.shape
            key = (r.pool, shape.number)
            many = alike.get(key)
            if many is None:
                alike[key] = 1
                asked[key] = shape
            else:
                alike[key] = many + 1
            bound = ages.get(r.workload_class, _NO_AGES)[0]
            if bound is not None and now_ms - r.created_at_ms >= bound:
                named[r.pool] = named.get(r.pool, 0) + 1
            if r.preempting:
                self.claimants.add(r.id)
        # the largest victim-loss cap of any pending request (0: one has none)
        caps = [_loss_cap(policy, shape.gpus_milli) for shape in asked.values()]
        self.loss_cap_max = 0 if not caps or 0 in caps else max(caps)
        # The few nodes able to host a rare shape (learned or pending) take other work
        # only when nothing else fits it (`scheduling.scarce`); a whole-node shape only
        # learned keeps at most `learned_kept_nodes` of its hosts, a pending one more.
        # Thousands of pending requests come in a few hundred shapes: each (pool, shape)
        # once, in the order first seen.
        learned = [
            (w.pool, s) for w in snapshot.workloads or () for s, weight in w.weights if weight > 0
        ]
        waiting = tuple(
            dict.fromkeys(
                (p, shape)
                for (pool_name, _), shape in asked.items()
                for p in ((pool_name,) if pool_name else self.production)
            )
        )
        self.scarce = (
            scarce.scarce_nodes(snapshot.nodes, (*learned, *waiting))
            | scarce.kept_nodes(snapshot.nodes, waiting)
            | scarce.kept_nodes(snapshot.nodes, learned, most=policy.learned_kept_nodes)
        )
        self.elsewhere: dict[tuple[Shape, tuple[str, ...]], bool] = {}
        self.scarce_only: dict[tuple[Shape, tuple[str, ...]], bool] = {}
        #: step 3e: who may hold nodes, the nodes held, what may backfill them
        self.res = Reservations(self)
        # read at every placement (`_accept`): the same objects as `self.res`'s
        self.reserved = self.res.reserved
        self.reserved_borrowing = self.res.reserved_borrowing
        # read for every pending request (`decide`, `_alike`): the same objects as
        # `self.res`'s and `self.queue`'s
        self.admitted = self.res.admitted
        self.reserve_start = self.res.reserve_start
        self.escalated = self.queue.escalated
        #: whose decision is never copied to an alike request (`_alike`): room claimed or
        #: held is theirs alone
        self.own_room = self.claimants | self.res.may_reserve
        #: per pool, how many pending requests are past their starvation bound
        self.starving_in: dict[str, int] = {}
        for name, n in named.items():
            for p in (name,) if name else self.production:
                self.starving_in[p] = self.starving_in.get(p, 0) + n
        #: pools with a deep queue: more requests than may hold reservations, asking
        #: `Policy.overload_queue_ratio` of the pool's usable GPUs or more (`pool_capacity`:
        #: healthy devices of ready, uncordoned nodes; a request free to go
        #: to any production pool counts in each, its GPUs by the pool's share of theirs)
        self.deep: dict[str, tuple[int, int, int]] = {}  # pool -> (requests, milli, its milli)
        if policy.overload_queue_ratio > 0:
            asking: dict[str, int] = {}  # GPU milli asked per named pool
            queued: dict[str, int] = {}  # requests per named pool
            for (name, n), many in alike.items():
                asking[name] = asking.get(name, 0) + many * asked[(name, n)].gpus_milli
                queued[name] = queued.get(name, 0) + many
            gpus = pool_capacity(snapshot.nodes)
            anywhere = sum(gpus.get(p, 0) for p in self.production)
            for name, have in gpus.items():
                milli, count = asking.get(name, 0), queued.get(name, 0)
                if name in self.production and anywhere:
                    milli += asking.get("", 0) * have // anywhere
                    count += queued.get("", 0)
                deep = have and milli >= policy.overload_queue_ratio * have
                if deep and count > policy.max_reservations:
                    self.deep[name] = (count, milli, have)
        #: `_overloaded` for the pools a request naming a pool ("" for none) may use
        # (filled as asked: a closure over the tick here would keep it alive until the
        # cyclic collector runs, with its whole cluster state)
        self.overloaded_in: dict[str, bool] = {}

    # -- the pass -------------------------------------------------------------------

    @_collector_paused
    def run(self) -> list[Decision]:
        out: list[Decision] = []
        position = 0
        # The room a preemptor's victims freed is its own before any reservation is made:
        # even a firm one would otherwise take it, and the victims' loss would buy nothing.
        for claimant in self.snap.pending:
            if claimant.preempting:
                self._fits_after_stops(
                    claimant, (claimant.pool,) if claimant.pool else self.production
                )
        # A reservation holder that only scarce nodes can host holds them from the start
        # of the pass: requests ahead of it in the queue can go elsewhere.
        self.res.reserve_firm(self)
        pop, decide, extend = self.queue.pop, self.decide, out.extend
        while (req := pop()) is not None:
            position += 1
            extend(decide(req, position))
        return out

    def decide(self, req: PendingRequest, position: int) -> list[Decision]:
        """Return the decisions for one request: its own, after any PREEMPTs it causes.

        Requests that are alike (`_alike`) get the same decision while nothing has changed
        in between (`_state`): thousands of them in a deep queue cost one decision."""
        key = self._alike(req)
        if key is None:
            return self._decide(req, position)
        state = (self.changes, len(self.admitted), len(self.reserved), len(self.claimed))
        seen = self.alike.get(key)
        if seen is not None and (
            seen.quota is None or seen.state == state or self._still(req, seen, state)
        ):
            return [_copy(seen, req.id, position, self.escalated.get(req.id, False))]
        self.verdicts = None
        out = self._decide(req, position)
        if len(out) == 1 and out[0].kind in _ALIKE_KINDS and self._state() == state:
            verdicts = self.verdicts
            d = out[0]
            full = d.code not in _ROOM_CODES
            quota = None if verdicts is None else _quota_sig(verdicts.values(), full)
            # (a WAIT made before the queue is read, such as a pool in maintenance, says none)
            waits = d.kind is DecisionKind.WAIT and d.position == position
            self.alike[key] = _Seen(
                state, quota, full, d, d.code not in _FOUND_ROOM, vars(d), waits
            )
        return out

    def _still(self, req: PendingRequest, seen: _Seen, state: tuple[int, int, int, int]) -> bool:
        """Whether an alike request's decision still holds: nothing changed since, or only
        admissions did and quota answers the request as it did then. Capacity only shrinks
        during a tick and what found no room or no victims is remembered (`_Failures`), so
        then the same pools fail the same way; a quota wait says the quota figures, so those
        must match too."""
        if seen.quota is None or seen.state == state:
            return True
        if not seen.failed or seen.state[0] != state[0] or seen.state[2:] != state[2:]:
            return False
        pools = (req.pool,) if req.pool else self.production
        milli = req.shape.gpus_milli
        check = self.book.check
        now = _quota_sig((check(req.team, p, milli, req.workload_class) for p in pools), seen.full)
        if now != seen.quota:
            return False
        # It holds at this state too: the alike requests after it, until the next change,
        # need not ask quota again (what is compared above stays equal).
        seen.state = state
        return True

    def _alike(self, req: PendingRequest) -> tuple[object, ...] | None:
        """What the pass reads of a request, but for its id and queue position; None for
        one whose decision is its own (a preemptor, a reservation holder, a request in
        backoff, or one past its starvation bound that may preempt: its age sets what it
        may lose)."""
        if req.preempting or req.id in self.own_room or req.not_before_ms > self.now:
            return None
        ages = self.ages.get(req.workload_class)
        if ages is None:
            return (req.workload_class,)
        waited = self.now - req.created_at_ms
        starve_ms, keep_off_ms = ages
        starving = starve_ms is not None and waited >= starve_ms
        if starving:
            over = self.overloaded_in.get(req.pool)
            if over is None:
                pools = (req.pool,) if req.pool else self.production
                over = self.overloaded_in[req.pool] = self._overloaded(pools)
            if not over:
                return None
        return (
            starving,
            req.team,
            req.workload_class,
            req.shape.number,
            req.pool,
            # (`_backfill_room`, its common answer inline: this runs once per request)
            0
            if req.expected_runtime_ms is None or not self.reserve_start
            else self._backfill_room(req.expected_runtime_ms),
            waited < self.preempt_ms,
            keep_off_ms is not None and waited < keep_off_ms,
        )

    def _backfill_room(self, runtime_ms: int | None) -> int:
        """How many reserved nodes are expected to start their holder only after a request
        of this expected runtime would end: all that the runtime changes in a decision to
        wait (`Reservations.backfill`). Alike requests rarely share an estimate, and the
        reserved nodes are part of `_state`, so the count stands for the runtime."""
        if runtime_ms is None or not self.reserve_start:
            return 0
        return self.res.count_starting_after(self.now + runtime_ms)

    def _state(self) -> tuple[int, int, int, int]:
        """What changes when a decision takes room or quota, claims or holds nodes:
        preemptions, admissions, reservations, claims."""
        return (self.changes, len(self.admitted), len(self.reserved), len(self.claimed))

    def _decide(self, req: PendingRequest, position: int) -> list[Decision]:
        cls = self.classes.get(req.workload_class)
        if cls is None:
            msg = f"rejected: workload class {req.workload_class!r} does not exist"
            return [self._decision(DecisionKind.REJECT, req, Code.UNKNOWN_CLASS, msg)]
        pools = self._pools_for(req)
        if isinstance(pools, Decision):
            return [pools]
        if req.not_before_ms > self.now:
            wait_s = (req.not_before_ms - self.now + 999) // 1000
            msg = f"waiting: requeued after attempt {req.attempts}; may start again in {wait_s} s"
            hold = {"not_before_ms": req.not_before_ms, "attempts": req.attempts}
            return [self._wait(req, position, Code.BACKOFF, msg, hold)]
        verdicts = {
            p: self.book.check(req.team, p, req.shape.gpus_milli, req.workload_class) for p in pools
        }
        self.verdicts = verdicts
        allowed = [p for p in pools if verdicts[p].ok]
        if not allowed:
            if self._never_fits(req.shape, pools):
                return [self._reject_never(req, pools)]
            # Kueue's withinClusterQueue: LowerPriority: a team at its limit makes quota room
            # by preempting its own lower band.
            done = self._preempt(req, cls, list(pools), verdicts, position, own=True)
            if done is not None:
                return done
            first = verdicts[pools[0]]
            msg = "waiting: " + quota_sentence(first.code, first.facts)
            quota: dict[str, object] = {"pools": {p: v.facts for p, v in verdicts.items()}}
            lendable = tuple(p for p in pools if verdicts[p].code == Code.COHORT_EXHAUSTED)
            if lendable and self.res.reserve(self, req, lendable, borrowing=True):
                # Quota is as scarce as devices here: hold what is lent back for it too, so
                # small borrowers cannot keep a large one out forever.
                for p in lendable:
                    self.book.hold_back(p, req.shape.gpus_milli)
                quota["reserved_nodes"] = sorted(n for n, o in self.reserved.items() if o == req.id)
                msg += "; capacity coming free is held for it"
            return [self._wait(req, position, Code(first.code), msg, quota)]
        for tier, entitled in (
            (tuple(p for p in allowed if not verdicts[p].borrowing), True),
            (tuple(p for p in allowed if verdicts[p].borrowing), False),
        ):
            placement = self._find(req, tier, entitled) if tier else None
            if placement is None and tier:
                placement = self.res.backfill(self, req, tier)
            if placement is not None:
                return [self._admit(req, cls, placement, verdicts, position)]
        if self._never_fits(req.shape, pools):
            return [self._reject_never(req, pools)]
        return self._blocked(req, cls, allowed, verdicts, position)

    # -- steps ----------------------------------------------------------------------

    def _pools_for(self, req: PendingRequest) -> tuple[str, ...] | Decision:
        """Return the pools a request may use, or the decision that holds it back (step 3a–b)."""
        if not req.pool:
            return self.production
        pool = self.pools.get(req.pool)
        if pool is None:
            msg = f"rejected: pool {req.pool!r} does not exist"
            return self._decision(DecisionKind.REJECT, req, Code.UNKNOWN_POOL, msg)
        if pool.lifecycle is Lifecycle.MAINTENANCE:
            msg = f"waiting: pool {req.pool} is in maintenance"
            return self._decision(
                DecisionKind.WAIT, req, Code.POOL_MAINTENANCE, msg, facts={"pool": req.pool}
            )
        return (req.pool,)

    def _find(
        self, req: PendingRequest, pools: tuple[str, ...], entitled: bool
    ) -> Placement | None:
        shape = req.shape
        elsewhere = self.fits_elsewhere(shape, pools)
        # Work that the rare shapes could not preempt would keep a scarce node from them for
        # its whole runtime: it waits for other nodes up to its starvation bound.
        keep_off = elsewhere and self._kept_off(req)
        key = (*pools, "entitled" if entitled else "", "keep-off" if keep_off else "")
        # Claims of a preemptor and nodes reserved for a holder are their own: their
        # answer is not another request's.
        cached = req.id not in self.claimants and req.id not in self.reserved.values()
        if cached and self.failures.known(shape, key):
            return None
        placement = None
        if elsewhere:
            placement = self.state.find(
                shape, self._accept(pools, entitled, req.id, self.scarce), pools, self.scarce
            )
        if placement is None and not keep_off:
            placement = self.state.find(shape, self._accept(pools, entitled, req.id), pools)
        if placement is None and cached:
            self.failures.add(shape, key)
        return placement

    def fits_elsewhere(self, shape: Shape, pools: tuple[str, ...]) -> bool:
        """Whether some node of the pools that is not scarce could ever host the shape."""
        if not self.scarce:
            return False
        key = (shape, pools)
        found = self.elsewhere.get(key)
        if found is None:
            nodes = self.snap.nodes
            found = any(scarce.hosts(nodes, p, shape) - self.scarce for p in pools)
            self.elsewhere[key] = found
        return found

    def _kept_off(self, req: PendingRequest) -> bool:
        """Whether the request stays off scarce nodes: its class is not always preemptible
        (`never`, or `when-borrowing`, which its team's quota may protect and which does
        not checkpoint) and it has not reached its starvation bound (its class's maximum
        queue time when the bound is off). The same bound as preemption's: a request that
        may preempt there may also take what is free there."""
        cls = self.classes.get(req.workload_class)
        if cls is None or cls.preemption is PreemptionPolicy.ALWAYS:
            return False
        after = self.policy.starvation_after if self.policy.starvation_after > 0 else 1.0
        return self.now - req.created_at_ms < after * cls.max_queue_s * 1000

    def only_scarce(self, shape: Shape, pools: tuple[str, ...]) -> bool:
        """Whether the shape fits some node of the pools, and only scarce ones."""
        if not self.scarce:
            return False
        key = (shape, pools)
        found = self.scarce_only.get(key)
        if found is None:
            found = self.scarce_only[key] = not self.fits_elsewhere(shape, pools) and any(
                scarce.hosts(self.snap.nodes, p, shape) for p in pools
            )
        return found

    def _accept_for(
        self, req: PendingRequest, pools: tuple[str, ...], entitled: bool
    ) -> Callable[[Node], bool]:
        """`_accept`, without scarce nodes for work kept off them (see `_find`)."""
        if not (self.fits_elsewhere(req.shape, pools) and self._kept_off(req)):
            return self._accept(pools, entitled, req.id)
        return self._accept(pools, entitled, req.id, self.scarce)

    def _accept(
        self,
        pools: tuple[str, ...],
        entitled: bool = False,
        owner: str = "",
        spare: frozenset[str] = frozenset(),
    ) -> Callable[[Node], bool]:
        """Nodes of the pools not held for another request: not reserved (a request within
        its nominal quota, `entitled`, ignores the reservations of borrowers), not claimed
        by another preemptor, and not in `spare` (scarce nodes it leaves to others)."""
        reserved = self.reserved
        borrowing = self.reserved_borrowing
        claimed = self.claimed

        def accept(node: Node) -> bool:
            name = node.name
            if node.pool not in pools or claimed.get(name, owner) != owner or name in spare:
                return False
            holder = reserved.get(name)
            return holder is None or holder == owner or (entitled and name in borrowing)

        return accept

    def _admit(
        self,
        req: PendingRequest,
        cls: WorkloadClass,
        placement: Placement,
        verdicts: dict[str, Verdict],
        position: int,
    ) -> Decision:
        self.state.take(placement)
        end = None if req.expected_runtime_ms is None else self.now + req.expected_runtime_ms
        self.res.admit(placement, end)
        pool = self.node_pool[placement.pods[0].node]
        verdict = verdicts[pool]
        milli = req.shape.gpus_milli
        self.book.add(req.team, pool, milli, req.workload_class, verdict.borrowing)
        self.queue.charge(req.team, req.shape)
        names = set(placement.nodes)
        nodes = ", ".join(sorted(names))
        if verdict.borrowing:
            code = Code.BORROWS
            over = verdict.facts["used_milli"]
            nominal = int(str(verdict.facts["nominal_milli"]))
            borrowed = int(str(over)) + milli - max(nominal, int(str(over)))
            msg = (
                f"admitted on {nodes} in pool {pool}, borrowing {gpu_noun(borrowed)} beyond team "
                f"{req.team}'s {gpus(nominal)} guaranteed; borrowed GPUs may be reclaimed"
            )
        else:
            code = Code.FITS
            msg = f"admitted on {nodes} in pool {pool} within team {req.team}'s guaranteed quota"
        facts = dict(verdict.facts)
        facts["class"] = cls.name
        kept = sorted(names & self.scarce)
        if kept and self.fits_elsewhere(req.shape, (pool,)):
            # Its terms, said when they are set (`scarce-node` preemption).
            msg += (
                f"; {', '.join(kept)} is kept for shapes few nodes can hold, and a request "
                "of such a shape that has waited its class's maximum queue time may preempt it"
            )
            facts["scarce_nodes"] = kept
        return Decision(
            DecisionKind.ADMIT,
            req.id,
            code,
            msg,
            placement=placement,
            pool=pool,
            position=position,
            borrowing=verdict.borrowing,
            escalated=self.queue.escalated.get(req.id, False),
            facts=facts,
        )

    def _blocked(
        self,
        req: PendingRequest,
        cls: WorkloadClass,
        allowed: list[str],
        verdicts: dict[str, Verdict],
        position: int,
    ) -> list[Decision]:
        """Step 3d–e: wait for stopping attempts, preempt, or reserve."""
        if self.stopping and self._fits_after_stops(req, tuple(allowed)):
            msg = (
                f"waiting: preempted attempts are stopping in {where(allowed)} to make room for it"
            )
            stopping = {"stopping": sorted(r.attempt_id for r in self.stopping)}
            return [self._wait(req, position, Code.AWAITING_STOP, msg, stopping)]
        done = self._preempt(req, cls, allowed, verdicts, position)
        overloaded = False
        if done is None and self.starving(req, cls):
            overloaded = self._overloaded(allowed)
            if not overloaded:
                done = self._preempt(req, cls, allowed, verdicts, position, starving=True)
        if done is not None:
            return done
        what = describe(req.shape)
        facts: dict[str, object] = {"pools": list(allowed), "shape": what}
        if overloaded:
            facts["overloaded"] = True
        if self._needs_nodes(req.shape, tuple(allowed)):
            msg = (
                f"waiting: no node in {where(allowed)} can hold {what} yet; "
                "the pool may add nodes that can"
            )
            return [self._wait(req, position, Code.AWAITING_NODES, msg, facts)]
        msg = f"waiting: no node in {where(allowed)} has {what} free right now"
        borrowing = all(verdicts[p].borrowing for p in allowed)
        if req.id in self.reserved.values() or self.res.reserve(
            self, req, tuple(allowed), borrowing
        ):
            held = sorted(n for n, owner in self.reserved.items() if owner == req.id)
            facts["reserved_nodes"] = held
            start = self.res.reserve_start.get(held[0]) if held else None
            if start is not None:
                facts["expected_start_ms"] = start
            msg += f"; {', '.join(held)} {'is' if len(held) == 1 else 'are'} held back for it"
        elif self.reserved:
            owners = sorted(set(self.reserved.values()))
            facts["reserved_for"] = owners
            n = len(self.reserved)
            msg += f"; {n} {'node is' if n == 1 else 'nodes are'} held for earlier large requests"
        if overloaded:
            msg += "; " + self._overload_sentence(allowed)
        return [self._wait(req, position, Code.NO_CAPACITY, msg, facts)]

    def _overload_sentence(self, pools: Sequence[str]) -> str:
        """Why a request past its starvation bound waits instead of preempting."""
        head = "it has waited its class's maximum queue time, but "
        tail = ": it keeps its place by age instead of preempting"
        if len(pools) != 1:
            return head + f"every pool it may use is overloaded{tail}"
        pool = pools[0]
        starving = self.starving_in.get(pool, 0)
        if starving > self.policy.max_reservations:
            why = (
                f"{starving} requests there have waited that long, more than the "
                f"{self.policy.max_reservations} that may hold nodes"
            )
        else:
            count, milli, have = self.deep[pool]
            why = f"{count} requests wait there asking {milli / have:.1f}× its GPUs"
        return head + f"pool {pool} is overloaded ({why}){tail}"

    def _fits_after_stops(self, req: PendingRequest, pools: tuple[str, ...]) -> bool:
        """Return whether the request fits once the stopping attempts are gone; a preemptor
        claims that room so that nothing later in the tick takes it."""
        # The stopping set is fixed for the tick and room only shrinks, so a shape that
        # found none is answered from memory, as in `_find`, unless nodes are its own.
        cached = req.id not in self.claimants and req.id not in self.reserved.values()
        if cached and self.no_room_after_stops.known(req.shape, pools):
            return False
        for run in self.stopping:
            self.state.give(run.placement)
        found = self.state.find(req.shape, self._accept(pools, owner=req.id), pools)
        for run in self.stopping:
            self.state.take(run.placement)
        if found is None and cached:
            self.no_room_after_stops.add(req.shape, pools)
        if found is not None and req.preempting:
            for name in found.nodes:
                self.claimed[name] = req.id
        return found is not None

    def _preempt(
        self,
        req: PendingRequest,
        cls: WorkloadClass,
        pools: list[str],
        verdicts: dict[str, Verdict],
        position: int,
        own: bool = False,
        starving: bool = False,
    ) -> list[Decision] | None:
        """Step 3d: preempt for the request in the first pool where a victim set works.

        `own`: quota holds the request back (`borrowing-limit`, `cohort-exhausted`), so its
        own team's lower band must make quota room (Kueue's `withinClusterQueue:
        LowerPriority`), and what other teams borrow may add device room. `starving`: the request has waited past its class's maximum
        queue time and may also take the same or a lower band of any team (tier 4). Any
        plan must leave quota admitting the request once its victims have stopped
        (`QuotaBook.check_without`), so no victim loses work for nothing, and, but for a
        starving request, within its team's nominal quota.
        """
        cap = self.policy.max_preemptions_per_tick - self.preemptions
        if starving and self.preemptions == 0 < cap:
            # The rate cap spreads preemptions over ticks; it must not make a request past
            # its promise unable to start where it needs more victims than a tick's share.
            cap = max(cap, len(self.snap.running))
        if cap <= 0 or self.now - req.created_at_ms < self.policy.preempt_after_s * 1000:
            return None
        max_loss = self._victim_loss_cap(req)
        budget = self._loss_budget(req) if starving else 0
        for pool in pools:
            book = self.book.pools[pool]
            if own and verdicts[pool].code not in (Code.BORROWING_LIMIT, Code.COHORT_EXHAUSTED):
                continue
            # Quota-blocked, the team may reclaim too once its own victims bring it back
            # within nominal (Kueue's "preempt from all ClusterQueues in cohort"); `quota_ok`
            # below holds it to that end.
            reclaim = book.managed and (own or not verdicts[pool].borrowing)
            displace = self._displace(req.shape, pool) if starving else None
            # Within a tick, victims only get fewer: remember who found none (by shape size).
            base: tuple[str, ...] = (pool, req.team, cls.name, str(reclaim), str(own))
            base += (str(starving), str(budget), str(displace is not None))
            who = (*base, str(max_loss))
            # A smaller victim cap finds no more victims than a larger one (0: no cap).
            tighter = -max_loss if max_loss else -(1 << 62)
            if self.no_victims.known(req.shape, base, tighter):
                continue
            # Without a scarce node at stake no request of the tick may take a victim that
            # loses more than the largest request's own cap (`loss_cap_max`): the tick's
            # lists stop there, not at the policy's cap. At a deep queue the policy's lists
            # held thousands of victims that every request's cap rules out, each list
            # sorted and indexed per node.
            listed_cap = (
                self.loss_cap_max if displace is None else self.policy.max_victim_loss_gpu_s
            )
            if base not in self.candidates:
                found_cands = preemption.candidates(
                    self.preemptible.get(pool, {}),
                    self.classes,
                    book,
                    req.team,
                    cls.band,
                    cls.inference,
                    reclaim,
                    self.now,
                    listed_cap,
                    req.created_at_ms if starving else None,
                    budget,
                    displace,
                    self.candidate_groups,
                )
                if own:
                    found_cands = [
                        c
                        for c in found_cands
                        if c.reason is Code.RECLAIM
                        or (c.run.team == req.team and c.band < cls.band)
                    ]
                self.candidates[base] = found_cands
            if who not in self.candidates:
                # The request's own cap (`_victim_loss_cap`) only narrows the tick's list.
                narrowed = self.candidates[base]
                keep: Callable[[preemption.Candidate], bool] | None = None
                if max_loss != listed_cap:
                    limit = max(max_loss * 1_000_000, budget)
                    scarce_limit = max(limit, preemption.SCARCE_LOSS_FACTOR * budget)

                    def keep(
                        c: preemption.Candidate, low: int = limit, high: int = scarce_limit
                    ) -> bool:
                        return c.lost <= (high if c.reason is Code.SCARCE_NODE else low)

                    narrowed = [c for c in narrowed if keep(c)]
                self.candidates[who] = narrowed
                self.kept[who] = keep
            # Indexed per node once per tick's list; a request's own cap filters per node
            # as a plan gets there.
            on = self.victims_on.get(base)
            if on is None:
                on = self.victims_on[base] = preemption.by_node(self.candidates[base], self.spans)
            after: dict[str, Verdict] = {}

            def quota_ok(
                victims: Sequence[Running], pool: str = pool, after: dict[str, Verdict] = after
            ) -> bool:
                v = self.book.check_without(
                    req.team, pool, req.shape.gpus_milli, req.workload_class, victims
                )
                after["verdict"] = v
                # Borrowed capacity is best effort: no one loses work so that a team may
                # borrow (Kueue: only a workload that fits within nominal preempts), except
                # for a starving request (the starvation bound).
                return v.ok and (starving or not v.borrowing)

            entitled = book.managed and not verdicts[pool].borrowing
            found = preemption.plan(
                self.state,
                req.shape,
                self._accept_for(req, (pool,), entitled),
                self.candidates[who],
                book,
                cap,
                self.node_by_name,
                quota_ok,
                anywhere=own,
                allowed=lambda victims: preemption.within_budget(victims, max_loss, budget),
                on_nodes=on,
                keep=self.kept[who],
            )
            if found is None:
                self.no_victims.add(req.shape, base, tighter)
                continue
            quota_ok([v.run for v in found.victims])
            return self._apply_plan(req, cls, pool, found, after["verdict"], position)
        return None

    def _displace(self, shape: Shape, pool: str) -> Callable[[Running], bool] | None:
        """For a shape that only the pool's scarce nodes can host: whether a running
        attempt holds one of those nodes with work that fits elsewhere (a `scarce-node`
        victim, `scheduling.preemption`); None for any other shape."""
        if not self.only_scarce(shape, (pool,)):
            return None
        needed = scarce.hosts(self.snap.nodes, pool, shape)

        def squats(run: Running) -> bool:
            return any(p.node in needed for p in run.placement.pods) and self.fits_elsewhere(
                run.shape, (pool,)
            )

        return squats

    def _victim_loss_cap(self, req: PendingRequest) -> int:
        """GPU-seconds one victim of the request may lose (0 = no limit):
        `Policy.max_victim_loss_gpu_s`, and at most `Policy.victim_loss_per_gpu_s` per GPU
        of the request, so that a small request cannot throw away much for little."""
        return _loss_cap(self.policy, req.shape.gpus_milli)

    def _loss_budget(self, req: PendingRequest) -> int:
        """GPU milli-ms a starving request's victims may lose together, above
        `Policy.max_victim_loss_gpu_s`: `Policy.starving_loss_ratio` × the GPU-time it has
        waited. Only for a request that has not run yet: a retry's wait since its requeue
        is not in the snapshot, and its age would let it preempt in turn (a chain)."""
        if req.attempts:
            return 0
        waited = max(0, self.now - req.created_at_ms)
        return int(self.policy.starving_loss_ratio * req.shape.gpus_milli * waited)

    def _overloaded(self, pools: Sequence[str]) -> bool:
        """Whether each of the pools is overloaded: more requests are starving there than
        may hold reservations, or its queue is deep (`deep`). Starvation there is the
        load, not one request's bad luck, and preempting for it would only move the wait
        to the victims, who lose their work besides."""
        cap = self.policy.max_reservations
        return all(self.starving_in.get(p, 0) > cap or p in self.deep for p in pools)

    def starving(self, req: PendingRequest, cls: WorkloadClass) -> bool:
        """Whether the request has waited `Policy.starvation_after` of its class's maximum
        queue time (the starvation bound)."""
        after = self.policy.starvation_after
        if after <= 0 or cls.max_queue_s <= 0:
            return False
        return self.now - req.created_at_ms >= after * cls.max_queue_s * 1000

    def _apply_plan(
        self,
        req: PendingRequest,
        cls: WorkloadClass,
        pool: str,
        found: preemption.Plan,
        verdict: Verdict,
        position: int,
    ) -> list[Decision]:
        out: list[Decision] = []
        #: GPU milli stopped per reason and team: one plan may reclaim and take its own
        #: lower band (Kueue's "preempt from all ClusterQueues in cohort")
        lost: dict[Code, dict[str, int]] = {}
        for v in found.victims:
            run = v.run
            # The victim keeps its devices (and its quota) until it has stopped: only
            # the next tick, without it in the snapshot, hands them on.
            self.running.remove(run)
            self.preemptible[run.pool][(run.team, run.workload_class)].remove(run)
            by_team = lost.setdefault(v.reason, {})
            by_team[run.team] = by_team.get(run.team, 0) + run.shape.gpus_milli
            msg = f"preempted: request {req.id} of team {req.team} ({cls.name}) needs the room" + (
                " this team borrowed" if v.reason is Code.RECLAIM else ""
            )
            facts = {
                "preemptor": req.id,
                "preemptor_team": req.team,
                "preemptor_class": cls.name,
                "pool": pool,
                "lost_gpu_ms": v.lost,
            }
            out.append(
                Decision(
                    DecisionKind.PREEMPT,
                    run.request_id,
                    v.reason,
                    msg,
                    attempt_id=run.attempt_id,
                    pool=pool,
                    facts=facts,
                )
            )
        self.preemptions += len(found.victims)
        self.changes += 1
        self.candidates.clear()
        self.victims_on.clear()
        self.kept.clear()
        self.candidate_groups.clear()
        # Claim the room now: nothing later in this tick may use the free part of those
        # nodes, and the preemptor's quota counts from now on.
        for name in found.placement.nodes:
            self.claimed[name] = req.id
        self.book.add(req.team, pool, req.shape.gpus_milli, req.workload_class, verdict.borrowing)
        self.queue.charge(req.team, req.shape)
        said = "; ".join(reclaim_sentence(teams, reason) for reason, teams in lost.items())
        msg = "waiting: " + said + "; it starts once they have stopped"
        facts = {
            "victims": [v.run.attempt_id for v in found.victims],
            "pool": pool,
            "nodes": sorted(set(found.placement.nodes)),
        }
        out.append(self._wait(req, position, Code.PREEMPTING, msg, facts))
        return out

    def _reject_never(self, req: PendingRequest, pools: tuple[str, ...]) -> Decision:
        msg = f"rejected: no node in {where(pools)} can hold {describe(req.shape)}"
        facts = {"pools": list(pools), "shape": describe(req.shape)}
        return self._decision(DecisionKind.REJECT, req, Code.NEVER_FITS, msg, facts=facts)

    def _never_fits(self, shape: Shape, pools: tuple[str, ...]) -> bool:
        """Return True when no node of the pools could hold the shape even if it were empty.

        Only necessary conditions are checked (models, device count, partitioning, CPU,
        memory, taints), so a request is never rejected that could fit one day.
        """
        key = (shape, pools)
        never = self.never.get(key)
        if never is None:
            # `fit.can_ever_host`, asked once per hardware kind (`scarce.hosts`)
            nodes = self.snap.nodes
            hosts = sum(len(scarce.hosts(nodes, p, shape)) for p in dict.fromkeys(pools))
            self.short[key] = hosts < shape.pods
            for node in self.snap.growth:
                if node.pool in pools and eligible(node, shape, now=False) is not None:
                    hosts += 1
            never = self.never[key] = hosts < shape.pods
        return never

    def _needs_nodes(self, shape: Shape, pools: tuple[str, ...]) -> bool:
        """Return True when only nodes autoscaled pools may add could hold the shape."""
        return not self._never_fits(shape, pools) and self.short[(shape, pools)]

    # -- helpers ----------------------------------------------------------------------

    def _wait(
        self, req: PendingRequest, position: int, code: Code, msg: str, facts: Mapping[str, object]
    ) -> Decision:
        return self._decision(DecisionKind.WAIT, req, code, msg, position, facts)

    def _decision(
        self,
        kind: DecisionKind,
        req: PendingRequest,
        code: Code,
        msg: str,
        position: int = 0,
        facts: Mapping[str, object] | None = None,
    ) -> Decision:
        return _made(
            kind,
            req.id,
            code,
            msg,
            position if kind is DecisionKind.WAIT else 0,
            self.escalated.get(req.id, False),
            facts or {},
        )
