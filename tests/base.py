"""Personas and small builders for portal tests.

- alice: lead of team vision
- bob: member of team vision
- carol: member of team nlp; no access to vision's things
- dave: platform admin (staff), in no team
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser

from portal import services
from portal.demo import seed
from portal.models import GpuRequest, Membership, Pool, Team, WorkloadClass


@dataclass
class World:
    alice: AbstractUser
    bob: AbstractUser
    carol: AbstractUser
    dave: AbstractUser
    vision: Team
    nlp: Team


def make_world() -> World:
    """Demo pools, classes and quotas, plus the four personas."""
    seed()
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
    return services.gpu_request_submit(user=user, team=team, **defaults)
