"""Read queries for pages and the API: lists, the queue, the capacity map, team usage.

Nothing here writes. Every list is scoped by the caller through `portal.access`
(or is admin-only, checked in the view); every page-sized query is bounded and
fetches related rows up front so that a page costs a fixed number of queries.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Max, Min, Q, QuerySet, Sum
from django.utils import timezone

from portal import access, capacity
from portal.access import AnyUser
from portal.models import (
    DEVICE_FAULTS,
    Allocation,
    Attempt,
    AuditEvent,
    Decision,
    Device,
    DeviceCondition,
    DeviceProfile,
    GpuRequest,
    Membership,
    Node,
    NodeProvision,
    PolicyVersion,
    Pool,
    Quota,
    Team,
    WorkloadClass,
    heartbeat_stale_before,
    usable_q,
)

# ---------------------------------------------------------------------------
# Requests and the queue


def request_list(
    user: AnyUser,
    *,
    mine: bool = False,
    team: Team | None = None,
    state: str = "",
    workload_class: WorkloadClass | None = None,
    q: str = "",
    with_counts: bool = True,
) -> QuerySet[GpuRequest]:
    """Requests the user may see, newest first; `mine` keeps only the user's own.

    `q` searches the name and image (and matches a request number). With `with_counts`
    each row carries `attempt_count`; pages that paginate thousands of rows pass False
    and call `request_attempt_facts()` on the page's rows instead (a grouped count
    under the paginator's COUNT costs a scan per page view).
    """
    qs = access.requests_visible(user)
    if mine:
        qs = qs.filter(submitted_by=user)  # type: ignore[misc]
    if team is not None:
        qs = qs.filter(team=team)
    if state:
        qs = qs.filter(state=state)
    if workload_class is not None:
        qs = qs.filter(workload_class=workload_class)
    if q:
        match = Q(name__icontains=q) | Q(image__icontains=q)
        if q.lstrip("#").isdigit():
            match |= Q(pk=int(q.lstrip("#")))
        qs = qs.filter(match)
    if with_counts:
        qs = qs.annotate(attempt_count=Count("attempts"))
    return qs.order_by("-created_at", "-id")


def request_attempt_facts(rows: Sequence[GpuRequest]) -> None:
    """Set `attempt_count`, `first_started` and `last_ended` on a page of requests: one query."""
    facts = {
        f["request_id"]: f
        for f in Attempt.objects.filter(request_id__in=[r.pk for r in rows])
        .values("request_id")
        .annotate(n=Count("id"), first=Min("started_at"), last=Max("ended_at"))
    }
    for r in rows:
        f = facts.get(r.pk, {})
        r.attempt_count = f.get("n", 0)  # type: ignore[attr-defined]
        r.first_started = f.get("first")  # type: ignore[attr-defined]
        r.last_ended = f.get("last")  # type: ignore[attr-defined]


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


def pending_demand(user: AnyUser) -> list[dict[str, Any]]:
    """Pending demand of the requests `user` may see, per pool and device profile, with
    the nodes each autoscaled pool is waiting for."""
    pending = access.requests_visible(user).filter(state=GpuRequest.State.PENDING)
    rows = capacity.pending_demand(pending)
    waiting = dict(
        NodeProvision.objects.filter(state=NodeProvision.State.REQUESTED)
        .values_list("pool__name")
        .annotate(n=Sum("nodes"))
        .order_by()
    )
    for r in rows:
        r["provisioning_nodes"] = waiting.get(r["pool"], 0)
    return rows


def policy_versions() -> QuerySet[PolicyVersion]:
    """Applied policy changes, newest first (admins and auditors: the caller checks)."""
    return PolicyVersion.objects.order_by("-number")


def request_wait_split(req: GpuRequest) -> list[tuple[str, int]]:
    """Where the request's wait went, in seconds by reason (portal/capacity.py)."""
    split = capacity.split(req, timezone.now())
    return [(reason, split[reason]) for reason in capacity.REASONS]


# ---------------------------------------------------------------------------
# Device profiles


def offered_profiles(pool: Pool | None = None) -> QuerySet[DeviceProfile]:
    """Device profiles some pool really offers (the named one, or any production pool)."""
    pools = Pool.offering(pool)
    offered = [
        p.pk
        for p in DeviceProfile.objects.all()
        if any(x.offers(p.kind, p.mig_profile) for x in pools)
    ]
    return DeviceProfile.objects.filter(pk__in=offered).order_by("kind", "name")


