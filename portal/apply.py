"""The tick's apply step: write the core's decisions (admissions, waits, preemptions,
rejections) in the tick's transaction, and launch what was admitted once it commits.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from portal import notify, services
from portal.models import (
    Allocation,
    Attempt,
    Decision,
    Device,
    GpuRequest,
    NotificationPreference,
    SchedulerState,
    UsageRecord,
)
from portal.snapshot import Context
from scheduling import types as st

log = logging.getLogger(__name__)


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
    services.attempt_launch(attempt_id)


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


def reason_key(code: str, message: str) -> tuple[str, str]:
    """What the decision log compares between ticks: the code and the reason's main clause.

    What follows "; " is detail that moves from tick to tick while the reason stays
    ("3 nodes are held for earlier large requests", "may start again in 41 s"); logging
    each change of it wrote a row per waiting request per tick.
    """
    return code, message.split("; ", 1)[0]


def _wait(
    d: st.Decision,
    ctx: Context,
    tick_no: int,
    changed: list[GpuRequest],
    notes: dict[Any, str] | None = None,
) -> None:
    req = ctx.requests[d.request_id]
    new_message = d.message[:500]
    estimate = d.facts.get("estimated_start_ms") if d.facts else None
    estimated_start = (
        datetime.fromtimestamp(int(estimate) / 1000, tz=ctx.now.tzinfo)
        if isinstance(estimate, int)
        else None
    )
    if reason_key(req.status_code, req.status_message) != reason_key(d.code, new_message):
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
    note = (notes or {}).get(d.request_id, req.position_note)
    fields = (d.code, new_message, d.position or None, d.escalated, estimated_start, note)
    if (
        req.status_code,
        req.status_message,
        req.queue_position,
        req.escalated,
        req.estimated_start,
        req.position_note,
    ) != fields:
        (
            req.status_code,
            req.status_message,
            req.queue_position,
            req.escalated,
            req.estimated_start,
            req.position_note,
        ) = fields
        changed.append(req)


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def position_notes(old: dict[Any, int | None], new: dict[Any, int]) -> dict[Any, str]:
    """Why each queued request's position changed since the last tick, in words.

    `old`: positions stored after the last tick (None: not waiting then); `new`: this
    tick's positions (of every request the scheduler placed in order, admitted ones too).
    Of the `o - 1` requests ahead before, some are still ahead, some fell behind, and
    the rest started or left (admitted requests no longer store their position); of
    the `n - 1` ahead now, the others arrived (new, or back after a requeue) or passed
    it (a stronger class, priority or fair share, an escalation). Only requests whose
    position changed get a note.
    """
    notes: dict[Any, str] = {}
    for rid, n in new.items():
        o = old.get(rid)
        if not o or not n or o == n:
            continue
        ahead_now = [x for x, p in new.items() if x != rid and p < n]
        stayed = sum(1 for x in ahead_now if (old.get(x) or 0) and old[x] < o)  # type: ignore[operator]
        arrived = sum(1 for x in ahead_now if not old.get(x))
        passed = len(ahead_now) - stayed - arrived
        fell = sum(1 for x, p in new.items() if (old.get(x) or 0) and old[x] < o and p > n)  # type: ignore[operator]
        left = max(0, (o - 1) - stayed - fell)
        why = []
        if left:
            why.append(
                _plural(left, "request", "requests") + " ahead of it started or left the queue"
            )
        if fell:
            why.append(_plural(fell, "request", "requests") + " fell behind it")
        if arrived:
            why.append(
                _plural(arrived, "request", "requests")
                + " of higher class, priority or fair share arrived"
            )
        if passed:
            why.append(
                _plural(passed, "request", "requests")
                + " moved ahead (priority, fair share or escalation)"
            )
        notes[rid] = f"moved from #{o} to #{n}" + (f": {'; '.join(why)}" if why else "")
    return notes


def duration_words(seconds: float) -> str:
    """45 s, 10 min, 2 h 5 min: a length of time as a researcher reads it."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    hours, minutes = divmod(s // 60, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def lost_work(attempt: Attempt, now: datetime) -> tuple[str, dict[str, Any]]:
    """The work a victim loses if stopped now, as a clause and as facts.

    Counted as the core counts it (scheduling.preemption): since the last
    checkpoint the workload reported, else since the attempt started.
    """
    begun = attempt.started_at or attempt.admitted_at
    since = attempt.last_checkpoint_at or begun
    seconds = max(0, int((now - since).total_seconds()))
    gpu_hours = seconds * attempt.gpus_milli / 1000 / 3600
    facts: dict[str, Any] = {
        "lost_seconds": seconds,
        "lost_gpu_hours": round(gpu_hours, 3),
        "last_checkpoint_at": since.isoformat() if attempt.last_checkpoint_at else None,
    }
    if attempt.last_checkpoint_at is None:
        clause = (
            f"it has not checkpointed, so it loses all {duration_words(seconds)} of its work "
            f"({gpu_hours:.2f} GPU-hours)"
        )
    else:
        clause = (
            f"it loses {duration_words(seconds)} of work since its last checkpoint at "
            f"{since:%H:%M} UTC ({gpu_hours:.2f} GPU-hours)"
        )
    return clause, facts


