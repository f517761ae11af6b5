"""The portal side of a cluster test: one whole-GPU training class, one pool, team-a with 16
GPUs of quota there and its member bob, with the inventory read from the cluster."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from portal.models import DeviceProfile, Membership, Pool, Quota, WorkloadClass
from portal.services.nodes import inventory_sync
from portal.services.teams import team_create


def training_world(pool_name: str, node_selector: dict[str, str]) -> dict[str, Any]:
    whole = DeviceProfile.objects.create(name="whole", kind="whole")
    training = WorkloadClass.objects.create(
        name="training",
        band=100,
        preemption="always",
        default_profile=whole,
        priority_class_name="quartermaster-training",
    )
    pool = Pool.objects.create(
        name=pool_name,
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_memory_mib=81920,
        node_selector=node_selector,
    )
    team = team_create(actor=None, name="team-a", namespace="team-a")
    Quota.objects.create(team=team, pool=pool, nominal_milli=16000)
    user = get_user_model().objects.create_user("bob", password="pw-bob-123")
    Membership.objects.create(user=user, team=team, role="member")
    inventory_sync()
    return {"user": user, "team": team, "pool": pool, "cls": training}
