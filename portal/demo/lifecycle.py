"""The demo's rollouts (docs/lifecycle.md): one that runs to the end on l4-shared, and one on
a100-train that halts when the simulated burn-in fails a100-03's NCCL test. The beat
(`portal.tasks.rollouts_tick`) advances them; their pages show them from start to finish."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from portal.models import Pool, Rollout
from portal.services.rollouts import rollout_start

#: (pool, kind, target, canary nodes, wave %)
DEMO_ROLLOUTS = [
    ("l4-shared", "driver", "550.127.05", 1, 50),
    ("a100-train", "driver", "550.127.05", 1, 50),
]


def start_demo_rollouts(admin_username: str = "admin") -> list[Rollout]:
    """Start the demo rollouts not started yet (safe to run twice)."""
    admin = get_user_model().objects.get(username=admin_username)
    started = []
    for pool_name, kind, target, canary, percent in DEMO_ROLLOUTS:
        pool = Pool.objects.filter(name=pool_name).first()
        if pool is None or Rollout.objects.filter(pool=pool, target=target).exists():
            continue
        started.append(
            rollout_start(
                actor=admin,
                pool=pool,
                kind=kind,
                target=target,
                canary_nodes=canary,
                wave_percent=percent,
                # the demo's work does not checkpoint: give up waiting after ten minutes
                drain_timeout_s=600,
            )
        )
    return started
