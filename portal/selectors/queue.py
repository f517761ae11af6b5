"""The queue as people see it: pending requests in order, a summary, where each one's wait went."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Min, Q, QuerySet
from django.utils import timezone

from portal import access
from portal.access import AnyUser
from portal.models import Attempt, GpuRequest, Pool, SchedulerState, Team, WorkloadClass
from portal.tick import waits as capacity
from scheduling.slo import Promise

#: the queue-time promise is measured over requests submitted this recently
PROMISE_WINDOW = timedelta(days=7)


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


def promise_by_class(
    requests: QuerySet[GpuRequest], now: datetime | None = None
) -> dict[str, Promise]:
    """How well each class with a maximum queue time kept it (`scheduling.slo`), over
    `requests` submitted in the last `PROMISE_WINDOW`: those admitted once count by their
    wait until the first admission, those still pending only once they have waited past
    the promise (a broken promise whatever comes next). Two aggregate queries per class."""
    now = now or timezone.now()
    since = now - PROMISE_WINDOW
    waited = ExpressionWrapper(
        F("admitted_at") - F("request__created_at"), output_field=DurationField()
    )
    out: dict[str, Promise] = {}
    for cls in _promising():
        limit = timedelta(seconds=cls.max_queue_s)
        ours = requests.filter(workload_class=cls, created_at__gte=since)
        admitted = (
            Attempt.objects.filter(number=1, request__in=ours)
            .annotate(waited=waited)
            .aggregate(
                n=Count("id"), kept=Count("id", filter=Q(waited__lte=limit)), longest=Max("waited")
            )
        )
        late = ours.filter(state=GpuRequest.State.PENDING, created_at__lt=now - limit).aggregate(
            n=Count("id"), first=Min("created_at")
        )
        longest = [admitted["longest"] or timedelta(0)]
        if late["first"] is not None:
            longest.append(now - late["first"])
        overrun = max(0.0, max(w.total_seconds() for w in longest) - cls.max_queue_s)
        out[cls.name] = Promise(admitted["n"] + late["n"], admitted["kept"], overrun)
    return out


def _promising() -> QuerySet[WorkloadClass]:
    """Classes with a maximum queue time: the others promise nothing."""
    return WorkloadClass.objects.filter(max_queue_s__gt=0).order_by("name")


def queue_promise(user: AnyUser) -> list[dict[str, Any]]:
    """The queue-time promise per class over the requests the user may see (the queue page)."""
    kept = promise_by_class(access.requests_visible(user))
    return [
        {
            "workload_class": cls.name,
            "max_queue_s": cls.max_queue_s,
            "requests": kept[cls.name].requests,
            "attainment_pct": round(100 * kept[cls.name].attainment, 1),
            "overrun_max_s": round(kept[cls.name].overrun_max_s),
        }
        for cls in _promising()
        if cls.name in kept
    ]
