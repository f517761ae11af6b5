"""Reservations and backfilling of a tick (step 3e of `scheduling.cycle`): who may hold
nodes, which nodes they hold, when those nodes are expected to drain, and what may use
them meanwhile.

- **Holders** (`Reservations.__init__`): the first `Policy.max_reservations` requests that
  are large (`Policy.reserve_min_devices`), escalated or have waited
  `Policy.reserve_after_s`, the oldest first, and that no per-team limit holds back; a
  firm one (`firm`: a shape only scarce nodes host, or a request past its starvation
  bound) comes before the others, is made before the pass (`reserve_firm`) and holds
  even while it borrows.
- **Nodes** (`reserve`): those expected to drain soonest for the shape, from
  `Running.expected_end_ms` of what holds them (`_fit_at_free`, remembered across ticks inside
  `remembering()`), else those untouched longest; no later request of the tick may use
  them (the cycle's `_accept`), except a request within its nominal quota on the nodes of
  a borrowing holder.
- **Backfill** (`backfill`): work expected to end (`PendingRequest.expected_runtime_ms`)
  before the holder's expected start may use its nodes (EASY backfilling).

The cycle's `_Tick` owns one `Reservations` and passes itself to the methods that read
the rest of the tick (its clock, snapshot, packer state, quota book, queue and claims).
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
from collections.abc import Iterator, Sequence
from typing import Protocol

from scheduling import fit
from scheduling.explain import Code
from scheduling.packer import ClusterState, eligible, node_class
from scheduling.queue import FairQueue
from scheduling.quota import QuotaBook
from scheduling.types import (
    Node,
    PendingRequest,
    Placement,
    PodPlacement,
    Policy,
    Running,
    Shape,
    Snapshot,
    WorkloadClass,
)


class _Tick(Protocol):
    """What reservations read of the tick that owns them (`scheduling.cycle._Tick`); a protocol,
    so that this module does not import the cycle that imports it."""

    snap: Snapshot
    now: int
    policy: Policy
    classes: dict[str, WorkloadClass]
    production: tuple[str, ...]
    state: ClusterState
    book: QuotaBook
    queue: FairQueue
    claimed: dict[str, str]
    node_by_name: dict[str, Node]
    scarce: frozenset[str]
    #: per class, the waits (ms) of its starvation bound (None: never) and of keeping off
    #: scarce nodes
    ages: dict[str, tuple[float | None, float | None]]

    def fits_elsewhere(self, shape: Shape, pools: tuple[str, ...]) -> bool: ...

    def only_scarce(self, shape: Shape, pools: tuple[str, ...]) -> bool: ...

    def starving(self, req: PendingRequest, cls: WorkloadClass) -> bool: ...


#: what one pod of a running attempt (or an admission of this tick) holds on a node:
#: expected end (None = unknown), (device, milli) grants, CPU milli, memory MiB
_Hold = tuple[int | None, tuple[tuple[int, int], ...], int, int]
_NEVER = 1 << 62
#: `_fit_at_free`'s end on a node where the shape fits beside everything that holds it
_FITS_NOW = -(1 << 62)
_DRAINS_MAX = 200_000


class _Drains:
    """`_fit_at_free`'s answers per shape and (node class, number of what holds the node).

    What holds a node is numbered by value, so that the memo's key is two integers: a
    tuple of holds hashed and compared in C once per node, not a key object hashed and
    compared by Python methods at each of the tens of thousands of lookups a deep queue's
    holders make. Numbers live as long as the answers: both are dropped together."""

    __slots__ = ("numbers", "found", "size", "generation")

    def __init__(self) -> None:
        self.numbers: dict[tuple[_Hold, ...], int] = {}
        self.found: dict[Shape, dict[tuple[int, int], tuple[int | None, int]]] = {}
        self.size = 0
        #: bumped when everything is dropped: numbers a tick kept are then void
        self.generation = 0

    def __len__(self) -> int:
        """How many answers are kept."""
        return self.size

    def make_room(self) -> None:
        if self.size >= _DRAINS_MAX or len(self.numbers) >= _DRAINS_MAX:
            self.numbers.clear()
            self.found.clear()
            self.size = 0
            self.generation += 1


class _NodeHolds:
    """What the running attempts of the last tick hold on each node and when something
    last started there, kept across ticks (`remembering()`): a replay's tick starts and
    stops a few of its thousand attempts, so only the nodes of those are summed again.

    Attempts are told apart by identity (the snapshot's objects: a changed attempt is a new
    one); `runs` keeps them alive, so an identity is never another attempt's while kept.
    A node's holds come in no particular order: `_fit_at_free` answers the same in any."""

    __slots__ = ("runs", "on", "holds", "last", "stopping")

    def __init__(self) -> None:
        #: id -> attempt: the running attempts of the last tick
        self.runs: dict[int, Running] = {}
        #: per node, its attempts by id
        self.on: dict[str, dict[int, Running]] = {}
        #: per node, what its attempts hold (`holders` without the tick's admissions)
        self.holds: dict[str, tuple[_Hold, ...]] = {}
        #: per node, the latest start of its attempts (`last_start` without the tick's)
        self.last: dict[str, int] = {}
        #: nodes with a stopping attempt: its holds end at the tick's own clock, so they
        #: are summed again at every tick
        self.stopping: set[str] = set()

    def update(self, running: Sequence[Running], now: int) -> None:
        """Bring the holds up to this tick's running attempts."""
        runs = {id(run): run for run in running}
        before = self.runs
        on = self.on
        dirty = self.stopping
        for key in before.keys() - runs.keys():
            for pod in before[key].placement.pods:
                on[pod.node].pop(key, None)
                dirty.add(pod.node)
        for key in runs.keys() - before.keys():
            run = runs[key]
            for pod in run.placement.pods:
                mine = on.get(pod.node)
                if mine is None:
                    on[pod.node] = {key: run}
                else:
                    mine[key] = run
                dirty.add(pod.node)
        self.runs = runs
        self.stopping = set()
        holds_of, last_of = self.holds, self.last
        for name in dirty:
            there = on.get(name)
            if not there:
                on.pop(name, None)
                holds_of.pop(name, None)
                last_of.pop(name, None)
                continue
            holds: list[_Hold] = []
            last = 0
            for run in there.values():
                if run.stopping:
                    end: int | None = now
                    self.stopping.add(name)
                else:
                    end = run.expected_end_ms
                if run.started_at_ms > last:
                    last = run.started_at_ms
                for pod in run.placement.pods:
                    if pod.node == name:
                        holds.append(_pod_hold(pod, end))
            holds_of[name] = tuple(holds)
            if last:
                last_of[name] = last
            else:
                last_of.pop(name, None)


