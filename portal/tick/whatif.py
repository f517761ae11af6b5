"""What-if on this site's own history (scheduling/whatif.py does the replay).

- The site: what the tick sees now (`portal.tick.snapshot.build_snapshot`): nodes, pools,
  classes, teams, quotas, the active profile's `Policy` and the pools' shape history.
- The history: the requests submitted in the last N days, with their real arrival
  (`created_at`), shape, team, class and pool. Their runtime is what they ran: the last
  attempt's time from start (or admission) to its end; one still running counts up to
  now; one never started its submitter's estimate. Requests that ended without ever
  starting (cancelled or rejected while waiting) are left out: there is no runtime to
  replay, and under either setting they would have been cancelled again.
- `run`: both replays and the comparison, `{"current", "proposed", "teams"}`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from portal.lib import shapes
from portal.models import Attempt, GpuRequest, Pool, Team, WorkloadClass
from portal.services.profiles import policy_profile_ensure
from portal.tick.snapshot import build_snapshot
from scheduling.simulate import Job
from scheduling.whatif import Site, apply_settings, compare


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def site_now(now: datetime | None = None) -> Site:
    """The site as the tick sees it now, with the active profile's policy."""
    now = now or timezone.now()
    policy = policy_profile_ensure().profile().policy()
    snap, _ = build_snapshot(now, policy)
    return Site(
        nodes=snap.nodes,
        pools=snap.pools,
        classes=snap.classes,
        teams=snap.teams,
        quotas=snap.quotas,
        policy=policy,
        workloads=snap.workloads,
    )


def history(days: int, now: datetime | None = None) -> tuple[list[Job], int, int]:
    """The last `days` days of requests as replay jobs, and the window (start, end) in ms."""
    now = now or timezone.now()
    start = now - timedelta(days=days)
    pools = {p.pk: p for p in Pool.objects.all()}
    tolerations: dict[int | None, Any] = {pk: shapes.tolerations([p]) for pk, p in pools.items()}
    tolerations[None] = shapes.tolerations(pools.values())
    teams = dict(Team.objects.values_list("pk", "name"))
    classes = dict(WorkloadClass.objects.values_list("pk", "name"))
    ran: dict[int, int] = {}
    # The last attempt of each request decides its runtime (ordered by number).
    for request_id, started, admitted, ended in (
        Attempt.objects.filter(request__created_at__gte=start)
        .order_by("request_id", "number")
        .values_list("request_id", "started_at", "admitted_at", "ended_at")
    ):
        begun = started or admitted
        ran[request_id] = max(1000, _ms(ended or now) - _ms(begun))
    jobs = []
    rows = (
        GpuRequest.objects.filter(created_at__gte=start, created_at__lte=now)
        .filter(Q(pk__in=list(ran)) | Q(state=GpuRequest.State.PENDING))
        .order_by("created_at", "pk")
    )
    for r in rows.iterator(chunk_size=2000):
        estimate = r.estimated_runtime_s * 1000 if r.estimated_runtime_s else None
        jobs.append(
            Job(
                id=str(r.pk),
                team=teams[r.team_id],
                cls=classes[r.workload_class_id],
                shape=shapes.request_shape(r, tolerations[r.pool_id]),
                runtime_ms=ran.get(r.pk) or estimate or 3_600_000,
                arrival_ms=_ms(r.created_at),
                estimate_ms=estimate,
                checkpoint_ms=r.checkpoint_interval_s * 1000 or None,
                pool=pools[r.pool_id].name if r.pool_id else "",
            )
        )
    return jobs, _ms(start), _ms(now)


def run(
    *,
    days: int,
    settings: Mapping[str, str],
    tick_s: float = 60.0,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
    parallel: bool = True,
) -> dict[str, Any]:
    """Replay the last `days` days under the current and the proposed settings.

    Raises `scheduling.whatif.SettingError` (naming the key) for a bad setting, before
    any replay runs."""
    now = now or timezone.now()
    current = site_now(now)
    proposed = apply_settings(current, settings)
    jobs, start_ms, end_ms = history(days, now)
    return compare(
        current,
        proposed,
        jobs,
        start_ms=start_ms,
        end_ms=end_ms,
        tick_ms=int(tick_s * 1000),
        progress=progress,
        parallel=parallel,
    )
