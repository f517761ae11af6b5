"""The demo: pools from the simulated cluster file, teams, users per role, a trickle of requests."""

from __future__ import annotations

import random
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from portal.backends.simulated import inventory_from_file, load_cluster
from portal.models import DeviceProfile, GpuRequest, Membership, Pool, Quota, Team, WorkloadClass
from portal.services.nodes import inventory_sync
from portal.services.profiles import policy_profile_ensure
from portal.services.requests import gpu_request_submit
from portal.services.teams import membership_set, team_create

DEMO_PASSWORD = "quartermaster"

# name, role in team, team, staff
DEMO_USERS = [
    ("admin", None, None, True),
    ("lead", "lead", "vision", False),
    ("researcher", "member", "vision", False),
    ("nlp-lead", "lead", "nlp", False),
    ("nlp-researcher", "member", "nlp", False),
    ("speech-researcher", "member", "speech", False),
    # in the auditors' group: reads every page and log, changes nothing
    ("auditor", "auditor", None, False),
]

CLASSES = [
    # name, band, preemption, min runtime, max queue, inference, description
    (
        "inference",
        300,
        "never",
        0,
        600,
        True,
        "Production model serving: latency objective, never preempted",
    ),
    ("interactive", 200, "when-borrowing", 300, 1800, False, "Notebooks and debugging sessions"),
    (
        "training",
        100,
        "always",
        600,
        0,
        False,
        "Batch training; checkpoint and expect preemption when borrowing",
    ),
]

# team -> {pool: nominal GPUs}
QUOTAS = {
    "vision": {"a100-train": 16, "h100-mig": 4, "l4-shared": 4, "h100-burst": 16},
    "nlp": {"a100-train": 12, "h100-mig": 8, "l4-shared": 4, "h100-burst": 16},
    "speech": {"a100-train": 4, "h100-mig": 4, "l4-shared": 4},
}

#: teams allowed the restricted inference class
INFERENCE_TEAMS = ("vision", "nlp")
#: the one pool the inference class runs in (serving workloads only)
INFERENCE_POOL = "h100-mig"

PROFILES = [
    ("whole", "whole", "", 1000, 0),
    ("mig-1g.10gb", "mig", "1g.10gb", 1000, 0),
    ("mig-2g.20gb", "mig", "2g.20gb", 1000, 0),
    ("mig-3g.40gb", "mig", "3g.40gb", 1000, 0),
    ("shared-250m-5gb", "shared", "", 250, 5120),
    ("shared-500m-10gb", "shared", "", 500, 10240),
]


