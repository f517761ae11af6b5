"""The demo's autoscaled pool: a burst outgrows it, waits for provisioning, then runs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from portal.demo.seed import seed, submit_burst
from portal.models import GpuRequest, Node, NodeProvision, Pool
from portal.services.autoscale import autoscale_step
from portal.tick import waits as capacity
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick

pytestmark = pytest.mark.django_db

DEMO_CLUSTER = Path(settings.BASE_DIR) / "portal" / "demo" / "cluster.yaml"


def test_a_burst_shows_provisioning_time_then_new_nodes_then_the_requests_running() -> None:
    seed(path=str(DEMO_CLUSTER))
    pool = Pool.objects.get(name="h100-burst")
    assert pool.autoscaled and (pool.min_nodes, pool.max_nodes, pool.node_gpus) == (1, 4, 8)
    assert pool.nodes.count() == 1
    assert submit_burst(requests=3) == 3
    burst = list(GpuRequest.objects.filter(pool=pool).order_by("pk"))
    t0 = timezone.now()
    run_tick(t0)
    states = [GpuRequest.objects.get(pk=r.pk).state for r in burst]
    assert states.count(GpuRequest.State.ADMITTED) == 1

    autoscale_step(t0 + timedelta(seconds=3))
    provision = NodeProvision.objects.get(pool=pool)
    assert provision.nodes == 2
    run_tick(t0 + timedelta(seconds=6))
    waiting = [r for r in burst if GpuRequest.objects.get(pk=r.pk).state == "pending"]
    assert len(waiting) == 2
    assert {GpuRequest.objects.get(pk=r.pk).wait_reason for r in waiting} == {"provisioning"}

    ready = provision.ready_at + timedelta(seconds=1)
    autoscale_step(ready)
    assert pool.nodes.count() == 3
    run_tick(ready)
    reconcile()
    for r in waiting:
        r.refresh_from_db()
        assert r.state in (GpuRequest.State.ADMITTED, GpuRequest.State.RUNNING)
        split = capacity.split(r, ready)
        assert split["provisioning"] >= 15 and split["quota"] == split["unschedulable"] == 0
        assert (
            Node.objects.get(name=r.attempts.get().nodes[0]).labels["quartermaster.io/provision"]
            == provision.name
        )
