"""One usable-device rule, drawn on the capacity map, never counted free."""

from __future__ import annotations

from datetime import timedelta
from itertools import product
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import AuditEvent, Device, DeviceCondition, Node, Pool
from portal.selectors.capacity import capacity_nodes, pool_summaries
from portal.services.nodes import node_agent_report
from portal.tick.snapshot import build_snapshot
from tests.base import make_world

pytestmark = pytest.mark.django_db


def _first_pool_device(pool: str = "a100-train") -> Device:
    return (
        Device.objects.filter(node__pool__name=pool)
        .select_related("node")
        .order_by("node__name", "index")
        .first()
    )  # type: ignore[return-value]


def test_the_queryset_and_the_row_rule_agree_on_every_combination(settings: Any) -> None:
    make_world()
    now = timezone.now()
    device = _first_pool_device()
    node = device.node
    stale = now - timedelta(seconds=settings.HEARTBEAT_STALE_SECONDS + 5)
    for healthy, foreign, agent, quarantined, ready, cordoned, beat in product(
        (True, False),
        (True, False),
        (True, False),
        (True, False),
        (True, False),
        (True, False),
        (None, now, stale),
    ):
        Device.objects.filter(pk=device.pk).update(
            healthy=healthy, foreign=foreign, agent_healthy=agent, quarantined=quarantined
        )
        Node.objects.filter(pk=node.pk).update(ready=ready, cordoned=cordoned, last_heartbeat=beat)
        row = Device.objects.select_related("node").get(pk=device.pk)
        in_qs = Device.objects.usable(now).filter(pk=device.pk).exists()
        assert in_qs == (row.condition(now) == DeviceCondition.USABLE)


def test_a_quarantined_gpu_is_drawn_quarantined_and_not_counted_free() -> None:
    make_world()
    pool = Pool.objects.get(name="a100-train")
    before = next(s for s in pool_summaries() if s["pool"] == pool)
    assert before["free_milli"] == before["devices"] * 1000
    device = _first_pool_device()
    Device.objects.filter(pk=device.pk).update(quarantined=True, health_reason="critical Xid 79")
    after = next(s for s in pool_summaries() if s["pool"] == pool)
    assert after["free_milli"] == before["free_milli"] - 1000
    assert after["quarantined"] == 1
    view = capacity_nodes([device.node])[0]
    d = next(v for v in view.devices if v.index == device.index)
    assert d.condition == "quarantined" and not d.healthy
    assert [c.status for c in d.cells] == ["quarantined"]
    # The tick sees it as unhealthy too: the one rule.
    snapshot, _ = build_snapshot(timezone.now())
    node = next(n for n in snapshot.nodes if n.name == device.node.name)
    assert not next(x for x in node.devices if x.index == device.index).healthy


def test_unhealthy_and_stale_devices_are_drawn_as_such(settings: Any) -> None:
    make_world()
    device = _first_pool_device()
    Device.objects.filter(pk=device.pk).update(agent_healthy=False)
    d = capacity_nodes([device.node])[0].devices[device.index]
    assert [c.status for c in d.cells] == ["unhealthy"]
    Device.objects.filter(pk=device.pk).update(agent_healthy=True)
    Node.objects.filter(pk=device.node_id).update(
        last_heartbeat=timezone.now() - timedelta(seconds=settings.HEARTBEAT_STALE_SECONDS + 1)
    )
    node = Node.objects.get(pk=device.node_id)
    views = capacity_nodes([node])[0].devices
    assert {c.status for v in views for c in v.cells} == {"stale"}
    pool = next(s for s in pool_summaries() if s["pool"].pk == node.pool_id)
    assert pool["stale"] == len(views)
    assert pool["free_milli"] == (pool["devices"] - len(views)) * 1000


def test_a_healthy_report_does_not_clear_a_quarantine() -> None:
    make_world()
    device = _first_pool_device()
    report = {
        "node": device.node.name,
        "devices": [{"index": device.index, "xids": [{"xid": 79, "critical": True}]}],
    }
    node_agent_report(report=report)
    node_agent_report(
        report={"node": device.node.name, "devices": [{"index": device.index, "healthy": True}]}
    )
    device.refresh_from_db()
    assert device.quarantined and device.agent_healthy


def test_admins_clear_a_quarantine_on_the_page_and_through_the_api_audited() -> None:
    w = make_world()
    device = _first_pool_device()
    Device.objects.filter(pk=device.pk).update(quarantined=True, health_reason="critical Xid 79")
    page = Client()
    page.force_login(w.dave)
    r = page.get("/ops/capacity/")
    assert b"Clear quarantine" in r.content
    r = page.post(f"/ops/devices/{device.pk}/clear-quarantine/")
    assert r.status_code == 302
    device.refresh_from_db()
    assert not device.quarantined
    event = AuditEvent.objects.get(action="device.clear-quarantine")
    assert event.actor == w.dave and event.before["quarantined"] is True
    # Not quarantined any more: a clear error, nothing written.
    assert page.post(f"/ops/devices/{device.pk}/clear-quarantine/").status_code == 400

    Device.objects.filter(pk=device.pk).update(quarantined=True)
    api = APIClient()
    api.force_authenticate(w.bob)
    assert api.post(f"/api/v1/devices/{device.pk}/clear-quarantine/").status_code == 403
    member_page = Client()
    member_page.force_login(w.bob)
    assert member_page.post(f"/ops/devices/{device.pk}/clear-quarantine/").status_code == 403
    api.force_authenticate(w.dave)
    r = api.post(f"/api/v1/devices/{device.pk}/clear-quarantine/")
    assert r.status_code == 200 and r.json()["quarantined"] is False
    assert AuditEvent.objects.filter(action="device.clear-quarantine").count() == 2
    assert api.post("/api/v1/devices/999999/clear-quarantine/").status_code == 404