@transaction.atomic
def seed(*, path: str | None = None) -> dict[str, Any]:
    """Create (or bring up to date) everything the demo needs. Safe to run twice."""
    cluster = load_cluster(path or settings.SIMULATED_CLUSTER)
    profiles = {}
    for name, kind, mig, milli, mem in PROFILES:
        profiles[name], _ = DeviceProfile.objects.update_or_create(
            name=name,
            defaults={"kind": kind, "mig_profile": mig, "milli": milli, "gpu_memory_mib": mem},
        )
    default_profile = {
        "inference": "mig-1g.10gb",
        "interactive": "shared-500m-10gb",
        "training": "whole",
    }
    for name, band, preemption, min_rt, max_q, inference, description in CLASSES:
        WorkloadClass.objects.update_or_create(
            name=name,
            defaults={
                "band": band,
                "preemption": preemption,
                "min_runtime_s": min_rt,
                "max_queue_s": max_q,
                "inference": inference,
                "description": description,
                "default_profile": profiles[default_profile[name]],
                "priority_class_name": f"quartermaster-{name}",
                "latency_objective_ms": 500 if inference else None,
            },
        )
    for spec in cluster["pools"]:
        Pool.objects.update_or_create(
            name=spec["name"],
            defaults={
                "gpu_model": spec["gpu_model"],
                "gpu_memory_mib": spec["gpu_memory_mib"],
                "architecture": spec.get("architecture", ""),
                "interconnect": spec.get("interconnect", "pcie"),
                "partitioning": spec.get("partitioning", "exclusive"),
                "time_slicing_replicas": spec.get("replicas", 1),
                "mig_layout": spec.get("mig_layout", []),
                "node_selector": spec.get("node_selector", {}),
                "taints": spec.get("taints", []),
                "inference_floor_milli": spec.get("inference_floor_milli", 0),
                **_autoscale(spec),
            },
        )
    inventory_sync(nodes=inventory_from_file(path or settings.SIMULATED_CLUSTER))
    # the shipped scheduling profile, active (the migration stored it unless the database was
    # emptied since)
    policy_profile_ensure()
    teams = {}
    for name in QUOTAS:
        teams[name] = Team.objects.filter(name=name).first() or team_create(actor=None, name=name)
    # Production inference is not for everyone: only these teams serve models.
    inference_class = WorkloadClass.objects.get(name="inference")
    if not inference_class.restricted:
        inference_class.restricted = True
        inference_class.save(update_fields=["restricted"])
        inference_class.teams.set([teams[t] for t in INFERENCE_TEAMS])
    # ... and only models, only on the MIG pool: batch work in it would jump every queue.
    if not inference_class.kinds:
        inference_class.kinds = [GpuRequest.Kind.SERVING.value]
        inference_class.save(update_fields=["kinds"])
        inference_class.pools.set(Pool.objects.filter(name=INFERENCE_POOL))
    for team_name, per_pool in QUOTAS.items():
        for pool_name, gpus in per_pool.items():
            if not Pool.objects.filter(name=pool_name).exists():
                continue  # a cluster file without this pool
            Quota.objects.update_or_create(
                team=teams[team_name],
                pool=Pool.objects.get(name=pool_name),
                defaults={
                    "nominal_milli": gpus * 1000,
                    "granted_milli": gpus * 1000,
                    "borrowing_limit_milli": gpus * 1000,
                },
            )
    User = get_user_model()
    for username, role, user_team, staff in DEMO_USERS:
        user, created = User.objects.get_or_create(
            username=username, defaults={"is_staff": staff, "is_superuser": staff}
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        if role == "auditor":
            group, _ = Group.objects.get_or_create(name=settings.AUDITOR_GROUP)
            user.groups.add(group)
        if user_team and not Membership.objects.filter(user=user, team=teams[user_team]).exists():
            membership_set(actor=None, team=teams[user_team], user=user, role=role or "member")
    serving_demo()
    return {"users": [u[0] for u in DEMO_USERS], "password": DEMO_PASSWORD}


def serving_demo() -> GpuRequest | None:
    """One serving workload (vision's chat model, two replicas), unless one is live already."""
    live = GpuRequest.objects.filter(kind=GpuRequest.Kind.SERVING).exclude(
        state__in=GpuRequest.TERMINAL_STATES
    )
    if live.exists():
        return None
    lead = get_user_model().objects.get(username="lead")
    return gpu_request_submit(
        user=lead,
        team=Team.objects.get(name="vision"),
        workload_class=WorkloadClass.objects.get(name="inference"),
        pool=Pool.objects.get(name="h100-mig"),
        profile_kind="mig",
        mig_profile="1g.10gb",
        pods=2,
        image="vllm/vllm-openai:v0.6.3",
        kind="serving",
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        model_revision="2024-07-23",
        runtime="vllm",
        name="vision-chat",
    )


# (class, profile kind, mig profile, milli, memory cap, count, pool or None, minutes)
SYNTHETIC = [
    ("training", "whole", "", 1000, 0, 1, "a100-train", 30),
    ("training", "whole", "", 1000, 0, 2, "a100-train", 45),
    ("training", "whole", "", 1000, 0, 4, "a100-train", 60),
    ("training", "whole", "", 1000, 0, 8, "a100-train", 90),
    # (the inference class takes serving workloads only: serving_demo() submits one)
    ("interactive", "mig", "1g.10gb", 1000, 0, 1, "h100-mig", 40),
    ("interactive", "mig", "3g.40gb", 1000, 0, 1, "h100-mig", 60),
    ("interactive", "shared", "", 500, 10240, 1, "l4-shared", 20),
    ("interactive", "shared", "", 250, 5120, 1, "l4-shared", 15),
    ("training", "whole", "", 1000, 0, 1, None, 20),
]


def submit_synthetic(*, rng: random.Random, limit_pending: int = 25) -> int:
    """Submit one synthetic request as a random demo researcher. Returns how many were submitted."""
    if GpuRequest.objects.filter(state=GpuRequest.State.PENDING).count() >= limit_pending:
        return 0
    members = list(Membership.objects.select_related("user", "team"))
    if not members:
        return 0
    m = rng.choice(members)
    allowed = {c.name for c in WorkloadClass.objects.all() if c.open_to(m.team)}
    cls, kind, mig, milli, mem, count, pool, minutes = rng.choice(
        [s for s in SYNTHETIC if s[0] in allowed]
    )
    fails = rng.random() < 0.1
    gpu_request_submit(
        user=m.user,
        team=m.team,
        workload_class=WorkloadClass.objects.get(name=cls),
        pool=Pool.objects.get(name=pool) if pool else None,
        profile_kind=kind,
        mig_profile=mig,
        milli=milli,
        gpu_memory_mib=mem,
        count=count,
        image="registry.example.com/demo/train:1.0",
        command=["python", "train.py"] + (["exit", "1"] if fails else []),
        estimated_runtime_s=minutes * 60,
        checkpoint_interval_s=600 if cls == "training" else 0,
        name=f"{cls}-{rng.randrange(1000, 9999)}",
    )
    return 1


def _autoscale(spec: dict[str, Any]) -> dict[str, Any]:
    """An autoscaled pool's settings from its cluster-file entry (none: not autoscaled)."""
    auto = spec.get("autoscale")
    if not auto:
        return {"autoscaled": False}
    nodes = spec["nodes"]
    return {
        "autoscaled": True,
        "min_nodes": int(auto.get("min_nodes", 0)),
        "max_nodes": int(auto["max_nodes"]),
        "node_gpus": int(nodes.get("gpus", 8)),
        "node_cpu_milli": int(nodes.get("cpu_milli", 64000)),
        "node_memory_mib": int(nodes.get("memory_mib", 512 * 1024)),
        "idle_release_s": int(auto.get("idle_release_s", 600)),
    }


def submit_burst(*, requests: int = 3, pool: str = "h100-burst") -> int:
    """A burst of whole-node training requests that outgrows the autoscaled pool: they wait
    for `provisioning`, the pool adds nodes, and they run. Returns how many were submitted."""
    target = Pool.objects.filter(name=pool, autoscaled=True).first()
    member = (
        Membership.objects.filter(team__quotas__pool=target)
        .select_related("user", "team")
        .order_by("team__name", "user__username")
        .first()
    )
    if target is None or member is None:
        return 0
    for i in range(requests):
        gpu_request_submit(
            user=member.user,
            team=member.team,
            workload_class=WorkloadClass.objects.get(name="training"),
            pool=target,
            profile_kind="whole",
            count=target.node_gpus,
            image="registry.example.com/demo/train:1.0",
            command=["python", "train.py"],
            estimated_runtime_s=30 * 60,
            checkpoint_interval_s=600,
            name=f"burst-{i + 1}",
        )
    return requests
