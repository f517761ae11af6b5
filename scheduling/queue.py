"""Queue order: class band, escalation, priority, weighted dominant fair share, age, id.

The order is recomputed as the tick goes: when a team is admitted something its
share grows and its next request may fall behind other teams' requests. That is
Kueue's fair-sharing iterator, with Slurm's decayed usage added in.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.types import Node, PendingRequest, Running, Shape, Team, TeamUsage, WorkloadClass
from scheduling.usage_decay import LN2, decay_usage

#: shares are integers in parts per million of the cluster
PPM = 1_000_000

#: a request in its team's list: the rank of its `request_key` 0–3 among the tick's,
#: `request_key` 4 and 5, the request
_Item = tuple[int, int, str, PendingRequest]
#: a team in the heap: that rank for its next request, its share, 4–5, the team
_Entry = tuple[int, int, int, str, str]

#: a class the snapshot does not define sorts last (the request is rejected anyway)
UNKNOWN_BAND = -(10**9)


@dataclass(frozen=True, slots=True)
class Resources:
    """A bundle of the three quantities fair share counts."""

    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    def plus(self, shape: Shape) -> Resources:
        return Resources(
            self.gpu_milli + shape.gpus_milli,
            self.cpu_milli + shape.cpu_milli * shape.pods,
            self.memory_mib + shape.memory_mib * shape.pods,
        )


#: the last tuple of nodes `cluster_capacity` summed, and the sum: a caller passing the same
#: tuple tick after tick (the replay) does not sum it again
_LAST_CAPACITY: tuple[tuple[Node, ...], Resources] | None = None


def cluster_capacity(nodes: Iterable[Node]) -> Resources:
    """Return what the ready, uncordoned nodes hold in total (healthy devices only)."""
    global _LAST_CAPACITY
    last = _LAST_CAPACITY
    if last is not None and last[0] is nodes:
        return last[1]
    gpu = cpu = mem = 0
    for node in nodes:
        if node.ready and not node.cordoned:
            gpu += 1000 * sum(1 for d in node.devices if d.healthy)
            cpu += node.cpu_milli
            mem += node.memory_mib
    out = Resources(gpu, cpu, mem)
    if isinstance(nodes, tuple):  # nodes are frozen: the same tuple sums the same
        _LAST_CAPACITY = (nodes, out)
    return out


def dominant_share_ppm(held: Resources, capacity: Resources) -> int:
    """Return the largest fraction (ppm) of any one resource that `held` takes of `capacity`."""
    pairs = (
        (held.gpu_milli, capacity.gpu_milli),
        (held.cpu_milli, capacity.cpu_milli),
        (held.memory_mib, capacity.memory_mib),
    )
    return max((h * PPM // c for h, c in pairs if c > 0), default=0)


def history_share_ppm(decayed_milli_s: int, capacity_milli: int, half_life_s: int) -> int:
    """Return decayed past usage as a share (ppm) of what the cluster could give in one half-life.

    Holding the whole cluster forever accrues `capacity · half_life / ln 2` decayed
    milli-seconds, so a team that always had everything scores 1,000,000 here.
    """
    if capacity_milli <= 0 or half_life_s <= 0:
        return 0
    return int(decayed_milli_s * LN2 * PPM / (capacity_milli * half_life_s))


def escalated(req: PendingRequest, cls: WorkloadClass | None, now_ms: int, after: float) -> bool:
    """Return whether the request has waited `after` (a fraction) of its class's maximum queue time."""
    if cls is None or cls.max_queue_s <= 0:
        return False
    return now_ms - req.created_at_ms >= after * cls.max_queue_s * 1000


