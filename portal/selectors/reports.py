"""Reports for admins: how submitters' runtime estimates compare with what ran (the backfill
trusts them), and which guarantees go unused."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import DurationField, ExpressionWrapper, F, Max, Sum
from django.utils import timezone

from portal.models import Attempt, GpuRequest

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
