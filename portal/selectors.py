"""Read queries for pages and the API: lists, the queue, the capacity map, team usage.

Nothing here writes. Every list is scoped by the caller through `portal.access`
(or is admin-only, checked in the view); every page-sized query is bounded and
fetches related rows up front so that a page costs a fixed number of queries.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Min, Q, QuerySet, Sum
from django.utils import timezone

from portal import access
from portal.access import AnyUser
from portal.models import (
    Allocation,
    Attempt,
    AuditEvent,
    Decision,
    Device,
    DeviceProfile,
    GpuRequest,
    Membership,
    Node,
    Pool,
    Quota,
    Team,
    WorkloadClass,
)

# ---------------------------------------------------------------------------
# Requests and the queue


def request_list(
    user: AnyUser, *, mine: bool = False, team: Team | None = None, state: str = ""
) -> QuerySet[GpuRequest]:
    """Requests the user may see, newest first; `mine` keeps only the user's own."""
    qs = access.requests_visible(user)
    if mine:
        qs = qs.filter(submitted_by=user)  # type: ignore[misc]
    if team is not None:
        qs = qs.filter(team=team)
    if state:
        qs = qs.filter(state=state)
    return qs.annotate(attempt_count=Count("attempts")).order_by("-created_at", "-id")


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
    return [
        {
            "workload_class": r["workload_class__name"],
            "team": r["team__name"],
            "pool": r["pool__name"] or "any",
            "pending": r["n"],
            "oldest": r["first"],
        }
        for r in rows
    ]


# ---------------------------------------------------------------------------
# Start-time estimates


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
    qs = Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES)
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
    ahead_rows = list(
        GpuRequest.objects.filter(state=GpuRequest.State.PENDING, queue_position__isnull=False)
        .order_by("queue_position")
        .values_list(
            "pool_id", "queue_position", "profile_kind", "mig_profile", "milli", "count", "pods"
        )[:5000]
    )
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
            for pool_id, pos, kind, mig, milli, count, pods in ahead_rows:
                if pos >= r.queue_position:
                    break
                if pool_id is None or pool_id in pools:
                    ahead += _milli(kind, mig, milli) * count * pods
        out[r.pk] = estimate_start(
            need_milli=r.gpus_milli + ahead,
            free_milli=free_cache[pools],
            ends=[e for e in ends if e[1] in pools],
        )
    return out


def _milli(kind: str, mig_profile: str, milli: int) -> int:
    if kind == DeviceProfile.Kind.MIG:
        head = mig_profile.split("g.", 1)[0]
        return (int(head) if head.isdigit() else 7) * 1000 // 7
    if kind == DeviceProfile.Kind.SHARED:
        return milli
    return 1000


# ---------------------------------------------------------------------------
# The submit preview: run the scheduler on a snapshot with the candidate added


@dataclass
class Preview:
    outcome: str  # "fits", "waits", "rejected"
    message: str
    pool: str = ""
    code: str = ""
    position: int = 0
    estimated_start: datetime | None = None
    borrowing: bool = False
    preemptions: int = 0


def offered_profiles(pool: Pool | None = None) -> QuerySet[DeviceProfile]:
    """Device profiles some pool really offers (the named one, or any production pool)."""
    pools = Pool.offering(pool)
    offered = [
        p.pk
        for p in DeviceProfile.objects.all()
        if any(x.offers(p.kind, p.mig_profile) for x in pools)
    ]
    return DeviceProfile.objects.filter(pk__in=offered).order_by("kind", "name")