#: inside `remembering()`: the drains of every tick
_DRAINS: _Drains | None = None
#: inside `remembering()`: what the last tick's running attempts hold on each node
_NODE_HOLDS: _NodeHolds | None = None


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Keep when a node drains for a shape (`_fit_at_free`), and what the running attempts
    hold on each node, across the `schedule()` calls made inside
    (`scheduling.cycle.remembering`). The decisions are the same."""
    global _DRAINS, _NODE_HOLDS
    outer = _DRAINS, _NODE_HOLDS
    _DRAINS = _Drains() if outer[0] is None else outer[0]
    _NODE_HOLDS = _NodeHolds() if outer[1] is None else outer[1]
    try:
        yield
    finally:
        _DRAINS, _NODE_HOLDS = outer


def _pod_holds(placement: Placement, end: int | None) -> tuple[tuple[str, _Hold], ...]:
    """(node, hold) for each pod of a placement expected to end at `end`."""
    return tuple([(pod.node, _pod_hold(pod, end)) for pod in placement.pods])


def _pod_hold(pod: PodPlacement, end: int | None) -> _Hold:
    """What one pod holds on its node until `end`."""
    return (
        end,
        tuple([(g.device, g.milli if g.milli > 1 else 1) for g in pod.grants]),
        pod.cpu_milli,
        pod.memory_mib,
    )


def _fit_at_free(
    node: Node, shape: Shape, flags: tuple[bool, ...], holds: Sequence[_Hold]
) -> tuple[int | None, int]:
    """The expected end after which one pod of the shape fits on the node, what holds it
    ending in order of expected end (`_FITS_NOW`: it fits now; None: never, or a holder
    has no estimate), and how many devices that may serve the shape have nothing on them.
    `Reservations._scores` makes the end never before now: ends already past come first either
    way, and once they are all gone the order of the rest is the same."""
    ends: list[tuple[int, int]] = []
    used: dict[int, int] = {}
    cpu = mem = 0
    known = True
    for k, (end, grants, c, m) in enumerate(holds):
        if end is None:
            known = False
        else:
            ends.append((end, k))
        for dev, milli in grants:
            used[dev] = used.get(dev, 0) + milli
        cpu += c
        mem += m
    if used:
        get = used.get
        free = sum(1 for d, ok in zip(node.devices, flags, strict=False) if ok and not get(d.index))
    else:
        # (`eligible` gives a flag per device, or none at all)
        free = flags.count(True)
    if not known:
        return None, free
    if fit.fits_free(node, shape, flags, used, cpu, mem):
        return _FITS_NOW, free
    for end, k in sorted(ends):
        _, grants, c, m = holds[k]
        for dev, milli in grants:
            used[dev] -= milli
        cpu -= c
        mem -= m
        if fit.fits_free(node, shape, flags, used, cpu, mem):
            return end, free
    return None, free


class Reservations:
    """The reservations of one tick: who may hold nodes (`may_reserve`), the nodes held and
    for whom, when each holder is expected to start there, and the admissions of the tick
    so far (what holds a node is the snapshot's running attempts and those)."""

    __slots__ = (
        "now",
        "reserved",
        "reserved_borrowing",
        "reserve_start",
        "admitted",
        "admitted_end",
        "_holders",
        "_last",
        "may_reserve",
        "_scored",
        "_later",
        "_hold_no",
        "_drains",
        "_synced",
    )

    def __init__(self, tick: _Tick) -> None:
        self.now = tick.now
        #: reserved node -> the request it is held for
        self.reserved: dict[str, str] = {}
        #: reserved nodes whose holder would borrow: a request within its nominal quota may
        #: still use them (guaranteed quota comes before a borrower, as in Kueue)
        self.reserved_borrowing: set[str] = set()
        #: reserved node -> when its holder is expected to start there (None = unknown)
        self.reserve_start: dict[str, int | None] = {}
        self.admitted: list[Placement] = []
        #: expected end of each admission of this tick (None = no estimate)
        self.admitted_end: list[int | None] = []
        #: per node, what holds it and until when; built only when a reservation needs it
        self._holders: dict[str, list[_Hold]] | None = None
        #: when something last started on each node; built when a reservation needs it
        self._last: dict[str, int] | None = None
        #: (shape, pools) -> (admissions scored, per node its key for `reserve`)
        self._scored: dict[
            tuple[Shape, tuple[str, ...]],
            tuple[int, dict[str, tuple[bool, int, int, int, str] | None]],
        ] = {}
        #: (size of `reserve_start` when sorted, its known starts sorted: `starting_after`)
        self._later: tuple[int, list[tuple[int, str]]] = (0, [])
        #: per node, the number of what holds it (`holders`, numbered by `_Drains`) and
        #: those holds; dropped when an admission lands there
        self._hold_no: dict[str, tuple[int, tuple[_Hold, ...]]] = {}
        #: `_fit_at_free`'s memo for this tick (outside `remembering()`), and the
        #: generation of its numbers that `_hold_no` holds
        self._drains = (_Drains() if _DRAINS is None else _DRAINS, -1)
        #: whether `_NODE_HOLDS` is up to this tick's running attempts
        self._synced = False
        self.may_reserve = self._reservation_holders(tick)

    def admit(self, placement: Placement, end: int | None) -> None:
        """Count an admission of the tick (expected to end at `end`) as holding its nodes."""
        self.admitted.append(placement)
        names = placement.nodes
        for name in names:
            self._hold_no.pop(name, None)
        if self._last is not None:
            for name in names:
                self._last[name] = self.now
        self.admitted_end.append(end)
        if self._holders is not None:
            self._add_holds(self._holders, placement, end)

    def reserve_firm(self, t: _Tick) -> None:
        """A reservation holder that only scarce nodes can host holds them from the start
        of the pass: requests ahead of it in the queue can go elsewhere."""
        # (the few holders, oldest first: not a sort of every pending request)
        mine = [r for r in t.snap.pending if r.id in self.may_reserve]
        for holder in sorted(mine, key=lambda r: (r.created_at_ms, r.id)):
            pools = (holder.pool,) if holder.pool else t.production
            if self.firm(t, holder, pools):
                self.reserve(t, holder, pools, borrowing=False)

    def firm(self, t: _Tick, req: PendingRequest, pools: tuple[str, ...]) -> bool:
        """Whether the request's reservation is firm: it comes first among the holders,
        is made before the pass and holds even while it borrows. So it is for a request
        that only scarce nodes can host, and for one past its starvation bound."""
        if t.only_scarce(req.shape, pools):
            return True
        cls = t.classes.get(req.workload_class)
        return cls is not None and t.starving(req, cls)

    def backfill(self, t: _Tick, req: PendingRequest, pools: tuple[str, ...]) -> Placement | None:
        """Place on reserved nodes whose holder is expected to start only after this request
        is expected to end (EASY backfilling); never without both estimates."""
        if req.expected_runtime_ms is None or not self.reserve_start:
            return None
        claimed = t.claimed
        late = self.starting_after(t.now + req.expected_runtime_ms)
        ok = {name for _, name in late if name not in claimed}
        if not ok:
            return None
        return t.state.find(req.shape, lambda n: n.pool in pools and n.name in ok)

    def starting_after(self, end: int) -> list[tuple[int, str]]:
        """The reserved nodes whose holder is expected to start at `end` or later, as
        (start, node): those `backfill` may use for work expected to end by then. Kept
        sorted; nodes are only added to `reserve_start` during a tick, so its size says
        when to sort again."""
        later = self._starts()
        return later[bisect.bisect_left(later, (end, "")) :]

    def count_starting_after(self, end: int) -> int:
        """`len(starting_after(end))`, without the list: asked once per pending request."""
        later = self._starts()
        return len(later) - bisect.bisect_left(later, (end, ""))

    def _starts(self) -> list[tuple[int, str]]:
        seen, later = self._later
        if seen != len(self.reserve_start):
            later = sorted((s, n) for n, s in self.reserve_start.items() if s is not None)
            self._later = (len(self.reserve_start), later)
        return later

    def _reservation_holders(self, t: _Tick) -> set[str]:
        """Return who may hold a reservation this tick: the oldest qualifying requests.

        A request qualifies when it is large (`Policy.reserve_min_devices` devices in
        all), escalated, or has waited `Policy.reserve_after_s`, and no per-team limit
        (borrowing limit, inference floor) holds it back. Choosing by age rather than by
        queue position keeps the same request, and so the same draining nodes, from one
        tick to the next even while fair shares shift. A request that only scarce nodes
        can host (`scheduling.scarce`) comes before the others: it holds only those.
        """
        policy = t.policy
        qualifying: list[tuple[int, int, str, int]] = []
        pending = t.snap.pending
        escalated = t.queue.escalated
        min_devices = policy.reserve_min_devices
        now, ages = t.now, t.ages
        #: created at or before this, a request has waited `Policy.reserve_after_s`
        waited_since = now - policy.reserve_after_s * 1000
        #: `only_scarce` per (pool, shape number): tens of thousands qualify, in few shapes
        only: dict[tuple[str, int], bool] = {}
        append = qualifying.append
        for i, req in enumerate(pending):
            # (`ages` has every class: None is a class that does not exist)
            age = ages.get(req.workload_class)
            if age is None or req.not_before_ms > now:
                continue
            created = req.created_at_ms
            if created > waited_since and not escalated.get(req.id, False):
                shape = req.shape
                if shape.count * shape.pods < min_devices:
                    continue
            # A shape only scarce nodes can host goes first: it holds only those nodes,
            # and nothing else is kept off them while it waits (`firm`, inline).
            bound = age[0]  # `t.starving`, inline
            if bound is not None and now - created >= bound:
                append((0, created, req.id, i))
                continue
            key = (req.pool, req.shape.number)
            rare = only.get(key)
            if rare is None:
                pools = (req.pool,) if req.pool else t.production
                rare = only[key] = t.only_scarce(req.shape, pools)
            append((0 if rare else 1, created, req.id, i))
        # Quota is asked in that order, only until the holders are found: thousands
        # qualify at a deep queue, and a few may hold (a heap: no need to sort them all).
        heapq.heapify(qualifying)
        holders: set[str] = set()
        while qualifying:
            if len(holders) >= policy.max_reservations:
                break
            *_, rid, i = heapq.heappop(qualifying)
            req = pending[i]
            pools = (req.pool,) if req.pool else t.production
            codes = {
                t.book.check(req.team, p, req.shape.gpus_milli, req.workload_class).code
                for p in pools
                if p in t.book.pools
            }
            if not (codes and codes <= {Code.BORROWING_LIMIT, Code.INFERENCE_FLOOR}):
                holders.add(rid)
        return holders

    def reserve(
        self, t: _Tick, req: PendingRequest, pools: tuple[str, ...], borrowing: bool
    ) -> bool:
        """Step 3e: hold nodes for this request, if it is a reservation holder.

        Which nodes, in order: 0. for a shape that fits elsewhere, nodes that are not
        scarce (`scheduling.scarce`); 1. the node expected to drain soonest — the earliest time
        at which one pod of the request fits there, from the `Running.expected_end_ms` of
        what holds it (and the expected runtime of this tick's admissions); a node where
        some holder has no estimate comes after every node with one; 2. the node where
        nothing has started for the longest time — a node held back in the last tick has
        had no start since, so the choice sticks from tick to tick without any state and
        the node really drains (jobs that have run long are, under a runtime cap, also
        the nearest to ending); 3. the most devices free; 4. the name. Without estimates
        only 2–4 apply. The request's expected start (the latest drain of its nodes) is
        kept so that `backfill` admits there only work expected to end before it.
        """
        if req.id not in self.may_reserve or req.id in self.reserved.values():
            return False
        shape = req.shape
        reserved, claimed = self.reserved, t.claimed
        scored = [
            s
            for name, s in self._scores(t, shape, pools).items()
            if s is not None and name not in reserved and name not in claimed
        ]
        if len(scored) < shape.pods:
            return False
        # (`sorted(scored)[: shape.pods]`: names make every key distinct)
        chosen = heapq.nsmallest(shape.pods, scored)
        latest = max(c[1] for c in chosen)
        start = None if latest >= _NEVER else latest
        # A holder that only scarce nodes can host keeps them even while it borrows:
        # requests within quota can go elsewhere.
        firm = self.firm(t, req, pools)
        for *_, name in chosen:
            self.reserved[name] = req.id
            self.reserve_start[name] = start
            if borrowing and not firm:
                self.reserved_borrowing.add(name)
        return True

    def _scores(
        self, t: _Tick, shape: Shape, pools: tuple[str, ...]
    ) -> dict[str, tuple[bool, int, int, int, str] | None]:
        """Per node of the pools, its sort key for `reserve` (None: it cannot host the
        shape). Holders of one shape ask for the same keys: they are kept for the tick and
        only the nodes of admissions made since are scored again (nothing else changes
        what holds a node during a tick; reserved and claimed nodes are left out by the
        caller)."""
        key = (shape, pools)
        entry = self._scored.get(key)
        admitted = self.admitted
        if entry is not None and entry[0] == len(admitted):
            return entry[1]
        # a shape that fits elsewhere leaves scarce nodes to the shapes only they can host
        spare = t.scarce if t.fits_elsewhere(shape, pools) else frozenset()
        last = self.last_start(t)
        holders = self.holders(t)
        drains, generation = self._drains
        drains.make_room()
        hold_no = self._hold_no
        if generation != drains.generation:
            hold_no.clear()
            self._drains = (drains, drains.generation)
        numbers = drains.numbers
        found = drains.found.get(shape)
        if found is None:
            found = drains.found[shape] = {}
        now = self.now
        #: per node class, its devices eligible for the shape (None: it cannot host it)
        flags_of: dict[int, tuple[bool, ...] | None] = {}

        def score(node: Node) -> tuple[bool, int, int, int, str] | None:
            # The one fit rule: readiness, taints, CPU, memory, devices.
            cls = node_class(node)
            if cls in flags_of:
                flags = flags_of[cls]
            else:
                flags = flags_of[cls] = eligible(node, shape)
            if flags is None:
                return None
            name = node.name
            held = hold_no.get(name)
            if held is None:
                holds = tuple(holders.get(name, ()))
                number = numbers.get(holds)
                if number is None:
                    number = numbers[holds] = len(numbers)
                held = hold_no[name] = (number, holds)
            # Nodes of one class held alike drain alike: a few thousand answers for the
            # tens of thousands of nodes a deep queue's holders score (kept for the tick,
            # or across ticks inside `remembering()`).
            at_key = (cls, held[0])
            answer = found.get(at_key)
            if answer is None:
                answer = found[at_key] = _fit_at_free(node, shape, flags, held[1])
                drains.size += 1
            at, free = answer
            return (
                name in spare,
                _NEVER if at is None else max(at, now),
                last.get(name, 0),
                -free,
                name,
            )

        if entry is None:
            scores = {n.name: score(n) for n in t.snap.nodes if n.pool in pools}
        else:
            scores = entry[1]
            nodes = t.node_by_name
            for placement in admitted[entry[0] :]:
                for name in placement.nodes:
                    if name in scores:
                        scores[name] = score(nodes[name])
        self._scored[key] = (len(admitted), scores)
        return scores

    # -- what holds each node -------------------------------------------------------

    def last_start(self, t: _Tick) -> dict[str, int]:
        """Return when something last started on each node (this tick's admissions: now)."""
        if self._last is not None:
            return self._last
        kept = self._kept(t)
        if kept is not None:
            last = dict(kept.last)
        else:
            last = {}
            # (these loops visit every running attempt: no calls inside but the dict's)
            for run in t.snap.running:
                started = run.started_at_ms
                for pod in run.placement.pods:
                    if started > last.get(pod.node, 0):
                        last[pod.node] = started
        self._last = last
        for placement in self.admitted:
            for name in placement.nodes:
                last[name] = self.now
        return last

    def holders(self, t: _Tick) -> dict[str, list[_Hold]]:
        """Return, per node, what holds it and when it is expected to end."""
        if self._holders is None:
            kept = self._kept(t)
            holders: dict[str, list[_Hold]]
            if kept is not None:
                holders = {name: list(holds) for name, holds in kept.holds.items()}
            else:
                holders = {}
                for run in t.snap.running:
                    end = self.now if run.stopping else run.expected_end_ms
                    for name, hold in _pod_holds(run.placement, end):
                        on = holders.get(name)
                        if on is None:
                            holders[name] = [hold]
                        else:
                            on.append(hold)
            self._holders = holders
            for placement, end in zip(self.admitted, self.admitted_end, strict=True):
                self._add_holds(holders, placement, end)
        return self._holders

    def _kept(self, t: _Tick) -> _NodeHolds | None:
        """`_NODE_HOLDS` brought up to this tick's running attempts (once a tick), or None
        outside `remembering()`."""
        kept = _NODE_HOLDS
        if kept is not None and not self._synced:
            kept.update(t.snap.running, self.now)
            self._synced = True
        return kept

    @staticmethod
    def _add_holds(holders: dict[str, list[_Hold]], placement: Placement, end: int | None) -> None:
        for name, hold in _pod_holds(placement, end):
            holders.setdefault(name, []).append(hold)
