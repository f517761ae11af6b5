"""Pools and workload classes: their settings, changed through the audit log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.models import Attempt, DeviceProfile, GpuRequest, Pool, WorkloadClass
from portal.services.audit import Actor, audit, field_values, update_audited
from portal.services.requests import gpu_request_cancel
from scheduling import mig

CLASS_FIELDS = [
    "default_profile",
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
    actor: Actor,
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
            _links_set(actor, wc, "teams", teams)
        if pools is not None:
            _links_set(actor, wc, "pools", pools)
    return wc


def _link_names(wc: WorkloadClass, relation: str) -> list[str]:
    return sorted(getattr(wc, relation).values_list("name", flat=True))


def _links_set(actor: Actor, wc: WorkloadClass, relation: str, rows: Any) -> None:
    """Set a class's teams or pools, audited as `class.<relation>` when they changed."""
    before = _link_names(wc, relation)
    getattr(wc, relation).set(list(rows))
    after = _link_names(wc, relation)
    if before != after:
        audit(
            actor=actor,
            action=f"class.{relation}",
            obj=wc,
            before={relation: before},
            after={relation: after},
        )


POOL_FIELDS = [
    "lifecycle",
    "inference_floor_milli",
    "burn_in_new_nodes",
    "taints",
    "node_selector",
    "time_slicing_replicas",
    "sharing_engine",
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


#: what a pool is given once, when it is made (its nodes are what they are)
POOL_FIXED_FIELDS = ["name", "gpu_model", "gpu_memory_mib", "partitioning"]
#: what a pool's update may change
POOL_UPDATE_FIELDS = [*POOL_FIELDS, *POOL_AUTOSCALE_FIELDS]
#: what a new pool may be given (the rest keep their defaults)
POOL_CREATE_FIELDS = [*POOL_FIXED_FIELDS, *POOL_UPDATE_FIELDS]


def mig_layout_check(pool: Pool) -> None:
    """A MIG pool's layout must fit one GPU of its model (`scheduling.mig` geometry)."""
    if pool.partitioning != Pool.Partitioning.MIG:
        return
    if not pool.mig_layout:
        raise ValidationError({"mig_layout": "A MIG pool needs a layout, e.g. 3g.40gb, 2g.20gb."})
    family = mig.family_for(pool.gpu_model, pool.gpu_memory_mib)
    if family is None:
        raise ValidationError(
            {"gpu_model": f"{mig.unknown_gpu_message(pool.gpu_model)} (no MIG geometry is known)."}
        )
    unknown = [p for p in pool.mig_layout if family.profile(p) is None]
    if unknown:
        raise ValidationError(
            {"mig_layout": f"{unknown[0]} is not a MIG profile of {pool.gpu_model}."}
        )
    if not mig.fits(family, pool.mig_layout):
        raise ValidationError(
            {"mig_layout": f"These profiles do not fit together on one {pool.gpu_model}."}
        )


def pool_create(*, actor: Actor, config_managed: bool = False, **fields: Any) -> Pool:
    """A new pool, validated as Kubernetes and the GPU's MIG geometry would, audited."""
    unknown = set(fields) - set(POOL_CREATE_FIELDS)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "This field cannot be set here."})
    with transaction.atomic():
        pool = Pool(**fields, config_managed=config_managed)
        pool.full_clean()
        mig_layout_check(pool)
        pool.save()
        audit(
            actor=actor,
            action="pool.create",
            obj=pool,
            after=field_values(pool, POOL_CREATE_FIELDS),
        )
    return pool


def pool_update(*, actor: Actor, pool: Pool, **changes: Any) -> Pool:
    return update_audited(
        actor=actor,
        obj=pool,
        fields=POOL_UPDATE_FIELDS,
        action="pool.update",
        changes=changes,
        # checked when the layout changes: rows from before the check keep working
        check=mig_layout_check if "mig_layout" in changes else None,
    )


@dataclass(frozen=True)
class RetireImpact:
    """What retiring a pool or class does to the work in it."""

    running: int
    pending: int

    def sentence(self, what: str) -> str:
        return (
            f"{self.running} running request(s) in {what} run to the end (drain); "
            f"{self.pending} waiting request(s) are moved where you say, or cancelled."
        )


def pool_retire_impact(pool: Pool) -> RetireImpact:
    return RetireImpact(
        running=GpuRequest.objects.filter(
            attempts__pool=pool, attempts__state__in=Attempt.ACTIVE_STATES
        )
        .distinct()
        .count(),
        pending=GpuRequest.objects.filter(pool=pool, state=GpuRequest.State.PENDING).count(),
    )