def _preempt(d: st.Decision, ctx: Context, tick_no: int) -> bool:
    attempt = ctx.attempts.get(d.attempt_id)
    if attempt is None or attempt.state not in (Attempt.State.ADMITTED, Attempt.State.RUNNING):
        return False
    services.attempt_stop(attempt, reason="preempted")
    req = attempt.request
    clause, lost = lost_work(attempt, ctx.now)
    Decision.objects.create(
        tick=tick_no,
        request=req,
        attempt=attempt,
        team=req.team,
        pool=attempt.pool,
        node=",".join(attempt.nodes),
        kind=Decision.Kind.PREEMPT,
        code=d.code,
        message=f"{d.message}; {clause}"[:500],
        facts={**_facts(d), **lost},
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
    notify.notify_later(req.pk, NotificationPreference.Event.FAILURE)


def decisions_apply(*, decisions: list[st.Decision], ctx: Context, tick_no: int) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    changed: list[GpuRequest] = []
    notes = position_notes(
        {rid: r.queue_position for rid, r in ctx.requests.items()},
        {
            d.request_id: d.position
            for d in decisions
            if d.position and d.kind in (st.DecisionKind.ADMIT, st.DecisionKind.WAIT)
        },
    )
    # Preemptions first, so their decisions precede the admissions they make room for.
    for d in sorted(decisions, key=lambda d: d.kind != st.DecisionKind.PREEMPT):
        if d.kind == st.DecisionKind.PREEMPT:
            counts["preempt"] += _preempt(d, ctx, tick_no)
        elif d.kind == st.DecisionKind.ADMIT:
            counts["admit"] += _admit(d, ctx, tick_no)
        elif d.kind == st.DecisionKind.WAIT:
            _wait(d, ctx, tick_no, changed, notes)
            counts["wait"] += 1
        elif d.kind == st.DecisionKind.REJECT and d.code == "not-a-member":
            # The core's member rules: the submitter left the team behind the services' back.
            req = ctx.requests[d.request_id]
            counts["cancel"] += services.gpu_request_cancel_not_member(
                req, actor=None, now=ctx.now, tick=tick_no
            )
        elif d.kind == st.DecisionKind.REJECT:
            _reject(d, ctx, tick_no)
            counts["reject"] += 1
    GpuRequest.objects.bulk_update(
        changed,
        [
            "status_code",
            "status_message",
            "queue_position",
            "escalated",
            "estimated_start",
            "position_note",
        ],
        batch_size=500,
    )
    return dict(counts)


def count(counter: str) -> None:
    """Add one to a SchedulerState counter (skipped ticks, repairs, ...)."""
    with transaction.atomic():
        SchedulerState.objects.get_or_create(pk=1)
        SchedulerState.objects.filter(pk=1).update(**{counter: F(counter) + 1})
