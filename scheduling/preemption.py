"""Which running attempts to stop so that an entitled request can start.

A request may preempt only when quota already allows it and only capacity is
missing. Candidates, by tier (lower tier is taken first):

1. **reclaim** — attempts of other teams that run on borrowed capacity in the pool,
   taken only while their team still borrows there (as in Kueue, the last victim may
   take the team below its nominal quota by less than its own size); only a request
   that borrows nothing once the victim set has stopped may reclaim (a quota-blocked
   one may get there with its own lower band in the same set: Kueue's "preempt from all
   ClusterQueues in cohort");
2. **floor** — preemptible non-inference attempts in the pool, when an inference
   request needs the pool's inference floor back;
3. **priority** — attempts of a lower class band of the same team, or of any team
   in a pool without quotas;
4. **starvation** — only for a request that quota admits and that has waited
   `Policy.starvation_after` of its class's `max_queue_s`: attempts of any team of a
   lower band, or of the same band that started after the request arrived (they
   overtook it; older work of its band is left alone, so a starving request only takes
   back its place in line and does not swap one long wait for another) — the
   starvation bound in docs/scheduling.md. Such a request, if it has not run yet, may
   also take victims above `Policy.max_victim_loss_gpu_s` as long as the set loses
   together at most `Policy.starving_loss_ratio` × the GPU-time it has waited (its
   loss budget; `within_budget`): work that never checkpoints is not protected for
   ever, and no more work is thrown away than the wait it ends. A starving request
   that only the pool's scarce nodes can host (`scheduling.scarce`) may also take, on
   those nodes, attempts of the same or a lower band whose shape fits elsewhere, even
   `when-borrowing` work its team's quota protects from the other tiers (`scarce-node`),
   and such a victim may lose up to `SCARCE_LOSS_FACTOR` (2) times its loss budget: the
   node was kept for shapes like it and lent to that work only as a last resort, and
   the victim can run on any other node. While more requests
   of a pool are starving than `Policy.max_reservations`, the tier is off there:
   starvation is then the load, not one request's bad luck, and preempting for it
   would only move the wait to the victims (their age still orders the reservations).

Never a candidate: attempts already stopping; classes that are never preempted;
`when-borrowing` classes whose team does not borrow in the pool (except on a scarce node,
above); attempts younger
than their class's minimum runtime; inference attempts whose loss would take the
pool's inference usage below its floor; attempts that would lose more work than
`Policy.max_victim_loss_gpu_s`, or than `Policy.victim_loss_per_gpu_s` per GPU of the
preemptor (a 1-GPU request may not throw away what an 8-GPU one may), or, for a starving
request, its loss budget; and, against preemption cycles, an attempt
that was itself admitted by preempting (`Running.admitted_by_preemption`) unless the
preemptor is of a strictly higher band. Together with rule 1 (only a non-borrowing
request reclaims, only from a borrowing team) no two requests can take the same
capacity back and forth tick after tick.

Victim order inside the candidates (`victim_key`): 1. tier; 2. lower band first;
3. fewest GPU-milliseconds lost since the last checkpoint (or start); 4. most recently
started first; 5. attempt id. The victim set is minimal: on each node the candidates
are added in that order until the request fits there, then every victim not needed is
put back; the node whose set loses the least work wins, then the one with fewer
victims, then the name (least work lost first, because a victim set that loses
nothing since its last checkpoint costs nothing however many it counts). Gangs over several nodes take the same greedy pass over the whole pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduling import fit
from scheduling.explain import Code
from scheduling.packer import ClusterState, eligible
from scheduling.quota import PoolBook
from scheduling.types import (
    WHOLE_GPU_MILLI,
    Node,
    Placement,
    PreemptionPolicy,
    ProfileKind,
    Running,
    Shape,
    WorkloadClass,
)

#: a `scarce-node` victim may lose this many times a starving request's loss budget
SCARCE_LOSS_FACTOR = 2


@dataclass(frozen=True, slots=True)
class Candidate:
    run: Running
    tier: int
    reason: Code
    band: int
    #: GPU milli-ms of work lost if stopped now
    lost: int


@dataclass(frozen=True, slots=True)
class Plan:
    """Victims to stop and where the preemptor will go once they are gone."""

    victims: tuple[Candidate, ...]
    placement: Placement


#: a candidate after its `victim_key`
Keyed = tuple[tuple[int, int, int, int, str], Candidate]


def victim_key(c: Candidate) -> tuple[int, int, int, int, str]:
    """Order candidates, first taken first (see the module docstring, 1–5)."""
    return (c.tier, c.band, c.lost, -c.run.started_at_ms, c.run.attempt_id)


def candidates(
    groups: Mapping[tuple[str, str], Sequence[Running]],
    classes: Mapping[str, WorkloadClass],
    book: PoolBook,
    team: str,
    band: int,
    inference: bool,
    reclaim: bool,
    now_ms: int,
    max_loss_gpu_s: int = 0,
    starving_since_ms: int | None = None,
    budget: int = 0,
    displace: Callable[[Running], bool] | None = None,
    memo: dict[tuple[object, ...], list[Keyed]] | None = None,
) -> list[Candidate]:
    """Return the attempts in `book`'s pool this request may preempt, in victim order.

    `groups`: the pool's running attempts by (team, workload class); what depends only on
    the team and the class is decided once per group (thousands of attempts, a few dozen
    groups, and only a few of them ever hold candidates).
    `budget` (GPU milli-ms, a starving request's wait): a victim may lose up to that much
    even above `max_loss_gpu_s`; `within_budget` then bounds the whole victim set.
    `displace` (a starving request that only scarce nodes can host): the attempts of the
    same or a lower band that hold one of its nodes with work that fits elsewhere; they are
    candidates (tier 4, `scarce-node`) even where `when-borrowing` would protect them.
    `memo` (kept by the caller while `groups` and `book` stay as they are): a group's
    candidates where they depend only on its tier, so other requesters with the same terms
    reuse them, kept sorted with their `victim_key`s: the list is their merge.
    """
    cap = max(max_loss_gpu_s * 1_000_000, budget) if max_loss_gpu_s else 0
    out: list[Keyed] = []
    floor_room = book.floor - book.inference_used
    for (run_team, class_name), runs in groups.items():
        cls = classes.get(class_name)
        if cls is None or cls.preemption is PreemptionPolicy.NEVER or not runs:
            continue
        borrowing = book.borrowed(run_team) > 0
        # Quota protects when-borrowing work from every tier but the scarce node's.
        protected = cls.preemption is PreemptionPolicy.WHEN_BORROWING and not borrowing
        if protected and displace is None:
            continue
        tier = (
            None
            if protected
            else _tier(run_team, cls, book, team, band, inference, reclaim, borrowing, floor_room)
        )
        if tier is None and (starving_since_ms is None or cls.band > band):
            continue
        key: tuple[object, ...] | None = None
        # Not starving, no scarce node: only the tier, the band's side and the loss cap
        # decide (an inference class also reads the floor, which admissions move).
        if (
            memo is not None
            and starving_since_ms is None
            and displace is None
            and not cls.inference
        ):
            key = (book.name, run_team, class_name, tier, cls.band >= band, cap)
            kept = memo.get(key)
            if kept is not None:
                out.extend(kept)
                continue
        start = len(out)
        min_runtime_ms = cls.min_runtime_s * 1000
        for run in runs:
            if run.pool != book.name or run.stopping:
                continue
            if now_ms - run.started_at_ms < min_runtime_ms:
                continue
            # Work admitted by preempting is no victim of its band or a lower one (no
            # cycles), except a scarce node's squatter: its admission gave it those terms.
            squatter_only = run.admitted_by_preemption and cls.band >= band
            if squatter_only and (displace is None or not displace(run)):
                continue
            if cls.inference and book.inference_used - run.shape.gpus_milli < book.floor:
                continue
            found = None if squatter_only else tier
            if (
                found is None
                and not protected
                and not squatter_only
                and starving_since_ms is not None
                and _overtook(run, cls, band, starving_since_ms)
            ):
                found = 4, Code.STARVATION
            if found is None and displace is not None and displace(run):
                found = 4, Code.SCARCE_NODE
            if found is None:
                continue
            since = (
                run.last_checkpoint_ms if run.last_checkpoint_ms is not None else run.started_at_ms
            )
            lost = run.shape.gpus_milli * max(0, now_ms - since)
            # A scarce node's squatter took it knowing this (its admission says so): it may
            # lose up to SCARCE_LOSS_FACTOR times the waiter's budget.
            limit = max(cap, SCARCE_LOSS_FACTOR * budget) if found[1] is Code.SCARCE_NODE else cap
            if limit and lost > limit:
                # Another tier's limit must not shield a squatter from its own.
                if found[1] is Code.SCARCE_NODE or displace is None or not displace(run):
                    continue
                if lost > max(cap, SCARCE_LOSS_FACTOR * budget):
                    continue
                found = 4, Code.SCARCE_NODE
            c = Candidate(run, found[0], found[1], cls.band, lost)
            out.append((victim_key(c), c))
        if key is not None and memo is not None:
            piece = memo[key] = out[start:]
            piece.sort()
    # Keys are unique (the attempt id is the last): a candidate is never compared. The
    # groups' pieces come sorted, and sorting runs is merging them.
    out.sort()
    return [c for _, c in out]


def within_budget(victims: Sequence[Candidate], max_loss_gpu_s: int, budget: int) -> bool:
    """Whether a victim set may be stopped: each victim loses at most `max_loss_gpu_s`
    (0 = no limit), or together they lose at most `budget` (GPU milli-ms). A `scarce-node`
    victim's loss counts 1 / `SCARCE_LOSS_FACTOR`: it took the node on those terms."""
    if not max_loss_gpu_s or all(v.lost <= max_loss_gpu_s * 1_000_000 for v in victims):
        return True
    return sum(_weighed(v) for v in victims) <= budget


def _weighed(v: Candidate) -> int:
    """A victim's loss as it counts against a starving request's budget."""
    return v.lost // SCARCE_LOSS_FACTOR if v.reason is Code.SCARCE_NODE else v.lost


def _overtook(run: Running, cls: WorkloadClass, band: int, since_ms: int) -> bool:
    """Tier 4: a lower band, or the same band started after the starving request arrived."""
    return cls.band < band or (cls.band == band and run.started_at_ms > since_ms)


def _tier(
    run_team: str,
    cls: WorkloadClass,
    book: PoolBook,
    team: str,
    band: int,
    inference: bool,
    reclaim: bool,
    borrowing: bool,
    floor_room: int,
) -> tuple[int, Code] | None:
    if reclaim and run_team != team and borrowing:
        return 1, Code.RECLAIM
    if inference and floor_room > 0 and not cls.inference:
        return 2, Code.FLOOR_RECLAIM
    if cls.band < band and (run_team == team or not book.managed):
        return 3, Code.PRIORITY
    return None


def plan(
    state: ClusterState,
    shape: Shape,
    accept: Callable[[Node], bool],
    cands: list[Candidate],
    book: PoolBook,
    cap: int,
    nodes: Mapping[str, Node],
    quota_ok: Callable[[Sequence[Running]], bool],
    anywhere: bool = False,
    allowed: Callable[[Sequence[Candidate]], bool] = lambda _: True,
    on_nodes: Sequence[OnNode] | None = None,
    keep: Callable[[Candidate], bool] | None = None,
) -> Plan | None:
    """Return the smallest victim set (at most `cap`) that lets `shape` fit, or None.

    A set counts only when `quota_ok` accepts it: quota must admit the request once the
    victims have stopped (otherwise the victims would lose their work for nothing). A node
    where even stopping every candidate would not free enough room is skipped without
    asking the packer. With `anywhere` (quota, not devices, is what is missing), victims
    may come from any node of the pool when no single node works. Leaves `state` as it
    found it. `on_nodes`: `by_node(cands)`, where the caller asks about the same
    candidates again; with `keep`, `by_node` of a longer list that `cands` is of the ones
    `keep` accepts (a request's own loss cap narrows the tick's list).
    """
    if not cands or cap <= 0:
        return None
    if shape.pods > 1:
        found = _greedy(state, shape, accept, cands, book, cap, quota_ok)
        return found if found is not None and allowed(found.victims) else None
    best: tuple[tuple[int, int, str], Plan] | None = None
    for node, node_cands, freed in by_node(cands) if on_nodes is None else on_nodes:
        if node not in nodes:
            continue
        if keep is not None:
            # What the longer list frees falls short already: so does what part of it frees.
            if _short(state, node, shape, freed):
                continue
            node_cands = [c for c in node_cands if keep(c)]
            if not node_cands:
                continue
            freed = _freed(node, node_cands)
        if _hopeless(state, nodes[node], shape, node_cands, freed):
            continue

        def on_node(n: Node, name: str = node) -> bool:
            return n.name == name and accept(n)

        found = _greedy(state, shape, on_node, node_cands, book, cap, quota_ok)
        if found is None or not allowed(found.victims):
            continue
        score = (sum(v.lost for v in found.victims), len(found.victims), node)
        if best is None or score < best[0]:
            best = (score, found)
            if score[0] == 0:
                break
    if best is None and anywhere:
        found = _greedy(state, shape, accept, cands, book, cap, quota_ok)
        return found if found is not None and allowed(found.victims) else None
    return None if best is None else best[1]


#: (node, the candidates with a pod there, the GPU milli their pods there hold)
OnNode = tuple[str, list[Candidate], int]


def by_node(
    cands: Sequence[Candidate], spans: dict[str, tuple[tuple[str, int], ...]] | None = None
) -> list[OnNode]:
    """The candidates per node they hold, nodes by name (a candidate with two pods on a
    node is listed, and counted, twice). `spans` (kept by the caller for a tick): per
    attempt, each pod's node and the GPU milli its pods there hold, so that a deep
    queue's many lists of the same attempts sum their grants once."""
    on: dict[str, list[Candidate]] = {}
    freed: dict[str, int] = {}
    if spans is None:
        spans = {}
    for c in cands:
        run = c.run
        span = spans.get(run.attempt_id)
        if span is None:
            pods = run.placement.pods
            span = spans[run.attempt_id] = tuple(
                (
                    pod.node,
                    sum([max(g.milli, 1) for p in pods if p.node == pod.node for g in p.grants]),
                )
                for pod in pods
            )
        for name, milli in span:
            here = on.get(name)
            if here is None:
                here = on[name] = []
                freed[name] = 0
            here.append(c)
            freed[name] += milli
    return [(name, on[name], freed[name]) for name in sorted(on)]


def _freed(name: str, cands: Sequence[Candidate]) -> int:
    """`by_node`'s count for one node: the GPU milli the candidates' pods there hold."""
    return sum(
        [
            max(g.milli, 1)
            for c in cands
            for p in c.run.placement.pods
            if p.node == name
            for g in p.grants
        ]
    )


def _short(state: ClusterState, name: str, shape: Shape, freed: int) -> bool:
    """Whether what is idle on the node and `freed` add up to fewer GPUs than the shape
    asks (never for a MIG shape: its slices are counted by the exact map)."""
    if shape.kind is ProfileKind.MIG:
        return False
    per = WHOLE_GPU_MILLI if shape.kind is ProfileKind.WHOLE else shape.milli
    return state.idle_milli(name) + freed < shape.count * per


def _hopeless(
    state: ClusterState, node: Node, shape: Shape, cands: list[Candidate], freed: int
) -> bool:
    """Return True if the shape cannot fit on the node even with every candidate stopped
    (`freed`: the GPU milli their pods there hold)."""
    name = node.name
    # A bound first, cheap: it settles two of three nodes a plan looks at.
    if _short(state, name, shape, freed):
        return True
    flags = eligible(node, shape)
    if flags is None:
        return True
    cpu_free, mem_free, idle = state.free_capacity(name)
    held = {d.index: WHOLE_GPU_MILLI - idle[pos] for pos, d in enumerate(node.devices)}
    cpu_held = node.cpu_milli - cpu_free
    mem_held = node.memory_mib - mem_free
    for pod in (pod for c in cands for pod in c.run.placement.pods if pod.node == name):
        cpu_held -= pod.cpu_milli
        mem_held -= pod.memory_mib
        for g in pod.grants:
            held[g.device] = held.get(g.device, 0) - max(g.milli, 1)
    return not fit.fits_free(node, shape, flags, held, cpu_held, mem_held)


def _greedy(
    state: ClusterState,
    shape: Shape,
    accept: Callable[[Node], bool],
    cands: list[Candidate],
    book: PoolBook,
    cap: int,
    quota_ok: Callable[[Sequence[Running]], bool],
) -> Plan | None:
    """Add candidates in order until `shape` fits and quota admits it, then drop the ones
    not needed."""
    chosen: list[Candidate] = []
    freed: dict[str, int] = {}
    placement = None
    for c in cands:
        if len(chosen) >= cap:
            break
        if c.tier == 1:
            # Kueue: a borrower's workloads are candidates only while it still borrows.
            left = book.borrowed(c.run.team) - freed.get(c.run.team, 0)
            if left <= 0:
                continue
        state.give(c.run.placement)
        chosen.append(c)
        freed[c.run.team] = freed.get(c.run.team, 0) + c.run.shape.gpus_milli
        # quota first: it is cheap, and when quota is what is missing it decides
        if quota_ok([v.run for v in chosen]):
            placement = state.find(shape, accept)
            if placement is not None:
                break
    if placement is None:
        for c in reversed(chosen):
            state.take(c.run.placement)
        return None
    # Put back, newest choice first, every victim the request fits without.
    for c in list(reversed(chosen)):
        state.take(c.run.placement)
        ok = quota_ok([v.run for v in chosen if v is not c])
        again = state.find(shape, accept) if ok else None
        if again is None:
            state.give(c.run.placement)
        else:
            chosen.remove(c)
            placement = again
    for c in chosen:
        state.take(c.run.placement)
    return Plan(tuple(chosen), placement)
