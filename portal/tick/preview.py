"""The submit preview: run the scheduler on a snapshot with the candidate added.

What the scheduler would do with a request if it were submitted now. Writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

import scheduling
from portal.lib import shapes
from portal.models import (
    PolicyProfile,
    Pool,
    Team,
    WorkloadClass,
)
from portal.services.requests import resources_check
from portal.tick.estimates import estimate_start, pool_free_milli, running_ends
from portal.tick.snapshot import build_snapshot
from scheduling import types as st


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
    #: the input field a rejection is about ("" when it is about the whole request)
    field: str = ""


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
    kind: str = "batch",
    now: datetime | None = None,
) -> Preview:
    """What the scheduler would do with this request if it were submitted now. Writes nothing."""
    if workload_class.retired_at is not None:
        return Preview(
            "rejected",
            f"The {workload_class.name} class is retired; choose another.",
            code="class-retired",
            field="workload_class",
        )
    refusal = workload_class.refusal(team=team, kind=kind, pool=pool)
    if refusal is not None:
        # The submit would refuse it (services.check_class): say so, before any scheduling.
        field, message = refusal
        return Preview("rejected", message, code="class-not-allowed", field=field)
    offering = [p for p in Pool.offering(pool) if p.offers(profile_kind, mig_profile)]
    try:
        resources_check(offering, cpu_milli=cpu_milli, memory_mib=memory_mib)
    except ValidationError as exc:
        # the submit would refuse it on CPU or memory: say that, not "no node can hold 1 GPU"
        [(bad, messages)] = exc.message_dict.items()
        return Preview("rejected", messages[0], code=f"too-large-{bad}", field=bad)
    now = now or timezone.now()
    # the active profile, as the tick runs it (read only: the shipped default if none is stored)
    policy = PolicyProfile.objects.active_profile().policy()
    snapshot, ctx = build_snapshot(now, policy)
    candidate_pools = [pool] if pool is not None else list(ctx.pools.values())
    shape = shapes.shape_build(
        profile_kind=profile_kind,
        mig_profile=mig_profile,
        milli=milli,
        gpu_memory_mib=gpu_memory_mib,
        count=count,
        pods=pods,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        tolerations=shapes.tolerations(candidate_pools),
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
        dataclasses.replace(snapshot, pending=snapshot.pending + (candidate,)),
        snapshot.now_ms,
        policy,
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
        # The page says "would be rejected: …"; the core's message starts with the word too.
        return Preview("rejected", d.message.removeprefix("rejected: "), code=d.code)
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
