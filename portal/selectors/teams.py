"""Teams' usage against their quotas, and their members."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Sum

from portal.models import Attempt, GpuRequest, Membership, Pool, Quota, Team


@dataclass
class PoolUsage:
    pool: Pool
    quota: Quota | None
    used_milli: int
    borrowed_milli: int
    lent_milli: int
    #: the quota form of the team page, set by the view for each pool
    form: Any = None

    @property
    def nominal_milli(self) -> int:
        return self.quota.nominal_milli if self.quota else 0

    @property
    def percent(self) -> int:
        if not self.nominal_milli:
            return 100 if self.used_milli else 0
        return min(100, self.used_milli * 100 // self.nominal_milli)


def team_usage(team: Team, *, all_pools: bool = False) -> list[PoolUsage]:
    """Usage against guarantee per pool, with what the team borrowed and lent.

    Borrowed is what the team holds beyond its nominal quota. Lent is the team's
    share of what others borrow in the pool, split in proportion to each team's
    unused, lendable nominal quota (capped by its lending limit).
    """
    used: dict[tuple[int, int], int] = {
        (t, p): s or 0
        for t, p, s in Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES)
        .values("request__team_id", "pool_id")
        .annotate(s=Sum("gpus_milli"))
        .values_list("request__team_id", "pool_id", "s")
    }
    # as the tick counts them: a retired team's quotas no longer do
    quotas = list(Quota.objects.filter(team__retired_at=None).select_related("pool"))
    by_key = {(q.team_id, q.pool_id): q for q in quotas}
    pools = {q.pool_id: q.pool for q in quotas}
    extra = Pool.objects.all() if all_pools else Pool.objects.filter(pk__in={p for _, p in used})
    pools.update({p.pk: p for p in extra})
    # the team itself even without quota or usage (retired, or new on an admin's page)
    team_ids = {t for t, _ in used} | {q.team_id for q in quotas} | {team.pk}
    out = []
    for pool_id, pool in sorted(pools.items(), key=lambda kv: kv[1].name):
        borrowed: dict[int, int] = {}
        lendable: dict[int, int] = {}
        for t in team_ids:
            q = by_key.get((t, pool_id))
            nominal = q.nominal_milli if q else 0
            u = used.get((t, pool_id), 0)
            borrowed[t] = max(0, u - nominal)
            spare = max(0, nominal - u)
            if q and q.lending_limit_milli is not None:
                spare = min(spare, q.lending_limit_milli)
            lendable[t] = spare
        if not all_pools and (team.pk, pool_id) not in by_key and not used.get((team.pk, pool_id)):
            continue
        total_borrowed = sum(v for t, v in borrowed.items() if t != team.pk)
        total_lendable = sum(lendable.values())
        lent = 0
        if total_lendable and lendable.get(team.pk):
            lent = min(lendable[team.pk], total_borrowed * lendable[team.pk] // total_lendable)
        out.append(
            PoolUsage(
                pool,
                by_key.get((team.pk, pool_id)),
                used.get((team.pk, pool_id), 0),
                borrowed[team.pk],
                lent,
            )
        )
    return out


def team_members(team: Team) -> list[dict[str, Any]]:
    """Members, their role and cap, and what each holds now."""
    holding = dict(
        Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES, request__team=team)
        .values("request__submitted_by_id")
        .annotate(s=Sum("gpus_milli"))
        .values_list("request__submitted_by_id", "s")
    )
    pending = dict(
        GpuRequest.objects.filter(team=team, state=GpuRequest.State.PENDING)
        .values("submitted_by_id")
        .annotate(n=Count("id"))
        .values_list("submitted_by_id", "n")
    )
    return [
        {
            "membership": m,
            "holding_milli": holding.get(m.user_id, 0) or 0,
            "pending": pending.get(m.user_id, 0),
        }
        for m in Membership.objects.filter(team=team)
        .select_related("user")
        .order_by("user__username")
    ]
