"""The queue as people see it: pending requests in order, a summary, where each one's wait went."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Min, Q, QuerySet
from django.utils import timezone

from portal import access
from portal.access import AnyUser
from portal.models import Attempt, GpuRequest, Pool, SchedulerState, Team, WorkloadClass
from portal.tick import waits as capacity


def queue_list(
    user: AnyUser,
    *,
    workload_class: WorkloadClass | None = None,
    team: Team | None = None,
    pool: Pool | None = None,
) -> QuerySet[GpuRequest]:
    """Pending requests in the order the scheduler will take them.

    1. the position the latest tick stored (requests it has not seen yet go last);
    2. older first;
    3. id, for deterministic ties.
    """
    qs = access.requests_visible(user).filter(state=GpuRequest.State.PENDING)
    if workload_class is not None:
        qs = qs.filter(workload_class=workload_class)
    if team is not None:
        qs = qs.filter(team=team)
    if pool is not None:
        qs = qs.filter(pool=pool)
    return qs.order_by(F("queue_position").asc(nulls_last=True), "created_at", "id")


def queue_summary(user: AnyUser) -> list[dict[str, Any]]:
    """Pending counts and the oldest request by class, team and pool (one grouped query)."""
    rows = (
        access.requests_visible(user)
        .filter(state=GpuRequest.State.PENDING)
        .values("workload_class__name", "team__name", "pool__name")
        .annotate(n=Count("id"), first=Min("created_at"))
        .order_by("workload_class__name", "team__name", "pool__name")
    )
    group = ("workload_class__name", "team__name", "pool__name")
    now = timezone.now()
    pending = access.requests_visible(user).filter(state=GpuRequest.State.PENDING)
    waits = {tuple(w[g] for g in group): w for w in capacity.split_by(pending, group, now)}
    return [
        {
            "workload_class": r["workload_class__name"],
            "team": r["team__name"],
            "pool": r["pool__name"] or "any",
            "pending": r["n"],
            "oldest": r["first"],
            "wait": [
                (reason, waits[tuple(r[g] for g in group)][reason]) for reason in capacity.REASONS
            ],
        }
        for r in rows
    ]


def request_wait_split(req: GpuRequest) -> list[tuple[str, int]]:
    """Where the request's wait went, in seconds by reason (portal/tick/waits.py)."""
    split = capacity.split(req, timezone.now())
    return [(reason, split[reason]) for reason in capacity.REASONS]


@dataclass(frozen=True)
class Activity:
    """What the scheduler did since a moment, and the queue now (the terminal's line a minute)."""

    ticks: int
    admitted: int
    finished: int
    waiting: int
    running: int


def activity(since: datetime) -> Activity:
    state = SchedulerState.objects.filter(pk=1).values_list("ticks", flat=True).first()
    counts = GpuRequest.objects.aggregate(
        waiting=Count("id", filter=Q(state=GpuRequest.State.PENDING)),
        running=Count("id", filter=Q(state=GpuRequest.State.RUNNING)),
    )
    return Activity(
        ticks=state or 0,
        admitted=Attempt.objects.filter(admitted_at__gte=since).count(),
        finished=Attempt.objects.filter(ended_at__gte=since).count(),
        waiting=counts["waiting"],
        running=counts["running"],
    )
