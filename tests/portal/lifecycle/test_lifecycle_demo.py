"""The demo's rollouts, on the demo cluster, from their start to their end as their pages
show them (docs/lifecycle.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

import portal.backends
from portal.backends.simulated import SimulatedBackend
from portal.demo.lifecycle import start_demo_rollouts
from portal.demo.seed import seed
from portal.models import Node, Rollout
from portal.services.rollouts import rollouts_advance
from portal.tick.reconcile import reconcile

pytestmark = pytest.mark.django_db(transaction=True)

DEMO = Path(portal.__file__).resolve().parent / "demo" / "cluster.yaml"


def test_the_demo_rollouts_run_to_their_end_on_their_pages(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.SIMULATED_CLUSTER = str(DEMO)
    settings.SIMULATED_VALIDATION_SECONDS = 0
    backend = SimulatedBackend(DEMO)
    monkeypatch.setattr(portal.backends, "_backend", lambda name: backend)
    seed(path=str(DEMO))
    started = start_demo_rollouts()
    assert [r.pool.name for r in started] == ["l4-shared", "a100-train"]
    assert start_demo_rollouts() == []  # safe to run twice
    admin = Client()
    admin.force_login(get_user_model().objects.get(username="admin"))
    pages = {r.pool.name: f"/ops/rollouts/{r.pk}/" for r in started}
    first = admin.get(pages["l4-shared"]).content.decode()
    assert "running" in first and 'hx-trigger="every 3s"' in first
    for _ in range(40):
        rollouts_advance()
        reconcile()
        if not Rollout.objects.filter(state=Rollout.State.RUNNING).exists():
            break
    l4 = admin.get(pages["l4-shared"]).content.decode()
    assert '<span class="badge succeeded">succeeded</span>' in l4
    assert "rollout.succeed" in l4 and "every 3s" not in l4
    a100 = admin.get(pages["a100-train"]).content.decode()
    assert '<span class="badge halted">halted</span>' in a100 and "NCCL all-reduce" in a100
    assert Node.objects.get(name="l4-03").software["driver"] == "550.127.05"
    assert Node.objects.get(name="a100-03").cordoned
