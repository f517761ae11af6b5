"""Nodes and devices: inventory from the cluster, node agent reports, cordon, drain, return, quarantine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.backends import get_backend
from portal.backends.base import InventoryDevice
from portal.lib import lifecycle
from portal.models import Allocation, Attempt, Decision, Device, Node, Pool
from portal.services.attempts import attempt_stop, backend_call
from portal.services.audit import audit, field_values


def node_cordon(*, actor: User, node: Node, reason: str = "") -> Node:
    return _node_maintenance(
        actor=actor, node=node, cordoned=True, draining=False, action="node.cordon", reason=reason
    )


def node_return(*, actor: User, node: Node, reason: str = "") -> Node:
    with transaction.atomic():
        node = _node_maintenance(
            actor=actor,
            node=node,
            cordoned=False,
            draining=False,
            action="node.return",
            reason=reason,
        )
        if node.maintenance_reason:
            # Cordoned on the cluster too by a validation or rollout (docs/lifecycle.md):
            # uncordon it there, or the next inventory sync would cordon it again.
            node.maintenance_reason = ""
            node.save(update_fields=["maintenance_reason", "updated_at"])
            name = node.name
            transaction.on_commit(lambda: backend_call("node_patch", name, {}, False))
    return node


def node_drain(*, actor: User, node: Node, reason: str = "") -> Node:
    """Cordon the node and stop what runs there; stopped work requeues, not charged."""
    with transaction.atomic():
        node = _node_maintenance(
            actor=actor, node=node, cordoned=True, draining=True, action="node.drain", reason=reason
        )
        attempt_ids = Allocation.objects.filter(device__node=node, active=True).values_list(
            "attempt_id", flat=True
        )
        for attempt in Attempt.objects.filter(
            pk__in=set(attempt_ids), state__in=Attempt.ACTIVE_STATES
        ):
            attempt_stop(attempt, reason="drained")
    return node


def _node_maintenance(
    *,
    actor: User,
    node: Node,
    cordoned: bool,
    draining: bool,
    action: str,
    reason: str = "",
) -> Node:
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        before = field_values(node, ["cordoned", "draining"])
        node.cordoned, node.draining = cordoned, draining
        node.save(update_fields=["cordoned", "draining", "updated_at"])
        audit(
            actor=actor,
            action=action,
            obj=node,
            before=before,
            after=field_values(node, ["cordoned", "draining"]),
            reason=reason,
        )
    return node


def inventory_sync(*, nodes: list[Any] | None = None) -> int:
    """Bring Node and Device rows in line with what the backend reports. Returns nodes seen."""
    inventory = nodes if nodes is not None else get_backend().inventory()
    pools = {p.name: p for p in Pool.objects.all()}
    seen = 0
    now = timezone.now()
    # A pool's first nodes are the pool as adopted; a node joining it later is burnt in first.
    populated = set(Node.objects.values_list("pool_id", flat=True).distinct())
    before: dict[str, dict[str, Any]] = {
        n["name"]: dict(n)
        for n in Node.objects.filter(name__in=[i.name for i in inventory]).values(
            "name", "pool_id", "ready", "not_ready_since"
        )
    }
    joining: list[tuple[Node, str]] = []
    with transaction.atomic():
        for inv in inventory:
            pool = pools.get(inv.pool)
            if pool is None:
                continue
            prev = before.get(inv.name)
            why = _joins(pool, prev, inv.ready, populated, now)
            away_since = None if inv.ready else (prev["not_ready_since"] if prev else None) or now
            node, _ = Node.objects.update_or_create(
                name=inv.name,
                defaults={
                    "pool": pool,
                    "cpu_milli": inv.cpu_milli,
                    "memory_mib": inv.memory_mib,
                    "labels": inv.labels,
                    "taints": [{"key": k, "value": v, "effect": e} for k, v, e in inv.taints],
                    "ready": inv.ready,
                    "interconnect": inv.interconnect,
                    "software": lifecycle.node_software(inv.labels),
                    "not_ready_since": away_since,
                },
            )
            if why:
                joining.append((node, why))
            if inv.cordoned and not node.cordoned:
                Node.objects.filter(pk=node.pk).update(cordoned=True)
            for d in _foreign_off_held(node, inv.devices):
                Device.objects.update_or_create(
                    node=node,
                    index=d.index,
                    defaults={
                        # Only the node agent knows UUIDs on a real cluster: never blank one out.
                        **({"uuid": d.uuid} if d.uuid else {}),
                        "model": d.model,
                        "memory_mib": d.memory_mib,
                        "partitioning": d.partitioning,
                        "replicas": d.replicas,
                        "mig_instances": [
                            {"profile": m.profile, "start": m.start, "size": m.size}
                            for m in d.mig_instances
                        ],
                        "healthy": d.healthy,
                        "foreign": d.foreign,
                    },
                )
            seen += 1
        for node, why in joining:
            _burn_in_gate(node, why)
    return seen


def _foreign_off_held(node: Node, devices: Sequence[InventoryDevice]) -> list[InventoryDevice]:
    """Put the inventory's foreign marks on devices the portal does not hold.

    The cluster says only how many whole GPUs pods Quartermaster did not create hold (its own
    pods are not counted), not which. A mark on a device the portal books would leave another
    device free in the books while it is taken: booked twice. So the marks go on the highest
    unheld devices that the device plugin offers.
    """
    foreign = sum(d.foreign for d in devices)
    if not foreign:
        return list(devices)
    held = set(
        Allocation.objects.filter(device__node=node, active=True).values_list(
            "device__index", flat=True
        )
    )
    offered = [
        d.index for d in devices if d.partitioning == "exclusive" and (d.healthy or d.foreign)
    ]
    order = [i for i in reversed(offered) if i not in held] + [
        i for i in reversed(offered) if i in held
    ]
    marked = set(order[:foreign])
    return [
        replace(d, healthy=d.index not in marked, foreign=d.index in marked)
        if d.index in offered
        else d
        for d in devices
    ]


def _joins(
    pool: Pool, prev: dict[str, Any] | None, ready: bool, populated: set[int], now: datetime
) -> str:
    """Why a node must pass a burn-in before it serves in `pool` ("" = it need not)."""
    if not pool.burn_in_new_nodes or pool.autoscaled:
        # An autoscaled pool's nodes are asked for a waiting request and consumed by it (a
        # ProvisioningRequest): holding them out would let the ask lapse.
        return ""
    if prev is None:
        return f"new in pool {pool.name}" if pool.pk in populated else ""
    if prev["pool_id"] != pool.pk:
        return f"moved into pool {pool.name}"
    away = prev["not_ready_since"]
    gone_s = (now - away).total_seconds() if away is not None else 0.0
    if ready and not prev["ready"] and gone_s >= settings.BURN_IN_RETURN_AFTER_SECONDS > 0:
        return f"back in pool {pool.name} after {int(gone_s)} s away"
    return ""


#: the maintenance reason of a node held out of its pool until its burn-in passes; the
#: rollout beat starts that burn-in (`portal.services.rollouts.burn_ins_start`)
BURN_IN_GATE = "burn-in before serving: "


def _burn_in_gate(node: Node, why: str) -> None:
    """Hold the node out now, in the portal and on the cluster; its burn-in starts next beat."""
    Node.objects.filter(pk=node.pk).update(
        cordoned=True, maintenance_reason=(BURN_IN_GATE + why)[:300]
    )
    name = node.name
    transaction.on_commit(lambda: backend_call("node_patch", name, {}, True))


CRITICAL_XID_QUARANTINE = "critical Xid"


def node_agent_report(*, report: dict[str, Any], now: datetime | None = None) -> Node:
    """Store a node agent's report: heartbeat, per-device NVML readings, health, quarantine."""
    now = now or timezone.now()
    name = report.get("node")
    if not isinstance(name, str) or not name:
        raise ValidationError({"node": "The report must name its node."})
    devices = report.get("devices")
    if not isinstance(devices, list):
        raise ValidationError({"devices": "The report must list its devices."})
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            raise ValidationError({"node": f"Node {name} is not in the inventory."})
        node.last_heartbeat, node.agent_report = now, report
        node.save(update_fields=["last_heartbeat", "agent_report", "updated_at"])
        by_index = {d.index: d for d in node.devices.all()}
        for raw in devices:
            if not isinstance(raw, dict) or raw.get("index") not in by_index:
                continue
            _device_report(by_index[raw["index"]], raw, now)
    return node


