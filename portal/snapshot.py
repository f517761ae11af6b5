"""The tick's snapshot: the database read into frozen `scheduling.types` data.

Plus a `Context` that lets the apply step find rows again from snapshot ids.
Reads only: the preview builds it outside the tick lock, so nothing here may write
(member rules are the core's, `scheduling.members`; the apply step writes).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q

from portal import shapes
from portal.models import (
    DEVICE_FAULTS,
    Allocation,
    Attempt,
    Device,
    GpuRequest,
    Membership,
    Node,
    Pool,
    Quota,
    ShapeHistory,
    Team,
    UsageRecord,
    WorkloadClass,
    heartbeat_stale_before,
)
from scheduling import types as st
from scheduling import usage_decay, workload


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


@dataclass
class Context:
    """What the apply step needs to find rows again from snapshot ids."""

    now: datetime
    requests: dict[str, GpuRequest]
    devices: dict[tuple[str, int], Device]
    active_slots: dict[int, set[str]]
    attempts: dict[str, Attempt]
    pools: dict[str, Pool]


def _device(d: Device, now: datetime, held: bool = False) -> st.Device:
    migs = tuple(
        st.MigInstance(m["profile"], int(m["start"]), int(m["size"])) for m in d.mig_instances
    )
    return st.Device(
        index=d.index,
        model=d.model,
        memory_mib=d.memory_mib,
        partitioning=st.Partitioning(d.partitioning),
        replicas=d.replicas,
        mig_instances=migs,
        # The usable-device rule (Device.condition): faults of the device itself make it
        # unhealthy here; its node's (stale, not ready, cordoned) go on the node below.
        # Memory held by a process the portal did not place there: not free, whatever the books say.
        healthy=d.condition(now) not in DEVICE_FAULTS and (held or not d.processes),
    )


def build_snapshot(now: datetime) -> tuple[st.Snapshot, Context]:
    pools = {p.name: p for p in Pool.objects.all()}
    stale_before = heartbeat_stale_before(now)
    devices_by_node: dict[int, list[Device]] = defaultdict(list)
    for d in Device.objects.order_by("node_id", "index"):
        devices_by_node[d.node_id].append(d)
    nodes: list[st.Node] = []
    devices: dict[tuple[str, int], Device] = {}
    held = set(Allocation.objects.filter(active=True).values_list("device_id", flat=True))
    for n in Node.objects.select_related("pool").order_by("name"):
        stale = n.last_heartbeat is not None and n.last_heartbeat < stale_before
        for d in devices_by_node[n.id]:
            d.node = n
            devices[(n.name, d.index)] = d
        nodes.append(
            st.Node(
                name=n.name,
                pool=n.pool.name,
                cpu_milli=n.cpu_milli,
                memory_mib=n.memory_mib,
                devices=tuple(_device(d, now, d.pk in held) for d in devices_by_node[n.id]),
                labels=tuple(sorted((k, str(v)) for k, v in n.labels.items())),
                taints=shapes.taints(n.taints),
                ready=n.ready and not stale,
                cordoned=n.cordoned,
                interconnect=n.interconnect,
            )
        )

    running, attempts, active_slots = _running(devices)
    pending_rows = list(
        GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
        .filter(Q(requeue_at__isnull=True) | Q(requeue_at__lte=now))
        .select_related("team", "workload_class", "pool")
        .order_by("created_at", "id")
    )
    queued = {str(r.pk): r for r in pending_rows}
    pending = []
    for r in pending_rows:
        candidate = [pools[r.pool.name]] if r.pool else list(pools.values())
        pending.append(
            st.PendingRequest(
                id=str(r.pk),
                team=r.team.name,
                workload_class=r.workload_class.name,
                shape=shapes.request_shape(r, shapes.tolerations(candidate)),
                created_at_ms=_ms(r.created_at),
                pool=r.pool.name if r.pool else "",
                priority=r.priority,
                attempts=r.requeue_count,
                # the room its victims free is kept for it (scheduling.queue.request_key)
                preempting=r.status_code in ("preempting", "awaiting-stop"),
                user=str(r.submitted_by_id),
            )
        )
    snapshot = st.Snapshot(
        now_ms=_ms(now),
        pools=tuple(
            st.Pool(
                p.name,
                st.Partitioning(p.partitioning),
                st.Lifecycle(p.lifecycle),
                p.inference_floor_milli,
            )
            for p in pools.values()
        ),
        nodes=tuple(nodes),
        running=tuple(running),
        pending=tuple(pending),
        teams=tuple(st.Team(t.name, t.weight) for t in Team.objects.all()),
        quotas=tuple(
            st.Quota(
                q.team.name,
                q.pool.name,
                q.nominal_milli,
                q.borrowing_limit_milli,
                q.lending_limit_milli,
            )
            for q in Quota.objects.select_related("team", "pool")
        ),
        classes=tuple(
            st.WorkloadClass(
                c.name,
                c.band,
                st.PreemptionPolicy(c.preemption),
                c.min_runtime_s,
                c.max_queue_s,
                c.inference,
            )
            for c in WorkloadClass.objects.all()
        ),
        usage=tuple(_usage(now)),
        members=_members({r.team_id for r in pending_rows}),
        workloads=_workloads(),
    )
    ctx = Context(
        now=now,
        requests=queued,
        devices=devices,
        active_slots=active_slots,
        attempts=attempts,
        pools=pools,
    )
    return snapshot, ctx


def _workloads() -> tuple[st.PoolWorkload, ...]:
    """Each pool's shape history: FGD's target workload (a pool without one: its prior)."""
    return tuple(
        workload.ShapeHistory.from_dict(histogram).to_workload(pool)
        for pool, histogram in ShapeHistory.objects.order_by("pool__name").values_list(
            "pool__name", "histogram"
        )
    )


def _members(team_ids: set[int]) -> tuple[st.Member, ...]:
    """Members of the teams with pending requests, with their caps: the core applies them."""
    return tuple(
        st.Member(team, str(user_id), cap)
        for team, user_id, cap in Membership.objects.filter(team_id__in=team_ids)
        .order_by("team__name", "user_id")
        .values_list("team__name", "user_id", "gpu_cap_milli")
    )


def _running(
    devices: dict[tuple[str, int], Device],
) -> tuple[list[st.Running], dict[str, Attempt], dict[int, set[str]]]:
    by_id = {d.pk: (name, idx) for (name, idx), d in devices.items()}
    attempts = {
        str(a.pk): a
        for a in Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES).select_related(
            "request__team", "request__workload_class", "pool"
        )
    }
    grants: dict[int, dict[tuple[str, int, int], st.DeviceGrant]] = defaultdict(dict)
    active_slots: dict[int, set[str]] = defaultdict(set)
    for a in Allocation.objects.filter(active=True).order_by("id"):
        active_slots[a.device_id].add(a.slot)
        node, idx = by_id.get(a.device_id, ("", -1))
        mig = st.MigInstance(a.mig_profile, a.mig_start, a.mig_size) if a.mig_profile else None
        grants[a.attempt_id].setdefault(
            (node, idx, a.mig_start),
            st.DeviceGrant(node, idx, a.milli if mig is None else 0, a.gpu_memory_mib, mig),
        )
    running = []
    for aid, att in attempts.items():
        req = att.request
        per_node: dict[str, list[st.DeviceGrant]] = defaultdict(list)
        for (node, _, _), g in sorted(grants[att.pk].items()):
            per_node[node].append(g)
        placement = st.Placement(
            tuple(
                st.PodPlacement(n, tuple(gs), req.cpu_milli, req.memory_mib)
                for n, gs in sorted(per_node.items())
            )
        )
        # Expected end for reservations (EASY backfilling): the user's estimate, never past
        # the hard limit when one is set; None (the rule without estimates) when neither.
        limits = [s for s in (req.estimated_runtime_s, req.max_runtime_s) if s]
        begun = att.started_at or att.admitted_at
        expected_end_ms = _ms(begun) + min(limits) * 1000 if limits else None
        running.append(
            st.Running(
                request_id=str(req.pk),
                attempt_id=aid,
                team=req.team.name,
                workload_class=req.workload_class.name,
                pool=att.pool.name,
                shape=shapes.request_shape(req),
                placement=placement,
                started_at_ms=_ms(att.started_at or att.admitted_at),
                last_checkpoint_ms=_ms(att.last_checkpoint_at) if att.last_checkpoint_at else None,
                priority=req.priority,
                stopping=att.state == Attempt.State.STOPPING,
                admitted_by_preemption=att.admitted_by_preemption,
                expected_end_ms=expected_end_ms,
                user=str(req.submitted_by_id),
            )
        )
    return running, attempts, active_slots


def _usage(now: datetime) -> list[st.TeamUsage]:
    """GPU milli-seconds per team, each record decayed by the configured half-life."""
    half_life = st.Policy().usage_half_life_s
    now_ms = _ms(now)
    horizon = now - timedelta(seconds=half_life * 8)
    totals: dict[str, int] = defaultdict(int)
    records = UsageRecord.objects.filter(charged=True).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gte=horizon)
    )
    for u in records.select_related("team"):
        end_ms = _ms(u.ended_at) if u.ended_at else now_ms
        totals[u.team.name] += usage_decay.interval_usage(
            u.gpus_milli, _ms(u.started_at), end_ms, now_ms, half_life
        )
    return [st.TeamUsage(team, v) for team, v in sorted(totals.items())]
