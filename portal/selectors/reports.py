"""Reports for admins: how submitters' runtime estimates compare with what ran (the backfill
trusts them), and which guarantees go unused."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F, Max, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from portal.models import Attempt, GpuRequest, Quota, UsageRecord

#: the windows a report may look back over, in days
WINDOWS = (7, 30, 90)


@dataclass(frozen=True)
class EstimateRow:
    team: str
    workload_class: str
    requests: int
    estimate_median_s: int
    actual_median_s: int
    #: actual / estimate
    ratio_median: float
    ratio_p90: float
    #: share of requests that ran longer than estimated
    overran: float
    #: share that finished in under a third of their estimate
    under_a_third: float


def _quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank quantile of a sorted, non-empty list."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def estimates_vs_reality(days: int = 30, now: datetime | None = None) -> list[EstimateRow]:
    """Per team and class, the finished batch requests of the last `days` days: estimated
    against actual runtime (every attempt's time running, summed), as ratios.

    One grouped query gives each request's actual runtime; the quantiles of the ratios are
    taken here, as SQLite (the embedded default) has no percentile aggregate.
    """
    since = (now or timezone.now()) - timedelta(days=days)
    ran = ExpressionWrapper(F("ended_at") - F("started_at"), output_field=DurationField())
    rows = (
        Attempt.objects.filter(
            request__state=GpuRequest.State.SUCCEEDED,
            request__kind=GpuRequest.Kind.BATCH,
            request__estimated_runtime_s__gt=0,
            started_at__isnull=False,
            ended_at__isnull=False,
        )
        .values(
            "request_id",
            "request__team__name",
            "request__workload_class__name",
            "request__estimated_runtime_s",
        )
        .annotate(actual=Sum(ran), last=Max("ended_at"))
        .filter(last__gte=since)
        .order_by()
        .values_list(
            "request__team__name",
            "request__workload_class__name",
            "request__estimated_runtime_s",
            "actual",
        )
    )
    groups: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for team, cls, estimate, actual in rows:
        groups.setdefault((team, cls), []).append((estimate, actual.total_seconds()))
    out = []
    for (team, cls), pairs in sorted(groups.items()):
        ratios = sorted(actual / estimate for estimate, actual in pairs)
        n = len(pairs)
        out.append(
            EstimateRow(
                team=team,
                workload_class=cls,
                requests=n,
                estimate_median_s=int(_quantile(sorted(e for e, _ in pairs), 0.5)),
                actual_median_s=int(_quantile(sorted(a for _, a in pairs), 0.5)),
                ratio_median=_quantile(ratios, 0.5),
                ratio_p90=_quantile(ratios, 0.9),
                overran=sum(1 for r in ratios if r > 1) / n,
                under_a_third=sum(1 for r in ratios if r < 1 / 3) / n,
            )
        )
    return out


@dataclass(frozen=True)
class IdleRow:
    quota: Quota
    #: GPU-hours guaranteed and used, over the last 7 and the last 30 days
    guaranteed_7d: float
    used_7d: float
    guaranteed_30d: float
    used_30d: float
    #: whole GPUs: the 95th percentile of the daily mean GPUs used over 30 days, rounded up
    suggested_gpus: int

    @property
    def idle_7d(self) -> float:
        return max(0.0, self.guaranteed_7d - self.used_7d)

    @property
    def idle_30d(self) -> float:
        return max(0.0, self.guaranteed_30d - self.used_30d)

    @property
    def idle_share_30d(self) -> float:
        return self.idle_30d / self.guaranteed_30d if self.guaranteed_30d else 0.0

    @property
    def whatif(self) -> str:
        """The what-if line that tries the suggested guarantee."""
        return f"quota.{self.quota.team.name}.{self.quota.pool.name}={self.suggested_gpus}"


def _held_between(start: datetime, end: datetime) -> Sum:
    """Time the usage ledger's attempts held their GPUs in [start, end) (a duration)."""
    held = ExpressionWrapper(
        Least(Coalesce(F("ended_at"), Value(end)), Value(end))
        - Greatest(F("started_at"), Value(start)),
        output_field=DurationField(),
    )
    return Sum(
        held,
        filter=Q(started_at__lt=end) & (Q(ended_at__isnull=True) | Q(ended_at__gt=start)),
        output_field=DurationField(),
    )


def _gpu_hours(held: dict[int, dict[str, Any]], key: str) -> float:
    """GPU-hours from {gpus_milli: time held} (durations are summed per size in SQL: SQLite
    cannot multiply a duration)."""
    return (
        sum(milli * (t.get(key) or timedelta(0)).total_seconds() for milli, t in held.items())
        / 1000
        / 3600
    )


def idle_quota(now: datetime | None = None) -> list[IdleRow]:
    """Per team and pool with a guarantee, the guaranteed GPU-hours of the last 7 and 30 days
    against those used (the usage ledger, clipped to the window), and a suggested guarantee.

    Two queries: the quotas, and one grouped read of the ledger summing, per attempt size,
    the time held in each window and each of the last 30 days (for the percentile) in SQL.
    The guarantee is today's: quotas keep no history.
    """
    now = now or timezone.now()
    day0 = now - timedelta(days=30)
    sums: dict[str, Sum] = {
        "w7": _held_between(now - timedelta(days=7), now),
        "w30": _held_between(day0, now),
    }
    for d in range(30):
        sums[f"d{d}"] = _held_between(day0 + timedelta(days=d), day0 + timedelta(days=d + 1))
    quotas = list(
        Quota.objects.filter(nominal_milli__gt=0, team__retired_at__isnull=True)
        .select_related("team", "pool")
        .order_by("team__name", "pool__name")
    )
    ledger: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for r in (
        UsageRecord.objects.filter(team_id__in={q.team_id for q in quotas}, started_at__lt=now)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=day0))
        .values("team_id", "pool_id", "gpus_milli")
        .annotate(**sums)
        .order_by()
    ):
        key = (r.pop("team_id"), r.pop("pool_id"))
        ledger.setdefault(key, {})[r.pop("gpus_milli")] = r
    out = []
    for q in quotas:
        used = ledger.get((q.team_id, q.pool_id), {})
        # a day's mean GPUs in use: its GPU-hours over 24 h
        daily = sorted(_gpu_hours(used, f"d{d}") / 24 for d in range(30))
        gpus = q.nominal_milli / 1000
        out.append(
            IdleRow(
                quota=q,
                guaranteed_7d=gpus * 7 * 24,
                used_7d=_gpu_hours(used, "w7"),
                guaranteed_30d=gpus * 30 * 24,
                used_30d=_gpu_hours(used, "w30"),
                # (rounded to a hundredth first: a few seconds of overlap are not another GPU)
                suggested_gpus=math.ceil(round(_quantile(daily, 0.95), 2)),
            )
        )
    return out
