"""GPUs that pods Quartermaster did not create hold (Kueue's, another scheduler's, a bare
pod's): drawn and counted as foreign, never free, never booked twice."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.backends.base import InventoryDevice, InventoryNode
from portal.models import Allocation, Attempt, Device, DeviceCondition, Node, Pool
from portal.selectors.capacity import capacity_nodes, pool_summaries
from portal.selectors.overview import nodes_needing_attention
from portal.services.nodes import inventory_sync
from portal.tick.snapshot import build_snapshot
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db

NODE = "a100-01"


def _inventory(foreign: int) -> InventoryNode:
    """The node as the Kubernetes inventory reports it with `foreign` GPUs held by others:
    free devices first, the foreign ones last (portal.k8s.inventory._whole_devices)."""
    node = Node.objects.get(name=NODE)
    devices = list(node.devices.order_by("index"))
    n = len(devices)
    return InventoryNode(
        name=NODE,
        pool=node.pool.name,
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        devices=tuple(
            InventoryDevice(
                index=d.index,
                model=d.model,
                memory_mib=d.memory_mib,
                healthy=d.index < n - foreign,
                foreign=d.index >= n - foreign,
            )
            for d in devices
        ),
        labels=node.labels,
        ready=True,
    )


def _hold(world: World, device: Device) -> None:
    req = submit(world.bob, world.vision)
    attempt = Attempt.objects.create(
        request=req,
        number=1,
        state="running",
        pool=req.pool,
        nodes=[NODE],
        workload_name=f"qm-{req.pk}-1",
        namespace=req.team.namespace,
        gpus_milli=1000,
        admitted_at=timezone.now(),
    )
    Allocation.objects.create(attempt=attempt, device=device, slot="gpu")


@pytest.fixture
def world() -> World:
    return make_world()


def test_a_gpu_held_by_a_foreign_pod_is_drawn_and_counted_as_foreign(world: World) -> None:
    pool = Pool.objects.get(nodes__name=NODE)
    before = next(s for s in pool_summaries() if s["pool"] == pool)
    inventory_sync(nodes=[_inventory(foreign=2)])
    after = next(s for s in pool_summaries() if s["pool"] == pool)
    assert after["foreign"] == 2 and after["unhealthy"] == before["unhealthy"]
    assert after["free_milli"] == before["free_milli"] - 2000
    node = Node.objects.get(name=NODE)
    views = capacity_nodes([node])[0].devices
    foreign = [v for v in views if v.condition == DeviceCondition.FOREIGN]
    assert len(foreign) == 2
    assert all(v.healthy and [c.status for c in v.cells] == ["foreign"] for v in foreign)
    # the same through the API
    client = APIClient()
    client.force_authenticate(world.dave)
    pools = {p["name"]: p for p in client.get("/api/v1/pools/").json()}
    assert pools[pool.name]["foreign"] == 2
    r = client.get(f"/api/v1/capacity/?pool={pool.name}").json()["results"]
    cells = [c for n in r if n["name"] == NODE for d in n["devices"] for c in d["cells"]]
    assert sum(c["status"] == "foreign" for c in cells) == 2
    # held by others is not a sick node
    assert NODE not in {a.node.name for a in nodes_needing_attention(timezone.now())}
    # the tick does not place work there either
    snapshot, _ = build_snapshot(timezone.now())
    snap = next(n for n in snapshot.nodes if n.name == NODE)
    assert sum(not d.healthy for d in snap.devices) == 2
    # the pod ends: the devices come back
    inventory_sync(nodes=[_inventory(foreign=0)])
    assert not Device.objects.filter(node=node, foreign=True).exists()
    assert (
        next(s for s in pool_summaries() if s["pool"] == pool)["free_milli"]
        == (before["free_milli"])
    )


def test_the_foreign_mark_never_lands_on_a_device_the_portal_holds(world: World) -> None:
    """The cluster counts only how many GPUs others hold. Marking the very device the portal
    books would leave one more device free in the books than there is: booked twice."""
    node = Node.objects.get(name=NODE)
    last = node.devices.order_by("-index").first()
    assert last is not None
    _hold(world, last)
    inventory_sync(nodes=[_inventory(foreign=1)])
    marked = list(Device.objects.filter(node=node, foreign=True).values_list("index", flat=True))
    assert marked == [last.index - 1]
    last.refresh_from_db()
    assert last.healthy and not last.foreign
    n = node.devices.count()
    snapshot, _ = build_snapshot(timezone.now())
    snap = next(x for x in snapshot.nodes if x.name == NODE)
    free = [d for d in snap.devices if d.healthy and d.index != last.index]
    # n devices: one the portal holds, one a foreign pod holds, the rest free
    assert len(free) == n - 2


def test_a_device_plugin_fault_stays_unhealthy_not_foreign(world: World) -> None:
    inv = _inventory(foreign=0)
    devices = list(inv.devices)
    devices[-1] = replace(devices[-1], healthy=False)
    inventory_sync(nodes=[replace(inv, devices=tuple(devices))])
    d = Device.objects.select_related("node").get(node__name=NODE, index=devices[-1].index)
    assert not d.foreign and d.condition(timezone.now()) == DeviceCondition.UNHEALTHY
