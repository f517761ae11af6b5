"""Start-time estimates: when a pending request may start if nothing else arrives.

Reads only. A rough guide for researchers, not a promise: fragmentation, preemption
and later higher-priority work move it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from portal.lib import shapes
from portal.models import (
    Attempt,
    Device,
    GpuRequest,
    Pool,
    Team,
)


def _runtime_s(req_runtime_s: int, max_runtime_s: int) -> float:
    """Expected real seconds an attempt runs (the simulated cluster runs faster)."""
    seconds = float(req_runtime_s)
    if max_runtime_s:
        seconds = min(seconds, float(max_runtime_s))
    if settings.CLUSTER_BACKEND == "simulated":
        seconds = seconds * settings.SIMULATED_SECONDS_PER_HOUR / 3600
    return seconds


def running_ends(
    pool_ids: Iterable[int] | None = None, *, team: Team | None = None
) -> list[tuple[datetime, int, int]]:
    """(expected end, pool id, GPU milli) of every active attempt, soonest first."""
    now = timezone.now()
    # A serving workload runs until stopped: its devices are never expected back.
    qs = Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES).exclude(request__kind="serving")
    if pool_ids is not None:
        qs = qs.filter(pool_id__in=list(pool_ids))
    if team is not None:
        qs = qs.filter(request__team=team)
    out = []
    for started, admitted, est, max_rt, pool_id, milli in qs.values_list(
        "started_at",
        "admitted_at",
        "request__estimated_runtime_s",
        "request__max_runtime_s",
        "pool_id",
        "gpus_milli",
    ):
        end = (started or admitted) + timedelta(seconds=_runtime_s(est, max_rt))
        # Overdue work is assumed to end soon rather than in the past.
        out.append((max(end, now + timedelta(seconds=30)), pool_id, milli))
    out.sort()
    return out


def pool_free_milli(pool_ids: Iterable[int]) -> int:
    """Free GPU milli on healthy devices of schedulable nodes in these pools."""
    ids = list(pool_ids)
    devices = Device.objects.filter(
        node__pool_id__in=ids, healthy=True, node__ready=True, node__cordoned=False
    ).count()
    held = (
        Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES, pool_id__in=ids).aggregate(
            s=Sum("gpus_milli")
        )["s"]
        or 0
    )
    return max(0, devices * 1000 - held)


def estimate_start(
    *,
    need_milli: int,
    free_milli: int,
    ends: Sequence[tuple[datetime, int, int]],
    now: datetime | None = None,
) -> datetime | None:
    """Return when `need_milli` becomes free if nothing else arrives, or None if it never does.

    Walks the running attempts' expected ends in order, adding what each frees to
    what is free now. A rough guide, not a promise: fragmentation, preemption and
    later higher-priority work move it.
    """
    now = now or timezone.now()
    if need_milli <= free_milli:
        return now
    free = free_milli
    for end, _, milli in ends:
        free += milli
        if free >= need_milli:
            return end
    return None


def request_estimates(requests: Sequence[GpuRequest]) -> dict[int, datetime | None]:
    """Estimated start of each pending request in the list (tick's estimate when it stored one)."""
    pending = [r for r in requests if r.state == GpuRequest.State.PENDING]
    if not pending:
        return {}
    all_pools = list(
        Pool.objects.filter(lifecycle=Pool.Lifecycle.PRODUCTION).values_list("id", flat=True)
    )
    ends = running_ends()
    free_cache: dict[tuple[int, ...], int] = {}
    # Demand queued ahead of each request, per pool, from one narrow query.
    ahead_rows = [
        (
            pool_id,
            pos,
            shapes.shape_build(
                profile_kind=kind, mig_profile=mig, milli=milli, count=count, pods=pods
            ).gpus_milli,
        )
        for pool_id, pos, kind, mig, milli, count, pods in GpuRequest.objects.filter(
            state=GpuRequest.State.PENDING, queue_position__isnull=False
        )
        .order_by("queue_position")
        .values_list(
            "pool_id", "queue_position", "profile_kind", "mig_profile", "milli", "count", "pods"
        )[:5000]
    ]
    out: dict[int, datetime | None] = {}
    for r in pending:
        if r.estimated_start:
            out[r.pk] = r.estimated_start
            continue
        pools = (r.pool_id,) if r.pool_id else tuple(all_pools)
        if pools not in free_cache:
            free_cache[pools] = pool_free_milli(pools)
        ahead = 0
        if r.queue_position:
            for pool_id, pos, milli in ahead_rows:
                if pos is None or pos >= r.queue_position:
                    break
                if pool_id is None or pool_id in pools:
                    ahead += milli
        out[r.pk] = estimate_start(
            need_milli=r.gpus_milli + ahead,
            free_milli=free_cache[pools],
            ends=[e for e in ends if e[1] in pools],
        )
    return out
