"""Quota accounting per team per pool: nominal, borrowing, lending and the inference floor.

All amounts are GPU milli (`Shape.gpus_milli`). Kueue's admission rule
(its cohort semantics), per pool:

1. a request fits if the team's usage plus the request stays within its `nominal`
   quota — it borrows nothing;
2. otherwise it borrows: it fits only if the team stays within
   `nominal + borrowing_limit` (no limit = unlimited) **and** the pool's cohort has
   unused lendable capacity for the part above the team's guaranteed share;
3. a team lends at most `lending_limit` of its nominal quota (no limit = all of it); the
   rest, `nominal - lending_limit`, is guaranteed to it and never counted as lent;
4. capacity of a pool that no quota covers (capacity minus the sum of nominals) is
   lendable to everyone;
5. the pool's inference floor is never lent to work that cannot be preempted: a
   non-inference admission that is not preemptible must keep all such usage within
   `capacity - floor`. Preemptible training may use the floor; inference takes it back
   by preemption (`scheduling.preemption`);
6. lendable capacity held back this tick for a blocked large borrower (`held_back`,
   set by `scheduling.cycle`'s reservation step) is not lent to later borrowers.

A pool without any `Quota` row is not quota-managed: every team may use all of it
(rule 5 still holds). A team without a row in a quota-managed pool has nominal 0 and
may borrow without limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduling.types import (
    Node,
    Pool,
    PreemptionPolicy,
    Quota,
    Running,
    WorkloadClass,
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The quota answer for one request in one pool."""

    ok: bool
    #: the admission would borrow beyond the team's nominal quota
    borrowing: bool
    #: "fits", "borrows", "borrowing-limit", "cohort-exhausted" or "inference-floor"
    code: str
    facts: dict[str, object] = field(default_factory=dict)


def preemptible(cls: WorkloadClass, borrowing: bool) -> bool:
    """Return whether work of `cls` admitted with or without borrowing may be preempted."""
    if cls.preemption is PreemptionPolicy.ALWAYS:
        return True
    return cls.preemption is PreemptionPolicy.WHEN_BORROWING and borrowing


@dataclass(slots=True)
class PoolBook:
    """Usage and limits of one pool, updated as the tick admits and preempts."""

    name: str
    capacity: int
    floor: int
    managed: bool
    nominal: dict[str, int]
    borrowing_limit: dict[str, int | None]
    guaranteed: dict[str, int]
    cohort_capacity: int
    used: dict[str, int] = field(default_factory=dict)
    #: usage by inference classes
    inference_used: int = 0
    #: non-inference usage that may not be preempted (rule 5)
    locked_used: int = 0
    #: lendable capacity held this tick for a blocked large request; later borrowers
    #: may not take it
    held_back: int = 0

    def over_guarantee(self, team: str, used: int) -> int:
        return max(0, used - self.guaranteed.get(team, 0))

    #: sum over teams of usage beyond their guaranteed (non-lendable) part
    cohort_used: int = 0

    def borrowed(self, team: str) -> int:
        """GPU milli the team uses beyond its nominal quota."""
        return max(0, self.used.get(team, 0) - self.nominal.get(team, 0))


#: the last tuple of nodes `pool_capacity` summed, and the sums: a caller passing the same
#: tuple tick after tick (the replay) does not sum it again
_LAST_CAPACITY: tuple[tuple[Node, ...], dict[str, int]] | None = None


def pool_capacity(nodes: Iterable[Node]) -> dict[str, int]:
    """GPU milli of the healthy devices of the ready, uncordoned nodes, per pool (do not
    change the answer: it may be remembered)."""
    global _LAST_CAPACITY
    last = _LAST_CAPACITY
    if last is not None and last[0] is nodes:
        return last[1]
    capacity: dict[str, int] = {}
    for node in nodes:
        if node.ready and not node.cordoned:
            healthy = sum(1000 for d in node.devices if d.healthy)
            capacity[node.pool] = capacity.get(node.pool, 0) + healthy
    if isinstance(nodes, tuple):  # nodes are frozen: the same tuple sums the same
        _LAST_CAPACITY = (nodes, capacity)
    return capacity


