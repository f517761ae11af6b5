"""The audit log in words: what each event changed, old → new, in the units people use.

`describe(events)` names every event's target with a fixed number of queries for the
whole page (one per kind of object on it), never one per row.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model

from portal.lib.words import duration, gpu_count
from portal.models import (
    AuditEvent,
    Device,
    GpuRequest,
    Membership,
    Node,
    PolicyProfile,
    Pool,
    Quota,
    Rollout,
    Team,
    ValidationRun,
    WorkloadClass,
)

ACTIONS = {
    "request.submit": "submitted a request",
    "request.cancel": "cancelled a request",
    "quota.set": "changed a quota",
    "class.update": "changed a workload class",
    "class.teams": "changed who may use a workload class",
    "class.pools": "changed the pools a workload class runs in",
    "pool.update": "changed a pool",
    "team.create": "created a team",
    "team.retire": "retired a team",
    "membership.set": "set a membership",
    "membership.remove": "removed a member",
    "user.roles": "synced roles from sign-on",
    "node.cordon": "cordoned a node",
    "node.drain": "drained a node",
    "node.return": "returned a node to service",
    "device.clear-quarantine": "cleared a device's quarantine",
    "profile.create": "created a scheduling profile",
    "profile.update": "changed a scheduling profile",
    "profile.activate": "activated a scheduling profile",
    "rollout.start": "started a rollout",
    "rollout.wave": "moved a rollout to its next wave",
    "rollout.cordon": "cordoned a node for a rollout",
    "rollout.apply": "wrote a rollout's change to a node",
    "rollout.preempt": "stopped work on a node for a rollout",
    "rollout.applied": "applied a rollout's change to a node",
    "rollout.return": "returned a node from a rollout",
    "rollout.node_failed": "failed a node in a rollout",
    "rollout.halt": "halted a rollout",
    "rollout.succeed": "finished a rollout",
    "node.validate": "started a node's validation",
    "validation.passed": "passed a node's validation",
    "validation.failed": "failed a node's validation",
}

LABELS = {
    "nominal_milli": "guaranteed",
    "borrowing_limit_milli": "borrowing limit",
    "lending_limit_milli": "lending limit",
    "granted_milli": "granted",
    "inference_floor_milli": "inference floor",
    "gpu_cap_milli": "GPU cap",
    "time_slicing_replicas": "time-slicing replicas",
    "sharing_engine": "sharing engine",
    "mig_layout": "MIG layout",
    "node_selector": "node selector",
    "min_runtime_s": "minimum runtime",
    "max_queue_s": "maximum queue time",
    "latency_objective_ms": "latency objective",
    "priority_class_name": "priority class",
    "health_reason": "health",
    "cancelled_requests": "pending requests cancelled",
}

#: an unset limit means "no limit" for these, "none" elsewhere
UNLIMITED = {"borrowing_limit_milli", "lending_limit_milli", "gpu_cap_milli"}


@dataclass
class Change:
    label: str
    #: "" where the event has no value before (created) or after (removed)
    old: str
    new: str

    def __str__(self) -> str:
        if self.old and self.new:
            return f"{self.label}: {self.old} → {self.new}"
        if self.old:
            return f"{self.label}: was {self.old}"
        return f"{self.label}: {self.new}"


@dataclass
class AuditRow:
    event: AuditEvent
    actor: str
    what: str
    target: str
    changes: list[Change] = field(default_factory=list)

    @property
    def changes_text(self) -> str:
        return "; ".join(str(c) for c in self.changes)


def value_words(key: str, value: Any) -> str:
    """One stored value as people read it: 16000 milli-GPU -> "16 GPUs", 300 s -> "5 min"."""
    if value is None:
        return "no limit" if key in UNLIMITED else "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.endswith("_milli") and isinstance(value, int):
        return gpu_count(value)
    if key.endswith("_s") and isinstance(value, int | float):
        return duration(value)
    if key.endswith("_ms") and isinstance(value, int | float):
        return f"{value:g} ms"
    if key == "taints" and isinstance(value, list):
        return ", ".join(_taint(t) for t in value) or "none"
    if isinstance(value, dict):
        # A label map: None is a label the node did not have (or one taken off).
        return (
            ", ".join(f"{k} unset" if v is None else f"{k}={v}" for k, v in value.items()) or "none"
        )
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    return str(value) if value != "" else "none"


def _taint(t: Any) -> str:
    if not isinstance(t, dict):
        return str(t)
    text = str(t.get("key", ""))
    if t.get("value"):
        text += f"={t['value']}"
    return f"{text}:{t['effect']}" if t.get("effect") else text


def _changes(before: Any, after: Any) -> list[Change]:
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
    out = []
    for key in list(dict.fromkeys([*before, *after])):
        if key == "user":
            continue
        old, new = before.get(key, ...), after.get(key, ...)
        if old == new:
            continue
        label = LABELS.get(key, key.replace("_", " "))
        out.append(
            Change(
                label,
                "" if old is ... else value_words(key, old),
                "" if new is ... else value_words(key, new),
            )
        )
    return out


def _targets(events: list[AuditEvent]) -> dict[tuple[str, str], str]:
    """(object_type, object_id) -> a name, one query per kind of object on the page."""
    names: dict[tuple[str, str], str] = {}

    def put(kind: str, pairs: Any) -> None:
        for pk, name in pairs:
            names[(kind, str(pk))] = name

    by_type: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e.object_id.isdigit():
            by_type[e.object_type].append(int(e.object_id))
    if ids := by_type.get("quota"):
        put(
            "quota",
            (
                (q.pk, f"{q.team.name} in pool {q.pool.name}")
                for q in Quota.objects.filter(pk__in=ids).select_related("team", "pool")
            ),
        )
    if ids := by_type.get("gpurequest"):
        put(
            "gpurequest",
            (
                (pk, f"request #{pk}" + (f" ({name})" if name else ""))
                for pk, name in GpuRequest.objects.filter(pk__in=ids).values_list("pk", "name")
            ),
        )
    if ids := by_type.get("node"):
        put(
            "node",
            (
                (pk, f"node {name} (pool {pool})")
                for pk, name, pool in Node.objects.filter(pk__in=ids).values_list(
                    "pk", "name", "pool__name"
                )
            ),
        )
    if ids := by_type.get("device"):
        put(
            "device",
            (
                (pk, f"GPU {index} on node {node}")
                for pk, index, node in Device.objects.filter(pk__in=ids).values_list(
                    "pk", "index", "node__name"
                )
            ),
        )
    if ids := by_type.get("rollout"):
        put(
            "rollout",
            (
                (pk, f"rollout #{pk} ({kind} {target} on pool {pool})")
                for pk, kind, target, pool in Rollout.objects.filter(pk__in=ids).values_list(
                    "pk", "kind", "target", "pool__name"
                )
            ),
        )
    if ids := by_type.get("validationrun"):
        put(
            "validationrun",
            (
                (pk, f"validation #{pk} of node {node}")
                for pk, node in ValidationRun.objects.filter(pk__in=ids).values_list(
                    "pk", "node__name"
                )
            ),
        )
    # Objects known by their name alone: the word before it says what they are.
    for kind, model, word in (
        ("pool", Pool, "pool"),
        ("workloadclass", WorkloadClass, "class"),
        ("team", Team, "team"),
        ("policyprofile", PolicyProfile, "profile"),
    ):
        if ids := by_type.get(kind):
            put(
                kind,
                (
                    (pk, f"{word} {n}")
                    for pk, n in model.objects.filter(pk__in=ids).values_list("pk", "name")
                ),
            )
    if ids := by_type.get("membership"):
        put(
            "membership",
            (
                (pk, f"{u} in team {t}")
                for pk, u, t in Membership.objects.filter(pk__in=ids).values_list(
                    "pk", "user__username", "team__name"
                )
            ),
        )
    if ids := by_type.get("user"):
        put(
            "user",
            (
                (pk, f"user {u}")
                for pk, u in get_user_model()
                .objects.filter(pk__in=ids)
                .values_list("pk", "username")
            ),
        )
    return names


def _fallback(e: AuditEvent) -> str:
    """A target whose row is gone: what the event itself says of it."""
    for data in (e.after, e.before):
        if isinstance(data, dict) and data.get("user"):
            team = f" in team {e.team.name}" if e.team_id and e.team else ""
            return f"{data['user']}{team}"
        if isinstance(data, dict) and data.get("name"):
            return f"{e.object_type} {data['name']}"
    return f"{e.object_type} {e.object_id} (deleted)"


def describe(events: list[AuditEvent]) -> list[AuditRow]:
    """Rows for the audit page and its CSV. `events` should come with `team` selected."""
    names = _targets(events)
    return [
        AuditRow(
            event=e,
            actor=e.actor_name,
            what=ACTIONS.get(e.action, e.action),
            target=names.get((e.object_type, e.object_id)) or _fallback(e),
            changes=_changes(e.before, e.after),
        )
        for e in events
    ]