def request_key(
    req: PendingRequest, band: int, is_escalated: bool
) -> tuple[int, int, int, int, int, str]:
    """Sort key inside one team, smallest first:

    0. a preemptor of an earlier tick (`PendingRequest.preempting`) first: the room its
       victims freed is kept for it;
    1. higher class band first;
    2. escalated requests (near their class's maximum queue time) first;
    3. higher priority first — it never lifts a request past another band, since
       the band is compared first;
    4. older request first;
    5. request id, for deterministic ties.
    """
    return (
        -int(req.preempting),
        -band,
        -int(is_escalated),
        -req.priority,
        req.created_at_ms,
        req.id,
    )


class FairQueue:
    """Pending requests in scheduling order; `charge` after an admission re-ranks its team.

    The global order compares, smallest first: 0–3 of `request_key`, then the team's
    weighted dominant share (current allocation plus decayed history, divided by the
    team's weight), then 4–5 of `request_key`.
    """

    def __init__(
        self,
        pending: Iterable[PendingRequest],
        classes: Mapping[str, WorkloadClass],
        teams: Iterable[Team],
        usage: Iterable[TeamUsage],
        running: Iterable[Running],
        capacity: Resources,
        now_ms: int,
        half_life_s: int,
        escalate_after: float,
        held: Mapping[str, Resources] | None = None,
    ) -> None:
        """`held`: what each team's attempts hold beside `running` (the tick sums it in its
        own pass over the running attempts)."""
        self.capacity = capacity
        self.weights = {t.name: max(t.weight, 1) for t in teams}
        sums: dict[str, list[int]] = {}
        for team, res in (held or {}).items():
            sums[team] = [res.gpu_milli, res.cpu_milli, res.memory_mib]
        for run in running:
            acc = sums.setdefault(run.team, [0, 0, 0])
            shape = run.shape
            acc[0] += shape.gpus_milli
            acc[1] += shape.cpu_milli * shape.pods
            acc[2] += shape.memory_mib * shape.pods
        self.held = {team: Resources(*acc) for team, acc in sums.items()}
        self.history: dict[str, int] = {}
        for u in usage:
            elapsed = now_ms - u.as_of_ms if u.as_of_ms else 0
            decayed = decay_usage(u.decayed_milli_s, elapsed, half_life_s)
            self.history[u.team] = history_share_ppm(decayed, capacity.gpu_milli, half_life_s)
        self._shares: dict[str, int] = {}
        self.escalated: dict[str, bool] = {}
        # Each request's `request_key` 0–3 becomes its rank among the few distinct ones
        # the tick may hold (every class's band, both flags, the priorities present):
        # flat integer keys sort and compare fast, and the team's share goes between that
        # rank and 4–5 (`_entry`). Ranks over all such heads order as over those present.
        pending = pending if isinstance(pending, (list, tuple)) else list(pending)
        priorities = sorted({req.priority for req in pending})
        bands = sorted({cls.band for cls in classes.values()} | {UNKNOWN_BAND})
        heads = sorted(
            (-pre, -band, -esc, -prio)
            for pre in (0, 1)
            for band in bands
            for esc in (0, 1)
            for prio in priorities
        )
        rank_of = {head: rank for rank, head in enumerate(heads)}

        def ranks(band: int) -> list[list[dict[int, int]]]:
            """[preempting][escalated] -> {priority: rank} for one band."""
            return [
                [
                    {prio: rank_of[(-pre, -band, -esc, -prio)] for prio in priorities}
                    for esc in (0, 1)
                ]
                for pre in (0, 1)
            ]

        # `escalated` and `request_key`, inline: this loop runs once per pending request.
        per_class = {
            name: (
                escalate_after * cls.max_queue_s * 1000 if cls.max_queue_s > 0 else None,
                ranks(cls.band),
            )
            for name, cls in classes.items()
        }
        unknown = (None, ranks(UNKNOWN_BAND))
        flags = self.escalated
        by_team: dict[str, list[tuple[int, int, str, PendingRequest]]] = {}
        for req in pending:
            bound, rank = per_class.get(req.workload_class, unknown)
            esc = bound is not None and now_ms - req.created_at_ms >= bound
            flags[req.id] = esc
            items = by_team.get(req.team)
            if items is None:
                items = by_team[req.team] = []
            items.append((rank[req.preempting][esc][req.priority], req.created_at_ms, req.id, req))
        for items in by_team.values():
            items.sort()  # ids are unique, so the request itself is never compared
        self._lists = by_team
        self._next = dict.fromkeys(self._lists, 0)
        #: (rank of `request_key` 0–3, the team's share, `request_key` 4–5, team): the same
        #: order as the flat key with the share after 3
        self._heap: list[_Entry] = []
        for team in self._lists:
            self._push(team)
        self._last: str | None = None
        #: the last team's requests before this index come before the heap's top: its run
        #: (`_run`), handed out without the heap while nothing is charged
        self._until = 0
        #: another team's share changed (a preemptor charged for a plan): rebuild the heap
        self._stale = False

    def share(self, team: str) -> int:
        """Return the team's weighted dominant share (ppm; lower goes first)."""
        # It moves only when the team is charged: asked once per pop, it is kept till then.
        found = self._shares.get(team)
        if found is None:
            now = dominant_share_ppm(self.held.get(team, Resources()), self.capacity)
            found = (now + self.history.get(team, 0)) * 1000 // self.weights.get(team, 1)
            self._shares[team] = found
        return found

    def charge(self, team: str, shape: Shape) -> None:
        """Count an admission in the team's share (a victim keeps its share until it stops)."""
        self.held[team] = self.held.get(team, Resources()).plus(shape)
        self._shares.pop(team, None)
        self._until = 0
        if team != self._last:
            self._stale = True

    def pop(self) -> PendingRequest | None:
        """Return the next request in order, or None when all were handed out."""
        last = self._last
        if self._stale:
            if last is not None:
                self._push(last)
            teams = [entry[4] for entry in self._heap]
            self._heap = []
            for team in teams:
                self._push(team)
            self._stale = False
        elif last is not None:
            # The team just popped usually comes next again (its run of requests, `_run`);
            # past the run, `heappushpop` leaves the heap alone when it still wins.
            # (`_entry` and `_take`, inline: this runs once per pending request.)
            i = self._next[last]
            if i < self._until:
                self._next[last] = i + 1
                return self._lists[last][i][3]
            items = self._lists[last]
            if i < len(items):
                rank, created, rid, req = items[i]
                share = self._shares.get(last)
                if share is None:
                    share = self.share(last)
                entry = (rank, share, created, rid, last)
                top = heapq.heappushpop(self._heap, entry)
                if top is entry:
                    self._next[last] = i + 1
                    self._run(last, i + 1)
                    return req
                return self._take(top[4])
        if not self._heap:
            self._last = None
            return None
        return self._take(heapq.heappop(self._heap)[4])

    def _take(self, team: str) -> PendingRequest:
        i = self._next[team]
        self._next[team] = i + 1
        self._last = team
        self._run(team, i + 1)
        return self._lists[team][i][3]

    def _run(self, team: str, start: int) -> None:
        """Set `_until`: the team's requests from `start` that come before the heap's top.
        The heap holds every other team's next entry and the team's share stays as it is
        until a charge (which ends the run), so they are the ones whose entry is smaller."""
        items = self._lists[team]
        if not self._heap:
            self._until = len(items)
            return
        rank, share, created, rid, _ = self._heap[0]
        mine = self.share(team)
        self._until = bisect.bisect_left(
            items,
            (rank, share, created, rid),
            lo=start,
            key=lambda item: (item[0], mine, item[1], item[2]),
        )

    def _entry(self, team: str) -> _Entry | None:
        i = self._next[team]
        items = self._lists[team]
        if i >= len(items):
            return None
        rank, created, rid, _ = items[i]
        return (rank, self.share(team), created, rid, team)

    def _push(self, team: str) -> None:
        entry = self._entry(team)
        if entry is not None:
            heapq.heappush(self._heap, entry)