def gpu_request_preview(
    *,
    team: Team,
    workload_class: WorkloadClass,
    pool: Pool | None,
    profile_kind: str,
    mig_profile: str = "",
    milli: int = 1000,
    gpu_memory_mib: int = 0,
    count: int = 1,
    pods: int = 1,
    cpu_milli: int = 1000,
    memory_mib: int = 4096,
    priority: int = 0,
    now: datetime | None = None,
) -> Preview:
    """What the scheduler would do with this request if it were submitted now. Writes nothing."""
    import scheduling
    from portal.tick import build_snapshot
    from scheduling import types as st

    now = now or timezone.now()
    snapshot, ctx = build_snapshot(now)
    candidate_pools = [pool] if pool is not None else list(ctx.pools.values())
    tolerations = tuple(
        {
            st.Taint(t["key"], t.get("value", ""), t.get("effect", "NoSchedule"))
            for p in candidate_pools
            for t in p.taints
        }
    )
    shape = st.Shape(
        kind=st.ProfileKind(profile_kind),
        count=count,
        milli=1000 if profile_kind != DeviceProfile.Kind.SHARED else milli,
        gpu_memory_mib=gpu_memory_mib if profile_kind == DeviceProfile.Kind.SHARED else 0,
        mig_profile=mig_profile if profile_kind == DeviceProfile.Kind.MIG else "",
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        tolerations=tolerations,
        pods=pods,
    )
    candidate_id = "preview"
    candidate = st.PendingRequest(
        id=candidate_id,
        team=team.name,
        workload_class=workload_class.name,
        shape=shape,
        created_at_ms=snapshot.now_ms,
        pool=pool.name if pool else "",
        priority=priority,
    )
    decisions = scheduling.schedule(
        dataclasses.replace(snapshot, pending=snapshot.pending + (candidate,)), snapshot.now_ms
    )
    mine = [
        d for d in decisions if d.request_id == candidate_id and d.kind != st.DecisionKind.PREEMPT
    ]
    preemptions = sum(
        1
        for i, d in enumerate(decisions)
        if d.kind == st.DecisionKind.PREEMPT and _preempts_for(decisions, i, candidate_id)
    )
    if not mine:
        return Preview("waits", "the scheduler gave no answer for this request", code="unknown")
    d = mine[0]
    if d.kind == st.DecisionKind.ADMIT:
        how = " by borrowing unused quota of other teams (may be reclaimed)" if d.borrowing else ""
        return Preview(
            "fits",
            f"fits now on pool {d.pool}{how}",
            pool=d.pool,
            code=d.code,
            borrowing=d.borrowing,
        )
    if d.kind == st.DecisionKind.REJECT:
        return Preview("rejected", d.message, code=d.code)
    pool_ids = [
        p.pk for p in candidate_pools if p.lifecycle == Pool.Lifecycle.PRODUCTION or p == pool
    ]
    ahead = sum(
        p.shape.gpus_milli
        for p, pd in _pending_with_positions(snapshot.pending, decisions)
        if 0 < pd < d.position and (not p.pool or p.pool in {x.name for x in candidate_pools})
    )
    quota_wait = d.code in ("borrowing-limit", "cohort-exhausted", "inference-floor")
    if quota_wait:
        ends = running_ends(pool_ids, team=team)
        estimate = estimate_start(need_milli=shape.gpus_milli, free_milli=0, ends=ends, now=now)
    elif d.code in ("preempting", "awaiting-stop"):
        estimate = now + timedelta(seconds=settings.TICK_SECONDS * 2 + 30)
    else:
        estimate = estimate_start(
            need_milli=shape.gpus_milli + ahead,
            free_milli=pool_free_milli(pool_ids),
            ends=running_ends(pool_ids),
            now=now,
        )
    message = d.message.removeprefix("waiting: ")
    return Preview(
        "waits",
        message,
        code=d.code,
        position=d.position,
        estimated_start=estimate,
        preemptions=preemptions,
    )


def _preempts_for(decisions: Sequence[Any], i: int, candidate_id: str) -> bool:
    """PREEMPT decisions come just before their preemptor's own decision."""
    for d in decisions[i + 1 :]:
        if d.kind != "preempt":
            return bool(d.request_id == candidate_id)
    return False