# ---------------------------------------------------------------------------
# Capacity


def team_hue(name: str) -> int:
    """A stable colour (HSL hue) per team for the capacity map."""
    return int(hashlib.sha1(name.encode()).hexdigest()[:4], 16) % 360


@dataclass
class Cell:
    """One slot of one device as the map draws it."""

    label: str
    status: str  # free, allocated, fragmented, quarantined, unhealthy, stale, cordoned
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
    #: DeviceCondition value: usable, quarantined, unhealthy, stale, not_ready, cordoned
    condition: str = "usable"
    quarantined: bool = False
    pk: int = 0


@dataclass
class NodeView:
    node: Node
    devices: list[DeviceView] = field(default_factory=list)


def _slot_milli(slot: str, replicas: int) -> int:
    """GPU milli one Allocation slot stands for (see Allocation's docstring)."""
    if slot.startswith("m"):
        return 1000 // 8
    if slot.startswith("s"):
        return 1000 // max(1, replicas)
    return 1000


def pool_summaries(now: datetime | None = None) -> list[dict[str, Any]]:
    """Per pool: devices by condition, allocated and free GPU milli (four grouped queries).

    Free counts usable devices only (`Device.objects.usable`, the one rule the
    tick and the metrics use too): a quarantined, unhealthy or stale device, or
    one on a cordoned node, is never free.
    """
    now = now or timezone.now()
    pools = list(Pool.objects.all())
    devices = {
        r["node__pool_id"]: r
        for r in Device.objects.values("node__pool_id").annotate(
            n=Count("id"),
            # n_-prefixed: an annotation named like a field would shadow it in the filters.
            n_quarantined=Count("id", filter=Q(quarantined=True)),
            n_unhealthy=Count(
                "id", filter=Q(quarantined=False) & (Q(healthy=False) | Q(agent_healthy=False))
            ),
            n_stale=Count("id", filter=Q(node__last_heartbeat__lt=heartbeat_stale_before(now))),
            n_usable=Count("id", filter=usable_q(now)),
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
    taken_on_usable: dict[int, int] = defaultdict(int)
    for pool_id, slot, replicas in Allocation.objects.filter(
        usable_q(now, "device__"), active=True
    ).values_list("device__node__pool_id", "slot", "device__replicas"):
        taken_on_usable[pool_id] += _slot_milli(slot, replicas)
    out = []
    for p in pools:
        d = devices.get(p.pk, {})
        n = nodes.get(p.pk, {})
        total = d.get("n", 0) * 1000
        out.append(
            {
                "pool": p,
                "nodes": n.get("n", 0),
                "cordoned": n.get("cordoned", 0),
                "not_ready": n.get("not_ready", 0),
                "devices": d.get("n", 0),
                "quarantined": d.get("n_quarantined", 0),
                "unhealthy": d.get("n_unhealthy", 0),
                "stale": d.get("n_stale", 0),
                "usable": d.get("n_usable", 0),
                "total_milli": total,
                "allocated_milli": held.get(p.pk) or 0,
                "free_milli": max(0, d.get("n_usable", 0) * 1000 - taken_on_usable[p.pk]),
            }
        )
    return out


def capacity_nodes(nodes: Sequence[Node], now: datetime | None = None) -> list[NodeView]:
    """Node → device → slot cells for one page of nodes (two queries, whatever the page size)."""
    now = now or timezone.now()
    node_ids = [n.pk for n in nodes]
    by_id = {n.pk: n for n in nodes}
    by_node: dict[int, list[Device]] = defaultdict(list)
    for d in Device.objects.filter(node_id__in=node_ids).order_by("node_id", "index"):
        d.node = by_id[d.node_id]
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
        NodeView(n, [_device_view(d, allocs.get(d.pk, []), now) for d in by_node.get(n.pk, [])])
        for n in nodes
    ]


def _device_view(d: Device, allocs: list[dict[str, Any]], now: datetime) -> DeviceView:
    condition = d.condition(now)
    view = DeviceView(
        d.index,
        d.model,
        d.partitioning,
        condition not in DEVICE_FAULTS,
        d.health_reason,
        d.utilization_pct,
        d.memory_used_mib,
        d.memory_mib,
        condition=str(condition),
        quarantined=d.quarantined,
        pk=d.pk,
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
    # The usable-device rule decides: a device that may not take work has no free cell.
    unusable = {
        DeviceCondition.QUARANTINED: "quarantined",
        DeviceCondition.UNHEALTHY: "unhealthy",
        DeviceCondition.STALE: "stale",
        DeviceCondition.NOT_READY: "cordoned",
        DeviceCondition.CORDONED: "cordoned",
    }.get(condition)
    for c in view.cells:
        if c.status == "free":
            if unusable is not None:
                c.status = unusable
            elif partly_used:
                # Free, but next to someone else's work: no whole-device request can use it.
                c.status = "fragmented"
        elif condition in DEVICE_FAULTS:
            # Still held by work that runs on a faulty device: drawn as the fault.
            c.status = unusable or c.status
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
    if not access.sees_all(user):
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
    *,
    team: Team | None = None,
    action: str = "",
    actor: str = "",
    q: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """The audit log, newest first (admin-only; leads see their team's through `team`).

    `q` is free text: it matches who, the action (its code or its words), the team, the
    reason, the values before and after, and the names of pools, nodes, classes and users.
    `since`/`until` bound the time (until is exclusive).
    """
    qs = AuditEvent.objects.select_related("team")
    if team is not None:
        qs = qs.filter(team=team)
    if action:
        qs = qs.filter(action=action)
    if actor:
        qs = qs.filter(actor_name=actor)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lt=until)
    if q:
        qs = qs.filter(_audit_text(q))
    return qs.order_by("-created_at", "-id")


def _audit_text(q: str) -> Q:
    """Events whose words mention `q`: a few queries for the named objects, none per event."""
    from django.contrib.auth import get_user_model

    from portal.audit_words import ACTIONS

    match = (
        Q(actor_name__icontains=q)
        | Q(action__icontains=q)
        | Q(action__in=[a for a, words in ACTIONS.items() if q.lower() in words])
        | Q(team__name__icontains=q)
        | Q(reason__icontains=q)
        | Q(before__icontains=q)
        | Q(after__icontains=q)
    )
    pools = list(Pool.objects.filter(name__icontains=q).values_list("pk", flat=True))
    named = {
        "pool": pools,
        "node": list(
            Node.objects.filter(Q(name__icontains=q) | Q(pool__in=pools)).values_list(
                "pk", flat=True
            )
        ),
        "quota": list(Quota.objects.filter(pool__in=pools).values_list("pk", flat=True)),
        "workloadclass": list(
            WorkloadClass.objects.filter(name__icontains=q).values_list("pk", flat=True)
        ),
        "user": list(
            get_user_model().objects.filter(username__icontains=q).values_list("pk", flat=True)
        ),
    }
    for object_type, ids in named.items():
        if ids:
            match |= Q(object_type=object_type, object_id__in=[str(i) for i in ids])
    return match


@dataclass
class LogView:
    """What the request page shows of its latest attempt's log."""

    attempt: Attempt | None
    text: str
    #: read from the running workload now (else the lines kept when it ended)
    live: bool
    events: list[Any] = field(default_factory=list)


#: lines the request page shows; the download has up to LOG_DOWNLOAD_LINES
LOG_PAGE_LINES = 200
LOG_DOWNLOAD_LINES = 10_000


def request_logs(
    req: GpuRequest, *, tail_lines: int = LOG_PAGE_LINES, events: bool = True
) -> LogView:
    """The latest attempt's log tail and events: from the backend while the attempt is
    active (or, for a download, while the backend still has it), else the stored tail."""
    from portal.backends import get_backend

    attempt = req.attempts.order_by("-number").first()
    if attempt is None:
        return LogView(None, "", live=False)
    backend = get_backend()
    pods = max(1, len(attempt.nodes))
    active = attempt.state in Attempt.ACTIVE_STATES
    text = ""
    if active or tail_lines > LOG_PAGE_LINES:
        try:
            text = backend.logs(attempt.workload_name, attempt.namespace, tail_lines, pods)
        except Exception:  # noqa: BLE001 - an unreachable cluster shows no log, not a 500
            text = ""
    if not text and not active:
        text = attempt.log_tail
    found: list[Any] = []
    if events:
        try:
            found = backend.events(attempt.workload_name, attempt.namespace, pods)
        except Exception:  # noqa: BLE001
            found = []
    return LogView(attempt, text, live=active, events=found)
