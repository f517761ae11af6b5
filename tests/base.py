"""The test world, personas and small builders for portal tests.

The world is built here, not from the demo seed (portal/demo/seed.py), so that the
demo can change without moving every test: device profiles, workload classes,
the pools and nodes of tests/world_cluster.yaml (the simulated cluster in
tests, set by tests/conftest.py), teams and their quotas.

- alice: lead of team vision
- bob: member of team vision
- carol: member of team nlp; no access to vision's things
- dave: platform admin (staff), in no team
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import transaction

from portal.backends.simulated import inventory_from_file, load_cluster
from portal.models import (
    DeviceProfile,
    GpuRequest,
    Membership,
    Pool,
    Quota,
    Team,
    WorkloadClass,
)
from portal.services.nodes import inventory_sync
from portal.services.requests import gpu_request_submit
from portal.services.teams import team_create

WORLD_CLUSTER = Path(__file__).resolve().parent / "world_cluster.yaml"

# name, kind, MIG profile, milli, memory cap (MiB)
PROFILES = [
    ("whole", "whole", "", 1000, 0),
    ("mig-1g.10gb", "mig", "1g.10gb", 1000, 0),
    ("mig-2g.20gb", "mig", "2g.20gb", 1000, 0),
    ("mig-3g.40gb", "mig", "3g.40gb", 1000, 0),
    ("shared-250m-5gb", "shared", "", 250, 5120),
    ("shared-500m-10gb", "shared", "", 500, 10240),
]
# name, band, preemption, min runtime s, max queue s, inference, default profile
CLASSES = [
    ("inference", 300, "never", 0, 600, True, "mig-1g.10gb"),
    ("interactive", 200, "when-borrowing", 300, 1800, False, "shared-500m-10gb"),
    ("training", 100, "always", 600, 0, False, "whole"),
]
# team -> {pool: nominal GPUs}; granted and borrowing limit are the same
QUOTAS = {
    "vision": {"a100-train": 16, "h100-mig": 4, "l4-shared": 4},
    "nlp": {"a100-train": 12, "h100-mig": 8, "l4-shared": 4},
    "speech": {"a100-train": 4, "h100-mig": 4, "l4-shared": 4},
}


@dataclass
class World:
    alice: AbstractUser
    bob: AbstractUser
    carol: AbstractUser
    dave: AbstractUser
    vision: Team
    nlp: Team


@transaction.atomic
def build_cluster() -> None:
    """Profiles, classes, pools, nodes, teams and quotas of the test world (no users)."""
    path = settings.SIMULATED_CLUSTER
    profiles = {
        name: DeviceProfile.objects.create(
            name=name, kind=kind, mig_profile=mig, milli=milli, gpu_memory_mib=mem
        )
        for name, kind, mig, milli, mem in PROFILES
    }
    for name, band, preemption, min_rt, max_q, inference, profile in CLASSES:
        WorkloadClass.objects.create(
            name=name,
            band=band,
            preemption=preemption,
            min_runtime_s=min_rt,
            max_queue_s=max_q,
            inference=inference,
            default_profile=profiles[profile],
            priority_class_name=f"quartermaster-{name}",
            latency_objective_ms=500 if inference else None,
        )
    for spec in load_cluster(path)["pools"]:
        Pool.objects.create(
            name=spec["name"],
            gpu_model=spec["gpu_model"],
            gpu_memory_mib=spec["gpu_memory_mib"],
            architecture=spec.get("architecture", ""),
            interconnect=spec.get("interconnect", "pcie"),
            partitioning=spec.get("partitioning", "exclusive"),
            time_slicing_replicas=spec.get("replicas", 1),
            mig_layout=spec.get("mig_layout", []),
            node_selector=spec.get("node_selector", {}),
            taints=spec.get("taints", []),
            inference_floor_milli=spec.get("inference_floor_milli", 0),
        )
    inventory_sync(nodes=inventory_from_file(path))
    pools = {p.name: p for p in Pool.objects.all()}
    for team_name, per_pool in QUOTAS.items():
        team = team_create(actor=None, name=team_name)
        for pool_name, gpus in per_pool.items():
            Quota.objects.create(
                team=team,
                pool=pools[pool_name],
                nominal_milli=gpus * 1000,
                granted_milli=gpus * 1000,
                borrowing_limit_milli=gpus * 1000,
            )


def make_world() -> World:
    """The test world's cluster, classes and quotas, plus the four personas."""
    build_cluster()
    User = get_user_model()
    vision, nlp = Team.objects.get(name="vision"), Team.objects.get(name="nlp")
    alice = User.objects.create_user("alice", password="pw-alice-123")
    bob = User.objects.create_user("bob", password="pw-bob-123")
    carol = User.objects.create_user("carol", password="pw-carol-123")
    dave = User.objects.create_user("dave", password="pw-dave-123", is_staff=True)
    Membership.objects.create(user=alice, team=vision, role="lead")
    Membership.objects.create(user=bob, team=vision, role="member")
    Membership.objects.create(user=carol, team=nlp, role="member")
    return World(alice, bob, carol, dave, vision, nlp)


def submit(user: Any, team: Team, **kw: Any) -> GpuRequest:
    """Submit through the service with sensible defaults: one whole A100 for training."""
    defaults: dict[str, Any] = {
        "workload_class": WorkloadClass.objects.get(name=kw.pop("cls", "training")),
        "pool": Pool.objects.get(name=kw.pop("pool_name", "a100-train")),
        "image": "registry.example.com/vision/train:1.0",
        "command": ["python", "train.py"],
        "estimated_runtime_s": 3600,
    }
    defaults.update(kw)
    return gpu_request_submit(user=user, team=team, **defaults)


def submit_serving(user: Any, team: Team, **kw: Any) -> GpuRequest:
    """A serving workload on one 1g.10gb MIG slice of h100-mig; the runtime's image runs it."""
    defaults: dict[str, Any] = {
        "cls": "inference",
        "pool_name": "h100-mig",
        "profile_kind": "mig",
        "mig_profile": "1g.10gb",
        "kind": "serving",
        "command": [],
    }
    return submit(user, team, **{**defaults, **kw})


def api_secret(user: Any, scope: str | None = None) -> str:
    """A fresh personal token's secret for `user`, made directly (no audit event): by default
    with the widest scope the user may hold (admin for staff, read for auditors)."""
    from datetime import timedelta

    from django.utils import timezone

    from portal import access
    from portal.lib.tokens import token_digest, token_secret_new, token_shown
    from portal.models import PersonalToken

    if scope is None:
        scope = "admin" if user.is_staff else "read" if access.is_read_only(user) else "read+submit"
    secret = token_secret_new()
    PersonalToken.objects.create(
        user=user,
        name="test",
        prefix=token_shown(secret),
        digest=token_digest(secret),
        scope=scope,
        expires_at=timezone.now() + timedelta(days=1),
    )
    return secret