def _device_report(device: Device, raw: dict[str, Any], now: datetime) -> None:
    xids = [x for x in raw.get("xids") or [] if isinstance(x, dict)]
    critical = [x for x in xids if x.get("critical")]
    device.memory_used_mib = max(0, int(raw.get("memory_used_mib") or 0))
    device.utilization_pct = max(0, int(raw.get("utilization_pct") or 0))
    device.processes = [p for p in raw.get("processes") or [] if isinstance(p, dict)][:50]
    device.xids = (device.xids + xids)[-20:]
    device.agent_healthy = bool(raw.get("healthy", True))
    device.reported_at = now
    if raw.get("uuid"):
        device.uuid = str(raw["uuid"])[:100]
    if critical and not device.quarantined:
        device.quarantined = True
        device.health_reason = f"{CRITICAL_XID_QUARANTINE} {critical[-1].get('xid')}"
        Decision.objects.create(
            node=device.node.name,
            kind=Decision.Kind.END,
            code="quarantined",
            message=f"{device}: quarantined after Xid {critical[-1].get('xid')}; an admin must clear it",
            facts={"xids": critical},
        )
    elif not device.agent_healthy:
        device.health_reason = str(
            raw.get("error") or "the node agent reports the device unhealthy"
        )[:200]
    device.save()


def device_clear_quarantine(*, actor: User, device: Device) -> Device:
    """An admin returns a quarantined device to service (a healthy report never does)."""
    with transaction.atomic():
        device = Device.objects.select_for_update().select_related("node").get(pk=device.pk)
        if not device.quarantined:
            raise ValidationError({"device": f"{device} is not quarantined."})
        before = field_values(device, ["quarantined", "health_reason"])
        device.quarantined, device.health_reason = False, ""
        device.save(update_fields=["quarantined", "health_reason"])
        audit(
            actor=actor,
            action="device.clear-quarantine",
            obj=device,
            before=before,
            after=field_values(device, ["quarantined", "health_reason"]),
        )
    return device
