"""The scheduling tick: lock, snapshot, `scheduling.schedule()`, apply, then call the backend.

Compute, then apply: `scheduling/` sees frozen plain data and returns
decisions; everything that writes happens here, in one transaction.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

import scheduling
from portal import services
from portal.metrics import tick_bucket
from portal.models import (
    Allocation,
    Attempt,
    Decision,
    Device,
    GpuRequest,
    Membership,
    Node,
    Pool,
    Quota,
    SchedulerState,
    Team,
    UsageRecord,
    WorkloadClass,
)
from scheduling import types as st
from scheduling import usage_decay

log = logging.getLogger(__name__)

# Any 64-bit number unique to this application.
TICK_LOCK_KEY = 0x51_4D_54_49_43_4B  # "QMTICK"
LEASE = timedelta(seconds=120)


@dataclass
class TickResult:
    ran: bool
    decisions: int = 0
    admitted: int = 0
    preempted: int = 0
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


# ---------------------------------------------------------------------------
# Snapshot


@dataclass
class Context:
    """What the apply step needs to find rows again from snapshot ids."""

    now: datetime
    requests: dict[str, GpuRequest]
    devices: dict[tuple[str, int], Device]
    active_slots: dict[int, set[str]]
    attempts: dict[str, Attempt]
    pools: dict[str, Pool]
    #: decisions the portal makes itself, before the core sees the queue (member caps)
    held_back: list[st.Decision] = field(default_factory=list)


def _device(d: Device, pool: Pool, held: bool = False) -> st.Device:
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
        # Memory held by a process the portal did not place there: not free, whatever the books say.
        healthy=d.usable and (held or not d.processes),
    )


def _taints(raw: list[dict[str, str]]) -> tuple[st.Taint, ...]:
    return tuple(st.Taint(t["key"], t.get("value", ""), t.get("effect", "NoSchedule")) for t in raw)


def request_shape(r: GpuRequest) -> st.Shape:
    return st.Shape(
        kind=st.ProfileKind(r.profile_kind),
        count=r.count,
        milli=r.milli,
        gpu_memory_mib=r.gpu_memory_mib,
        mig_profile=r.mig_profile,
        cpu_milli=r.cpu_milli,
        memory_mib=r.memory_mib,
        # A request tolerates the taints of the pool it names, or of any pool that offers its profile.
        tolerations=(),
        pods=r.pods,
    )


def build_snapshot(now: datetime) -> tuple[st.Snapshot, Context]:
    pools = {p.name: p for p in Pool.objects.all()}
    stale_before = now - timedelta(seconds=settings.HEARTBEAT_STALE_SECONDS)
    devices_by_node: dict[int, list[Device]] = defaultdict(list)
    for d in Device.objects.order_by("node_id", "index"):
        devices_by_node[d.node_id].append(d)
    nodes: list[st.Node] = []
    devices: dict[tuple[str, int], Device] = {}
    held = set(Allocation.objects.filter(active=True).values_list("device_id", flat=True))
    for n in Node.objects.select_related("pool").order_by("name"):
        stale = n.last_heartbeat is not None and n.last_heartbeat < stale_before
        for d in devices_by_node[n.id]:
            devices[(n.name, d.index)] = d
        nodes.append(
            st.Node(
                name=n.name,
                pool=n.pool.name,
                cpu_milli=n.cpu_milli,
                memory_mib=n.memory_mib,
                devices=tuple(_device(d, n.pool, d.pk in held) for d in devices_by_node[n.id]),
                labels=tuple(sorted((k, str(v)) for k, v in n.labels.items())),
                taints=_taints(n.taints),
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
    pending_rows, held_back = _apply_member_rules(pending_rows, now)
    pending = []
    for r in pending_rows:
        shape = request_shape(r)
        # Requests tolerate the taints of the pools that may serve them: taints keep
        # other workloads off a pool, they are not a barrier for the pool's own users.
        candidate = [pools[r.pool.name]] if r.pool else list(pools.values())
        tolerations = tuple({t for p in candidate for t in _taints(p.taints)})
        pending.append(
            st.PendingRequest(
                id=str(r.pk),
                team=r.team.name,
                workload_class=r.workload_class.name,
                shape=st.Shape(**{**_shape_kwargs(shape), "tolerations": tolerations}),
                created_at_ms=_ms(r.created_at),
                pool=r.pool.name if r.pool else "",
                priority=r.priority,
                attempts=r.requeue_count,
                # the room its victims free is kept for it (scheduling.queue.request_key)
                preempting=r.status_code in ("preempting", "awaiting-stop"),
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
    )
    ctx = Context(
        now=now,
        requests=queued,
        devices=devices,
        active_slots=active_slots,
        attempts=attempts,
        pools=pools,
        held_back=held_back,
    )
    return snapshot, ctx


def _apply_member_rules(
    rows: list[GpuRequest], now: datetime
) -> tuple[list[GpuRequest], list[st.Decision]]:
    """Membership decides, before the core sees the queue.

    1. A request whose submitter has left its team is cancelled, with an audit row.
    2. A request that would take its submitter past their cap in the team waits
       (oldest first; requests kept this tick count as held, so a cap is never exceeded).
    Returns the requests the core may schedule and the WAIT decisions for the others.
    """
    members = {
        (m.user_id, m.team_id): m
        for m in Membership.objects.filter(team_id__in={r.team_id for r in rows})
    }
    holding: dict[tuple[int, int], int] = defaultdict(int)
    capped = {key for key, m in members.items() if m.gpu_cap_milli is not None}
    if capped:
        active = Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES).values_list(
            "request__submitted_by_id", "request__team_id", "gpus_milli"
        )
        for user_id, team_id, milli in active:
            holding[(user_id, team_id)] += milli
    keep: list[GpuRequest] = []
    waits: list[st.Decision] = []
    for r in rows:
        m = members.get((r.submitted_by_id, r.team_id))
        if m is None:
            _cancel_orphan(r, now)
            continue
        key = (r.submitted_by_id, r.team_id)
        if m.gpu_cap_milli is not None and holding[key] + r.gpus_milli > m.gpu_cap_milli:
            message = (
                f"waiting: your cap in team {r.team.name} is {m.gpu_cap_milli / 1000:g} GPUs "
                f"and you hold {holding[key] / 1000:g}; this request needs {r.gpus_milli / 1000:g} more"
            )
            waits.append(
                st.Decision(
                    st.DecisionKind.WAIT,
                    str(r.pk),
                    "member-cap",
                    message,
                    facts={"cap_milli": m.gpu_cap_milli, "holding_milli": holding[key]},
                )
            )
            continue
        # Counted as if admitted: the core may admit every kept request this tick.
        holding[key] += r.gpus_milli
        keep.append(r)
    return keep, waits


def _cancel_orphan(r: GpuRequest, now: datetime) -> None:
    reason = "cancelled: the submitter is no longer a member of the team"
    GpuRequest.objects.filter(pk=r.pk, state=GpuRequest.State.PENDING).update(
        state=GpuRequest.State.CANCELLED,
        end_reason=reason,
        status_code="not-a-member",
        status_message=reason,
        queue_position=None,
        updated_at=now,
    )
    Decision.objects.create(
        request=r, team=r.team, kind=Decision.Kind.END, code="not-a-member", message=reason
    )
    services.audit(
        actor=None,
        action="request.cancel",
        obj=r,
        team=r.team,
        before={"state": "pending"},
        after={"state": "cancelled", "reason": reason},
    )


def _shape_kwargs(shape: st.Shape) -> dict[str, Any]:
    return {f: getattr(shape, f) for f in shape.__dataclass_fields__}


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
                shape=request_shape(req),
                placement=placement,
                started_at_ms=_ms(att.started_at or att.admitted_at),
                last_checkpoint_ms=_ms(att.last_checkpoint_at) if att.last_checkpoint_at else None,
                priority=req.priority,
                stopping=att.state == Attempt.State.STOPPING,
                admitted_by_preemption=att.admitted_by_preemption,
                expected_end_ms=expected_end_ms,
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


# ---------------------------------------------------------------------------
# Apply


def _slots(device: Device, grant: st.DeviceGrant, taken: set[str]) -> list[str]:
    """The Allocation slots a grant occupies on a device (see Allocation's docstring)."""
    if grant.mig is not None:
        return [f"m{i}" for i in range(grant.mig.start, grant.mig.start + grant.mig.size)]
    if device.partitioning == "time-slicing":
        shares = [f"s{k}" for k in range(device.replicas)]
        if grant.milli >= 1000:
            return shares
        free = [s for s in shares if s not in taken]
        return free[:1] or ["s-overbooked"]
    return ["gpu"]


def _admit(d: st.Decision, ctx: Context, tick_no: int) -> bool:
    req = ctx.requests[d.request_id]
    assert d.placement is not None
    claimed = GpuRequest.objects.filter(pk=req.pk, state=GpuRequest.State.PENDING).update(
        state=GpuRequest.State.ADMITTED,
        status_code="admitted",
        status_message=d.message,
        queue_position=None,
        escalated=False,
        estimated_start=None,
        updated_at=ctx.now,
    )
    if claimed != 1:
        # Cancelled since the snapshot: nothing to do.
        return False
    pool = ctx.pools[d.pool]
    number = req.attempts.count() + 1
    try:
        with transaction.atomic():
            attempt = Attempt.objects.create(
                request=req,
                number=number,
                pool=pool,
                nodes=list(d.placement.nodes),
                workload_name=f"qm-{req.pk}-{number}",
                namespace=req.team.namespace,
                gpus_milli=req.gpus_milli,
                borrowing=d.borrowing,
                # The request's last decision said it waited for preempted attempts to stop.
                admitted_by_preemption=req.status_code == "preempting",
                admitted_at=ctx.now,
            )
            rows = []
            for pod in d.placement.pods:
                for g in pod.grants:
                    device = ctx.devices[(pod.node, g.device)]
                    taken = ctx.active_slots[device.pk]
                    for slot in _slots(device, g, taken):
                        taken.add(slot)
                        rows.append(
                            Allocation(
                                attempt=attempt,
                                device=device,
                                slot=slot,
                                milli=g.milli if g.mig is None else 0,
                                gpu_memory_mib=g.gpu_memory_mib,
                                mig_profile=g.mig.profile if g.mig else "",
                                mig_start=g.mig.start if g.mig else -1,
                                mig_size=g.mig.size if g.mig else 0,
                            )
                        )
            Allocation.objects.bulk_create(rows)
            UsageRecord.objects.create(
                attempt=attempt,
                team=req.team,
                workload_class=req.workload_class,
                pool=pool,
                gpus_milli=req.gpus_milli,
                started_at=ctx.now,
            )
    except IntegrityError:
        # The database refused a double booking: the request waits for the next tick.
        log.error("tick %s: allocation conflict for request %s; left pending", tick_no, req.pk)
        GpuRequest.objects.filter(pk=req.pk).update(
            state=GpuRequest.State.PENDING,
            status_code="conflict",
            status_message="waiting: placement conflict, retrying",
        )
        return False
    Decision.objects.create(
        tick=tick_no,
        request=req,
        attempt=attempt,
        team=req.team,
        pool=pool,
        node=",".join(d.placement.nodes),
        kind=Decision.Kind.ADMIT,
        code=d.code,
        message=d.message,
        facts=_facts(d),
    )
    attempt_id = attempt.pk
    transaction.on_commit(lambda: launch_attempt(attempt_id))
    return True


def launch_attempt(attempt_id: int) -> None:
    attempt = Attempt.objects.select_related(
        "request__team", "request__workload_class", "pool"
    ).get(pk=attempt_id)
    services.backend_call("launch", services.launch_spec(attempt))


def _facts(d: st.Decision) -> dict[str, Any]:
    out = {
        k: v
        for k, v in dict(d.facts).items()
        if isinstance(v, str | int | float | bool | list | dict | type(None))
    }
    if d.escalated:
        out["escalated"] = True
    if d.borrowing:
        out["borrowing"] = True
    return out


def _wait(d: st.Decision, ctx: Context, tick_no: int, changed: list[GpuRequest]) -> None:
    req = ctx.requests[d.request_id]
    new_message = d.message[:500]
    estimate = d.facts.get("estimated_start_ms") if d.facts else None
    estimated_start = (
        datetime.fromtimestamp(int(estimate) / 1000, tz=ctx.now.tzinfo)
        if isinstance(estimate, int)
        else None
    )
    if (req.status_code, req.status_message) != (d.code, new_message):
        # The decision log records changes of reason, not every tick's repetition.
        Decision.objects.create(
            tick=tick_no,
            request=req,
            team=req.team,
            kind=Decision.Kind.WAIT,
            code=d.code,
            message=new_message,
            facts=_facts(d),
        )
    fields = (d.code, new_message, d.position or None, d.escalated, estimated_start)
    if (
        req.status_code,
        req.status_message,
        req.queue_position,
        req.escalated,
        req.estimated_start,
    ) != fields:
        (
            req.status_code,
            req.status_message,
            req.queue_position,
            req.escalated,
            req.estimated_start,
        ) = fields
        changed.append(req)


def _preempt(d: st.Decision, ctx: Context, tick_no: int) -> bool:
    attempt = ctx.attempts.get(d.attempt_id)
    if attempt is None or attempt.state not in (Attempt.State.ADMITTED, Attempt.State.RUNNING):
        return False
    services.attempt_stop(attempt, reason="preempted")
    req = attempt.request
    Decision.objects.create(
        tick=tick_no,
        request=req,
        attempt=attempt,
        team=req.team,
        pool=attempt.pool,
        node=",".join(attempt.nodes),
        kind=Decision.Kind.PREEMPT,
        code=d.code,
        message=d.message[:500],
        facts=_facts(d),
    )
    return True


def _reject(d: st.Decision, ctx: Context, tick_no: int) -> None:
    req = ctx.requests[d.request_id]
    GpuRequest.objects.filter(pk=req.pk, state=GpuRequest.State.PENDING).update(
        state=GpuRequest.State.FAILED,
        end_reason=d.message[:300],
        status_code=d.code,
        status_message=d.message[:500],
        queue_position=None,
    )
    Decision.objects.create(
        tick=tick_no,
        request=req,
        team=req.team,
        kind=Decision.Kind.REJECT,
        code=d.code,
        message=d.message[:500],
        facts=_facts(d),
    )


def decisions_apply(*, decisions: list[st.Decision], ctx: Context, tick_no: int) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    changed: list[GpuRequest] = []
    # Preemptions first, so their decisions precede the admissions they make room for.
    for d in sorted(decisions, key=lambda d: d.kind != st.DecisionKind.PREEMPT):
        if d.kind == st.DecisionKind.PREEMPT:
            counts["preempt"] += _preempt(d, ctx, tick_no)
        elif d.kind == st.DecisionKind.ADMIT:
            counts["admit"] += _admit(d, ctx, tick_no)
        elif d.kind == st.DecisionKind.WAIT:
            _wait(d, ctx, tick_no, changed)
            counts["wait"] += 1
        elif d.kind == st.DecisionKind.REJECT:
            _reject(d, ctx, tick_no)
            counts["reject"] += 1
    GpuRequest.objects.bulk_update(
        changed,
        ["status_code", "status_message", "queue_position", "escalated", "estimated_start"],
        batch_size=500,
    )
    return dict(counts)


# ---------------------------------------------------------------------------
# Locking and the tick itself


def _try_lock(now: datetime) -> bool:
    """Take the single-tick lock for the current transaction."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [TICK_LOCK_KEY])
            return bool(cur.fetchone()[0])
    # SQLite: a lease row claimed by a conditional UPDATE.
    SchedulerState.objects.get_or_create(pk=1)
    claimed = SchedulerState.objects.filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now), pk=1
    ).update(lease_until=now + LEASE)
    return claimed == 1


def _count(counter: str) -> None:
    with transaction.atomic():
        SchedulerState.objects.get_or_create(pk=1)
        SchedulerState.objects.filter(pk=1).update(**{counter: F(counter) + 1})


def run_tick(now: datetime | None = None) -> TickResult:
    """One scheduling pass. A tick that finds the lock taken is skipped and counted."""
    try:
        return _run_tick(now)
    except Exception:
        _count("failed_ticks")
        raise


def _run_tick(now: datetime | None) -> TickResult:
    started = time.perf_counter()
    now = now or timezone.now()
    with transaction.atomic():
        if not _try_lock(now):
            skipped = True
        else:
            skipped = False
            state, _ = SchedulerState.objects.get_or_create(pk=1)
            tick_no = state.ticks + 1
            snapshot, ctx = build_snapshot(now)
            decisions = scheduling.schedule(snapshot, snapshot.now_ms) + ctx.held_back
            counts = decisions_apply(decisions=decisions, ctx=ctx, tick_no=tick_no)
            elapsed = time.perf_counter() - started
            histogram = dict(state.tick_histogram)
            bucket = tick_bucket(elapsed)
            histogram[bucket] = histogram.get(bucket, 0) + 1
            SchedulerState.objects.filter(pk=1).update(
                ticks=tick_no,
                last_tick_at=now,
                last_tick_ms=int(elapsed * 1000),
                lease_until=None,
                tick_histogram=histogram,
                tick_seconds_sum=F("tick_seconds_sum") + elapsed,
            )
    if skipped:
        _count("skipped_ticks")
        return TickResult(ran=False)
    return TickResult(
        ran=True,
        decisions=len(decisions),
        admitted=counts.get("admit", 0),
        preempted=counts.get("preempt", 0),
        seconds=time.perf_counter() - started,
        counts=counts,
    )


def reconcile(now: datetime | None = None) -> dict[str, int]:
    """Re-drive everything in flight: inventory, then each active attempt's status."""
    from portal.backends import get_backend

    backend = get_backend()
    counts: dict[str, int] = defaultdict(int)
    try:
        counts["nodes"] = services.inventory_sync(nodes=backend.inventory())
    except Exception:  # noqa: BLE001
        log.exception("inventory sync failed")
    now = now or timezone.now()
    for attempt in Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES).order_by("id"):
        status = backend.status(attempt.workload_name, attempt.namespace)
        if status.outcome.value == "missing" and attempt.state == Attempt.State.ADMITTED:
            # Admitted but never created (a launch lost after commit): create it now.
            launch_attempt(attempt.pk)
            counts["relaunched"] += 1
            _count("reconciler_repairs")
            continue
        if attempt.state == Attempt.State.STOPPING and status.outcome.value not in (
            "missing",
            "preempted",
        ):
            # Ask again: a stop lost after commit must not hold devices forever.
            services.backend_call(
                "stop", attempt.workload_name, attempt.namespace, services.STOP_GRACE_SECONDS
            )
            _count("reconciler_repairs")
        new_state = services.attempt_observe(attempt_id=attempt.pk, status=status, now=now)
        counts[new_state] += 1
    return dict(counts)