def pool_retire(
    *, actor: User | None, pool: Pool, confirm: bool, move_to: Pool | None = None
) -> RetireImpact:
    """Retire a pool: it goes to maintenance for good and takes no new work; running work
    drains; waiting requests move to `move_to` or are cancelled. Nothing is deleted, so the
    audit and decision logs keep their pool. Refused without `confirm` when work is in it."""
    impact = pool_retire_impact(pool)
    if (impact.running or impact.pending) and not confirm:
        raise ValidationError({"confirm": impact.sentence(f"pool {pool.name}")})
    if move_to is not None and (move_to.pk == pool.pk or move_to.retired_at is not None):
        raise ValidationError({"move_to": "Move waiting requests to another, live pool."})
    with transaction.atomic():
        row = Pool.objects.select_for_update().get(pk=pool.pk)
        if row.retired_at is not None:
            raise ValidationError({"pool": f"Pool {row.name} is retired already."})
        before = {"lifecycle": row.lifecycle, "retired_at": None}
        moved, cancelled = _move_or_cancel(
            actor, GpuRequest.objects.filter(pool=row), "pool", move_to
        )
        row.lifecycle, row.retired_at = Pool.Lifecycle.MAINTENANCE, timezone.now()
        row.save(update_fields=["lifecycle", "retired_at"])
        audit(
            actor=actor,
            action="pool.retire",
            obj=row,
            before=before,
            after={
                "lifecycle": row.lifecycle,
                "retired_at": row.retired_at,
                "running": impact.running,
                "moved": moved,
                "cancelled": cancelled,
                "moved_to": move_to.name if move_to else None,
            },
        )
    return impact


def _move_or_cancel(
    actor: User | None, requests: Any, field: str, move_to: Pool | WorkloadClass | None
) -> tuple[int, int]:
    """Waiting requests of a retired pool or class: moved (one update), or each cancelled."""
    pending = requests.filter(state=GpuRequest.State.PENDING)
    if move_to is not None:
        return pending.update(**{field: move_to}), 0
    cancelled = 0
    for req in pending.order_by("id"):
        gpu_request_cancel(user=actor, gpu_request=req, reason=f"its {field} was retired")  # type: ignore[arg-type]
        cancelled += 1
    return 0, cancelled


CLASS_CREATE_FIELDS = ["name", *CLASS_FIELDS]


def workload_class_create(
    *,
    actor: Actor,
    teams: Any = None,
    pools: Any = None,
    config_managed: bool = False,
    **fields: Any,
) -> WorkloadClass:
    unknown = set(fields) - set(CLASS_CREATE_FIELDS)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "This field cannot be set here."})
    with transaction.atomic():
        wc = WorkloadClass(**fields, config_managed=config_managed)
        wc.full_clean()
        wc.save()
        if teams:
            wc.teams.set(list(teams))
        if pools:
            wc.pools.set(list(pools))
        audit(
            actor=actor,
            action="class.create",
            obj=wc,
            after={
                **field_values(wc, CLASS_CREATE_FIELDS),
                "teams": _link_names(wc, "teams"),
                "pools": _link_names(wc, "pools"),
            },
        )
    return wc


def workload_class_retire_impact(wc: WorkloadClass) -> RetireImpact:
    return RetireImpact(
        running=GpuRequest.objects.filter(
            workload_class=wc, state__in=GpuRequest.ACTIVE_STATES
        ).count(),
        pending=GpuRequest.objects.filter(
            workload_class=wc, state=GpuRequest.State.PENDING
        ).count(),
    )


def workload_class_retire(
    *,
    actor: User | None,
    workload_class: WorkloadClass,
    confirm: bool,
    move_to: WorkloadClass | None = None,
) -> RetireImpact:
    """Retire a class: no new requests; running work runs on; waiting requests move to
    `move_to` or are cancelled. The row stays for the audit and decision logs."""
    wc = workload_class
    impact = workload_class_retire_impact(wc)
    if (impact.running or impact.pending) and not confirm:
        raise ValidationError({"confirm": impact.sentence(f"class {wc.name}")})
    if move_to is not None and (move_to.pk == wc.pk or move_to.retired_at is not None):
        raise ValidationError({"move_to": "Move waiting requests to another, live class."})
    with transaction.atomic():
        row = WorkloadClass.objects.select_for_update().get(pk=wc.pk)
        if row.retired_at is not None:
            raise ValidationError({"workload_class": f"Class {row.name} is retired already."})
        moved, cancelled = _move_or_cancel(
            actor, GpuRequest.objects.filter(workload_class=row), "workload_class", move_to
        )
        row.retired_at = timezone.now()
        row.save(update_fields=["retired_at"])
        audit(
            actor=actor,
            action="class.retire",
            obj=row,
            before={"retired_at": None},
            after={
                "retired_at": row.retired_at,
                "running": impact.running,
                "moved": moved,
                "cancelled": cancelled,
                "moved_to": move_to.name if move_to else None,
            },
        )
    return impact


DEVICE_PROFILE_FIELDS = ["kind", "mig_profile", "milli", "gpu_memory_mib"]


def device_profile_set(*, actor: Actor, name: str, **fields: Any) -> DeviceProfile:
    """Create a device profile or change it, audited old → new."""
    with transaction.atomic():
        row = DeviceProfile.objects.select_for_update().filter(name=name).first()
        before = None if row is None else field_values(row, DEVICE_PROFILE_FIELDS)
        row = row or DeviceProfile(name=name)
        for key, value in fields.items():
            setattr(row, key, value)
        row.full_clean()
        row.save()
        audit(
            actor=actor,
            action="device_profile.set",
            obj=row,
            before=before,
            after=field_values(row, DEVICE_PROFILE_FIELDS),
        )
    return row
