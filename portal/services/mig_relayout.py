"""Dynamic MIG re-layout for the pool page (docs/lifecycle.md): demand per MIG profile from
the pool's learned request shapes (ShapeHistory) and its pending requests, the layout
`scheduling.relayout.propose` finds for it, and the mig-parted config that applies it
through a MIG-layout rollout (`nvidia.com/mig.config`)."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.utils import timezone

from portal.models import GpuRequest, Pool, ShapeHistory
from scheduling import mig, relayout
from scheduling import types as st
from scheduling.workload import ShapeHistory as History


def mig_demand(pool: Pool) -> dict[str, float]:
    """Weight per MIG profile: the learned shapes' weights normalised to the pending count
    (so history and queue count alike), plus one per pending instance."""
    learned: dict[str, float] = {}
    row = ShapeHistory.objects.filter(pool=pool).first()
    if row is not None:
        now_ms = int(timezone.now().timestamp() * 1000)
        for shape, w in History.from_dict(row.histogram).weights(now_ms).items():
            if shape.kind is st.ProfileKind.MIG and shape.mig_profile:
                learned[shape.mig_profile] = (
                    learned.get(shape.mig_profile, 0.0) + w * shape.count * shape.pods
                )
    pending: dict[str, float] = {}
    for profile, count, pods in (
        GpuRequest.objects.filter(state=GpuRequest.State.PENDING, profile_kind="mig")
        .filter(pool=pool)
        .values_list("mig_profile", "count", "pods")
    ):
        pending[profile] = pending.get(profile, 0.0) + count * pods
    scale = (sum(pending.values()) or 1.0) / (sum(learned.values()) or 1.0)
    out = {p: w * scale for p, w in learned.items()}
    for p, n in pending.items():
        out[p] = out.get(p, 0.0) + n
    return out


def config_name(profiles: tuple[str, ...]) -> str:
    """A mig-parted config name for the layout (a label value: no '+', at most 63)."""
    name = "qm-" + "-".join(p.replace("+", "_") for p in profiles)
    return re.sub(r"[^-A-Za-z0-9_.]", "-", name)[:63].rstrip("-_.")


def config_yaml(name: str, profiles: tuple[str, ...]) -> str:
    """The mig-parted ConfigMap entry (`mig-configs:`) the GPU Operator's mig-manager reads."""
    counts: dict[str, int] = {}
    for p in profiles:
        counts[p] = counts.get(p, 0) + 1
    lines = [f"{name}:", "  - devices: all", "    mig-enabled: true", "    mig-devices:"]
    lines += [f'      "{p}": {n}' for p, n in counts.items()]
    return "\n".join(lines)


def relayout_allowed(pool: Pool) -> bool:
    allowed = settings.MIG_RELAYOUT_POOLS
    return pool.partitioning == Pool.Partitioning.MIG and ("*" in allowed or pool.name in allowed)


def proposal_for(pool: Pool) -> dict[str, Any] | None:
    """What the pool page shows; None for a pool without MIG or without MIG demand."""
    if pool.partitioning != Pool.Partitioning.MIG:
        return None
    family = mig.family_for(pool.gpu_model, pool.gpu_memory_mib)
    if family is None:
        return None
    demand = mig_demand(pool)
    proposal = relayout.propose(family, demand)
    if proposal is None:
        return None
    name = config_name(proposal.profiles)
    total = sum(demand.values()) or 1.0
    current = list(pool.mig_layout or [])
    return {
        "profiles": list(proposal.profiles),
        "demand": sorted(((p, 100 * w / total) for p, w in demand.items()), key=lambda kv: -kv[1]),
        "idle_now": relayout.idle_of(family, current) if current else None,
        "idle_proposed": proposal.idle,
        "same": sorted(current) == sorted(proposal.profiles),
        "config_name": name,
        "config_yaml": config_yaml(name, proposal.profiles),
        "allowed": relayout_allowed(pool),
    }
