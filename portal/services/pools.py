"""Pools and workload classes: their settings, changed through the audit log."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from portal.models import Pool, WorkloadClass
from portal.services.audit import audit, update_audited

CLASS_FIELDS = [
    "band",
    "preemption",
    "min_runtime_s",
    "max_queue_s",
    "latency_objective_ms",
    "inference",
    "priority_class_name",
    "description",
    "restricted",
    "kinds",
]


def workload_class_update(
    *,
    actor: User,
    workload_class: WorkloadClass,
    teams: Any = None,
    pools: Any = None,
    **changes: Any,
) -> WorkloadClass:
    """Change a class; `teams` (the teams a restricted class is open to) and `pools` (the
    pools it is bound to) are audited apart."""
    with transaction.atomic():
        wc = update_audited(
            actor=actor,
            obj=workload_class,
            fields=CLASS_FIELDS,
            action="class.update",
            changes=changes,
        )
        if teams is not None:
            before = sorted(wc.teams.values_list("name", flat=True))
            wc.teams.set(list(teams))
            after = sorted(wc.teams.values_list("name", flat=True))
            if before != after:
                audit(
                    actor=actor,
                    action="class.teams",
                    obj=wc,
                    before={"teams": before},
                    after={"teams": after},
                )
        if pools is not None:
            before = sorted(wc.pools.values_list("name", flat=True))
            wc.pools.set(list(pools))
            after = sorted(wc.pools.values_list("name", flat=True))
            if before != after:
                audit(
                    actor=actor,
                    action="class.pools",
                    obj=wc,
                    before={"pools": before},
                    after={"pools": after},
                )
    return wc


POOL_FIELDS = [
    "lifecycle",
    "inference_floor_milli",
    "taints",
    "node_selector",
    "time_slicing_replicas",
    "mig_layout",
    "interconnect",
    "architecture",
]


#: an autoscaled pool's settings (docs/capacity.md): audited with the others, not on the
#: settings page's form
POOL_AUTOSCALE_FIELDS = [
    "autoscaled",
    "min_nodes",
    "max_nodes",
    "node_gpus",
    "node_cpu_milli",
    "node_memory_mib",
    "idle_release_s",
]


def pool_update(*, actor: User, pool: Pool, **changes: Any) -> Pool:
    return update_audited(
        actor=actor,
        obj=pool,
        fields=POOL_FIELDS + POOL_AUTOSCALE_FIELDS,
        action="pool.update",
        changes=changes,
    )