def _pending_with_positions(
    pending: Sequence[Any], decisions: Sequence[Any]
) -> list[tuple[Any, int]]:
    positions = {d.request_id: d.position for d in decisions if d.kind == "wait"}
    return [(p, positions.get(p.id, 0)) for p in pending]


# ---------------------------------------------------------------------------
# Capacity


def team_hue(name: str) -> int:
    """A stable colour (HSL hue) per team for the capacity map."""
    return int(hashlib.sha1(name.encode()).hexdigest()[:4], 16) % 360


@dataclass
class Cell:
    """One slot of one device as the map draws it."""

    label: str
    status: str  # free, allocated, fragmented, unhealthy, cordoned
    team: str = ""
    request_id: int | None = None
    width: int = 1  # in eighths for MIG, shares for time-slicing
    hue: int = 0


@dataclass
class DeviceView:
    index: int
    model: str
    partitioning: str
    healthy: bool
    health_reason: str
    utilization_pct: int
    memory_used_mib: int
    memory_mib: int
    cells: list[Cell] = field(default_factory=list)


@dataclass
class NodeView:
    node: Node
    devices: list[DeviceView] = field(default_factory=list)


def pool_summaries() -> list[dict[str, Any]]:
    """Per pool: devices, unhealthy, allocated and free GPU milli (three grouped queries)."""
    pools = list(Pool.objects.all())
    devices = {
        r["node__pool_id"]: r
        for r in Device.objects.values("node__pool_id").annotate(
            n=Count("id"),
            unhealthy=Count("id", filter=Q(healthy=False)),
            usable=Count("id", filter=Q(healthy=True, node__ready=True, node__cordoned=False)),
        )
    }
    nodes = {
        r["pool_id"]: r
        for r in Node.objects.values("pool_id").annotate(
            n=Count("id"),
            cordoned=Count("id", filter=Q(cordoned=True)),
            not_ready=Count("id", filter=Q(ready=False)),
        )
    }
    held = dict(
        Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES)
        .values("pool_id")
        .annotate(s=Sum("gpus_milli"))
        .values_list("pool_id", "s")
    )
    out = []
    for p in pools:
        d = devices.get(p.pk, {})
        n = nodes.get(p.pk, {})
        allocated = held.get(p.pk) or 0
        total = d.get("n", 0) * 1000
        out.append(
            {
                "pool": p,
                "nodes": n.get("n", 0),
                "cordoned": n.get("cordoned", 0),
                "not_ready": n.get("not_ready", 0),
                "devices": d.get("n", 0),
                "unhealthy": d.get("unhealthy", 0),
                "total_milli": total,
                "allocated_milli": allocated,
                "free_milli": max(0, d.get("usable", 0) * 1000 - allocated),
            }
        )
    return out


def capacity_nodes(nodes: Sequence[Node]) -> list[NodeView]:
    """Node → device → slot cells for one page of nodes (two queries, whatever the page size)."""
    node_ids = [n.pk for n in nodes]
    by_node: dict[int, list[Device]] = defaultdict(list)
    for d in Device.objects.filter(node_id__in=node_ids).order_by("node_id", "index"):
        by_node[d.node_id].append(d)
    allocs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in Allocation.objects.filter(active=True, device__node_id__in=node_ids).values(
        "device_id",
        "slot",
        "mig_profile",
        "mig_start",
        "mig_size",
        "milli",
        "attempt__request_id",
        "attempt__request__team__name",
    ):
        allocs[a["device_id"]].append(a)
    return [
        NodeView(n, [_device_view(n, d, allocs.get(d.pk, [])) for d in by_node.get(n.pk, [])])
        for n in nodes
    ]