class QuotaBook:
    """Quota state of every pool; `check` answers, `add` keeps it current."""

    def __init__(
        self,
        pools: Iterable[Pool],
        nodes: Iterable[Node],
        quotas: Iterable[Quota],
        running: Iterable[Running],
        classes: dict[str, WorkloadClass],
        held: Mapping[tuple[str, str, str], int] | None = None,
    ) -> None:
        """`held`: GPU milli per (team, pool, class) of attempts counted beside `running`
        (the tick sums them in its own pass over the running attempts)."""
        self.classes = classes
        #: per pool and team, `check`'s answers that read only the team's own figures:
        #: kept until the team's usage there changes (another team's admission leaves
        #: them standing, as one in another pool does)
        self._own: dict[str, dict[str, dict[tuple[int, str], Verdict]]] = {}
        #: per pool, the answers that also read what other teams change (the pool's
        #: borrowed total, its usage that may not be preempted): kept until the pool's
        #: book changes at all
        self._answers: dict[str, dict[tuple[str, int, str], Verdict]] = {}
        capacity = pool_capacity(nodes)
        by_pool: dict[str, list[Quota]] = {}
        for q in quotas:
            by_pool.setdefault(q.pool, []).append(q)
        self.pools: dict[str, PoolBook] = {}
        for pool in pools:
            cap = capacity.get(pool.name, 0)
            self.pools[pool.name] = _book(pool, cap, by_pool.get(pool.name, []))
        totals: dict[tuple[str, str, str], int] = dict(held or {})
        for run in running:
            key = (run.team, run.pool, run.workload_class)
            totals[key] = totals.get(key, 0) + run.shape.gpus_milli
        for (team, pool_name, class_name), milli in totals.items():
            self.add(team, pool_name, milli, class_name, False)

    def check(self, team: str, pool: str, milli: int, class_name: str) -> Verdict:
        """Return whether `team` may take `milli` more in `pool` for a request of the class.

        The answer is remembered until the book changes (`_change`, `hold_back`): a deep
        queue asks the same question for request after request of one team.
        """
        own = self._own.get(pool)
        if own is None:
            own = self._own[pool] = {}
        mine = own.get(team)
        if mine is None:
            mine = own[team] = {}
        verdict = mine.get((milli, class_name))
        if verdict is not None:
            return verdict
        answers = self._answers.get(pool)
        if answers is None:
            answers = self._answers[pool] = {}
        key = (team, milli, class_name)
        verdict = answers.get(key)
        if verdict is None:
            verdict, shared = self._check(team, pool, milli, class_name)
            if shared:
                answers[key] = verdict
            else:
                mine[(milli, class_name)] = verdict
        return verdict

    def hold_back(self, pool: str, milli: int) -> None:
        """Hold `milli` of the pool's lendable capacity back for a blocked large borrower."""
        self._answers.pop(pool, None)
        self._own.pop(pool, None)
        self.pools[pool].held_back += milli

    def _check(self, team: str, pool: str, milli: int, class_name: str) -> tuple[Verdict, bool]:
        """The answer, and whether it read what other teams' usage changes (the inference
        floor's room, the cohort's borrowed total) besides the team's own figures."""
        book = self.pools[pool]
        used = book.used.get(team, 0)
        nominal = book.nominal.get(team, 0)
        limit = book.borrowing_limit.get(team)
        facts: dict[str, object] = {
            "pool": pool,
            "team": team,
            "used_milli": used,
            "nominal_milli": nominal,
            "request_milli": milli,
        }
        borrowing = book.managed and used + milli > nominal
        cls = self.classes[class_name]
        # (without a floor the room is never read)
        floor = bool(book.floor) and not cls.inference and not preemptible(cls, borrowing)
        if floor:
            room = book.capacity - book.floor - book.locked_used
            if milli > room:
                facts.update(floor_milli=book.floor, room_milli=max(room, 0))
                return Verdict(False, borrowing, "inference-floor", facts), True
        if not borrowing:
            return Verdict(True, False, "fits", facts), floor
        may_borrow = None if limit is None else max(0, nominal + limit - used)
        facts["may_borrow_milli"] = may_borrow
        if limit is not None and used + milli > nominal + limit:
            return Verdict(False, True, "borrowing-limit", facts), floor
        extra = book.over_guarantee(team, used + milli) - book.over_guarantee(team, used)
        cohort_free = book.cohort_capacity - book.cohort_used - book.held_back
        facts["cohort_free_milli"] = max(cohort_free, 0)
        if extra > cohort_free:
            return Verdict(False, True, "cohort-exhausted", facts), True
        return Verdict(True, True, "borrows", facts), True

    def add(self, team: str, pool: str, milli: int, class_name: str, borrowing: bool) -> None:
        """Count `milli` more for `team` in `pool` (an admission, or a running attempt)."""
        self._change(team, pool, milli, class_name, borrowing)

    def check_without(
        self, team: str, pool: str, milli: int, class_name: str, victims: Sequence[Running]
    ) -> Verdict:
        """Return `check` as it will answer once `victims` have stopped (a preemption plan).

        The victims stay counted until they have stopped; this only asks what if.
        """
        for run in victims:
            self._change(run.team, run.pool, -run.shape.gpus_milli, run.workload_class, False)
        try:
            return self.check(team, pool, milli, class_name)
        finally:
            for run in victims:
                self._change(run.team, run.pool, run.shape.gpus_milli, run.workload_class, False)

    def _change(self, team: str, pool: str, delta: int, class_name: str, borrowing: bool) -> None:
        book = self.pools.get(pool)
        if book is None:
            return
        self._answers.pop(pool, None)
        own = self._own.get(pool)
        if own is not None:
            own.pop(team, None)
        before = book.used.get(team, 0)
        book.used[team] = before + delta
        book.cohort_used += book.over_guarantee(team, before + delta) - book.over_guarantee(
            team, before
        )
        cls = self.classes.get(class_name)
        if cls is not None and cls.inference:
            book.inference_used += delta
        elif cls is None or not preemptible(cls, borrowing):
            # A running WHEN_BORROWING attempt counts as locked: the snapshot does not
            # say whether it borrowed when it was admitted, so stay on the safe side.
            book.locked_used += delta


def _book(pool: Pool, capacity: int, quotas: list[Quota]) -> PoolBook:
    nominal = {q.team: q.nominal_milli for q in quotas}
    limits = {q.team: q.borrowing_limit_milli for q in quotas}
    guaranteed: dict[str, int] = {}
    lendable_sum = 0
    for q in quotas:
        lendable = q.nominal_milli
        if q.lending_limit_milli is not None:
            lendable = min(q.lending_limit_milli, q.nominal_milli)
        guaranteed[q.team] = q.nominal_milli - lendable
        lendable_sum += lendable
    unowned = max(0, capacity - sum(nominal.values()))
    return PoolBook(
        name=pool.name,
        capacity=capacity,
        floor=min(pool.inference_floor_milli, capacity),
        managed=bool(quotas),
        nominal=nominal,
        borrowing_limit=limits,
        guaranteed=guaranteed,
        cohort_capacity=lendable_sum + unowned,
    )
