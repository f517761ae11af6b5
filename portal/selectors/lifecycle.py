"""Reads for the pool lifecycle pages and API: software inventory and drift, validations,
rollouts and their progress (docs/lifecycle.md)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import QuerySet

from portal.lib import lifecycle
from portal.models import AuditEvent, Node, Pool, Rollout, RolloutNode, ValidationRun


def drift_by_pool(pools: list[Pool] | None = None) -> dict[int, dict[str, Any]]:
    """Per pool id: {"fields": {field: {version: [nodes]}}, "odd": {node: [fields]}} — the
    fields its nodes disagree on and, per node, where it is not on the pool's majority."""
    per_pool: dict[int, dict[str, dict[str, str]]] = defaultdict(dict)
    nodes = Node.objects.only("pk", "name", "pool_id", "software")
    if pools is not None:
        nodes = nodes.filter(pool__in=pools)
    for n in nodes:
        per_pool[n.pool_id][n.name] = n.software or {}
    out: dict[int, dict[str, Any]] = {}
    for pool_id, sw in per_pool.items():
        fields = lifecycle.software_drift(sw)
        odd: dict[str, list[str]] = defaultdict(list)
        for f, by_value in fields.items():
            common = lifecycle.majority(by_value)
            for value, names in by_value.items():
                if value != common:
                    for name in names:
                        odd[name].append(lifecycle.SOFTWARE_TITLES[f])
        out[pool_id] = {"fields": fields, "odd": dict(odd)}
    return out


def pool_software(pool: Pool) -> dict[str, Any]:
    """The pool page's inventory: one row per node, with the fields it drifts on."""
    drift = drift_by_pool([pool]).get(pool.pk, {"fields": {}, "odd": {}})
    rows = []
    for n in pool.nodes.order_by("name"):
        sw = n.software or {}
        rows.append(
            {
                "node": n,
                "versions": [(f, sw.get(f, "")) for f in lifecycle.SOFTWARE_FIELDS],
                "odd": drift["odd"].get(n.name, []),
                "last_validation": n.validations.first(),
            }
        )
    summary = {
        lifecycle.SOFTWARE_TITLES[f]: {v or "not labelled": len(ns) for v, ns in by.items()}
        for f, by in drift["fields"].items()
    }
    return {
        "titles": [lifecycle.SOFTWARE_TITLES[f] for f in lifecycle.SOFTWARE_FIELDS],
        "rows": rows,
        "drift": summary,
    }


def rollout_list(pool: Pool | None = None) -> QuerySet[Rollout]:
    qs = Rollout.objects.select_related("pool", "created_by")
    return qs.filter(pool=pool) if pool is not None else qs


#: how a rollout told the cluster its change, as the rollout page says it
_API_LABELS = {
    "nvidiadriver": "GPU Operator NVIDIADriver, one per wave",
    "clusterpolicy": "GPU Operator ClusterPolicy",
    "labels": "node labels",
}


def rollout_progress(rollout: Rollout) -> dict[str, Any]:
    """Waves with each node's step and reason, counts per step, and the rollout's audit trail."""
    members = list(RolloutNode.objects.filter(rollout=rollout).select_related("node", "validation"))
    api = str(rollout.impact.get("driver_api") or "labels")
    # Only a driver rollout through NVIDIADriver has a resource per wave (the device
    # plugin's version is the ClusterPolicy's under either Operator API).
    per_wave = rollout.kind == Rollout.Kind.DRIVER and api == "nvidiadriver"
    waves: list[dict[str, Any]] = []
    impact = {w["wave"]: w for w in rollout.impact.get("waves", [])}
    for i in range(len(rollout.waves)):
        ms = [m for m in members if m.wave == i]
        waves.append(
            {
                "index": i,
                "canary": impact.get(i, {}).get("canary", False),
                "members": ms,
                "impact": impact.get(i, {}),
                "current": rollout.state == Rollout.State.RUNNING and i == rollout.current_wave,
                "done": all(m.step in RolloutNode.DONE for m in ms),
                "nvidiadriver": lifecycle.driver_wave_name(rollout.pk, i) if per_wave else "",
            }
        )
    counts: dict[str, int] = defaultdict(int)
    for m in members:
        counts[m.step] += 1
    audit = AuditEvent.objects.filter(object_type="rollout", object_id=str(rollout.pk)).order_by(
        "created_at", "id"
    )
    written = "labels"
    if rollout.kind in lifecycle.OPERATOR_KINDS and api in lifecycle.OPERATOR_APIS:
        written = api if rollout.kind == Rollout.Kind.DRIVER else "clusterpolicy"
    return {
        "waves": waves,
        "driver_api": written,
        "driver_api_label": _API_LABELS[written],
        "counts": dict(counts),
        "done": sum(counts[s] for s in RolloutNode.DONE),
        "total": len(members),
        "audit": list(audit),
    }


def validation_list(pool: Pool) -> QuerySet[ValidationRun]:
    return ValidationRun.objects.filter(node__pool=pool).select_related("node")[:20]