def _device_view(node: Node, d: Device, allocs: list[dict[str, Any]]) -> DeviceView:
    view = DeviceView(
        d.index,
        d.model,
        d.partitioning,
        d.healthy,
        d.health_reason,
        d.utilization_pct,
        d.memory_used_mib,
        d.memory_mib,
    )
    by_slot = {a["slot"]: a for a in allocs}

    def taken(a: dict[str, Any], label: str, width: int = 1) -> Cell:
        team = a["attempt__request__team__name"] or ""
        return Cell(label, "allocated", team, a["attempt__request_id"], width, team_hue(team))

    if d.partitioning == Pool.Partitioning.MIG:
        instances = d.mig_instances or [
            {"profile": a["mig_profile"], "start": a["mig_start"], "size": a["mig_size"]}
            for a in allocs
            if a["mig_start"] >= 0
        ]
        seen = set()
        for inst in sorted(instances, key=lambda m: int(m["start"])):
            key = int(inst["start"])
            if key in seen:
                continue
            seen.add(key)
            a = by_slot.get(f"m{key}")
            width = int(inst.get("size", 1))
            view.cells.append(
                taken(a, inst["profile"], width)
                if a
                else Cell(inst["profile"], "free", width=width)
            )
    elif d.partitioning == Pool.Partitioning.TIME_SLICING:
        for k in range(max(1, d.replicas)):
            a = by_slot.get(f"s{k}")
            label = f"{a['milli']}m" if a else f"s{k}"
            view.cells.append(taken(a, label) if a else Cell(label, "free"))
    else:
        a = by_slot.get("gpu")
        view.cells.append(taken(a, "GPU") if a else Cell("GPU", "free"))
    partly_used = any(c.status == "allocated" for c in view.cells)
    for c in view.cells:
        if c.status != "free":
            continue
        if not d.healthy:
            c.status = "unhealthy"
        elif node.cordoned or not node.ready:
            c.status = "cordoned"
        elif partly_used:
            # Free, but next to someone else's work: no whole-device request can use it.
            c.status = "fragmented"
    if not d.healthy:
        for c in view.cells:
            if c.status == "allocated":
                c.status = "unhealthy"
    return view


# ---------------------------------------------------------------------------
# Teams


@dataclass
class PoolUsage:
    pool: Pool
    quota: Quota | None
    used_milli: int
    borrowed_milli: int
    lent_milli: int

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
    quotas = list(Quota.objects.select_related("pool"))
    by_key = {(q.team_id, q.pool_id): q for q in quotas}
    pools = {q.pool_id: q.pool for q in quotas}
    extra = Pool.objects.all() if all_pools else Pool.objects.filter(pk__in={p for _, p in used})
    pools.update({p.pk: p for p in extra})
    team_ids = {t for t, _ in used} | {q.team_id for q in quotas}
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


def led_teams(user: AnyUser) -> QuerySet[Team]:
    if access.is_admin(user):
        return Team.objects.all()
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user, memberships__role=Membership.Role.LEAD)


# ---------------------------------------------------------------------------
# Logs


def decision_list(
    user: AnyUser,
    *,
    team: Team | None = None,
    request_id: int | None = None,
    node: str = "",
    kind: str = "",
) -> QuerySet[Decision]:
    """Decisions the user may see (their teams'; everything for admins), newest first."""
    qs = Decision.objects.select_related("team", "pool")
    if not access.is_admin(user):
        qs = qs.filter(team__in=access.teams_for(user))
    if team is not None:
        qs = qs.filter(team=team)
    if request_id is not None:
        qs = qs.filter(request_id=request_id)
    if node:
        qs = qs.filter(node__contains=node)
    if kind:
        qs = qs.filter(kind=kind)
    # Ids grow with time: "-id" is newest first and lets deep pages walk the primary key.
    return qs.order_by("-id")


def audit_list(
    *, team: Team | None = None, action: str = "", actor: str = ""
) -> QuerySet[AuditEvent]:
    """The audit log, newest first (admin-only; leads see their team's through `team`)."""
    qs = AuditEvent.objects.select_related("team")
    if team is not None:
        qs = qs.filter(team=team)
    if action:
        qs = qs.filter(action=action)
    if actor:
        qs = qs.filter(actor_name=actor)
    return qs.order_by("-created_at", "-id")
