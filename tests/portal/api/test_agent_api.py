"""The node agent's report endpoint and the readiness check of starting Jobs (FI-15, FI-20)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.lib.readiness import attempt_token, ready_token_key
from portal.models import Decision, Device, Node
from portal.tick.run import run_tick
from portal.tick.snapshot import build_snapshot
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db
TOKEN = "agent-token-for-tests"


def _report(node: str = "a100-01", **device: object) -> dict[str, object]:
    devices = [
        {
            "index": i,
            "uuid": f"GPU-{node}-{i}",
            "memory_total_mib": 81920,
            "memory_used_mib": 0,
            "utilization_pct": 0,
            "healthy": True,
            "xids": [],
            "processes": [],
            "mig": [],
        }
        for i in range(8)
    ]
    devices[0].update(device)
    return {
        "node": node,
        "agent_version": "test",
        "sent_at": timezone.now().isoformat(),
        "devices": devices,
    }


def _post(client: Client, body: object, token: str = TOKEN) -> object:
    return client.post(
        "/api/v1/agent/report/",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


@pytest.fixture
def agent(settings: object) -> Client:
    settings.NODE_AGENT_TOKEN = TOKEN  # type: ignore[attr-defined]
    make_world()
    return Client(enforce_csrf_checks=True)


def test_it_refuses_a_bad_token_and_stores_nothing(agent: Client) -> None:
    resp = _post(agent, _report(), token="wrong")
    assert resp.status_code == 401  # type: ignore[attr-defined]
    assert Node.objects.get(name="a100-01").last_heartbeat is None


def test_it_names_the_field_of_a_bad_report(agent: Client) -> None:
    resp = _post(agent, {"node": "a100-01", "devices": "nope"})
    assert resp.status_code == 400  # type: ignore[attr-defined]
    assert "devices" in resp.json()["errors"]  # type: ignore[attr-defined]
    assert _post(agent, {"node": "nowhere", "devices": []}).status_code == 400  # type: ignore[attr-defined]


def test_it_records_heartbeat_and_readings(agent: Client) -> None:
    resp = _post(agent, _report(memory_used_mib=1234, utilization_pct=55))
    assert resp.status_code == 202  # type: ignore[attr-defined]
    node = Node.objects.get(name="a100-01")
    assert node.last_heartbeat is not None
    d = Device.objects.get(node=node, index=0)
    assert (d.memory_used_mib, d.utilization_pct, d.uuid) == (1234, 55, "GPU-a100-01-0")


def test_it_quarantines_a_device_after_a_critical_xid_and_stops_packing_it(agent: Client) -> None:
    _post(agent, _report(xids=[{"xid": 79, "critical": True, "at": timezone.now().isoformat()}]))
    d = Device.objects.get(node__name="a100-01", index=0)
    assert d.quarantined and "79" in d.health_reason
    assert Decision.objects.filter(code="quarantined").exists()
    snapshot, _ = build_snapshot(timezone.now())
    node = next(n for n in snapshot.nodes if n.name == "a100-01")
    assert node.devices[0].healthy is False and node.devices[1].healthy is True


def test_an_application_xid_does_not_quarantine(agent: Client) -> None:
    _post(agent, _report(xids=[{"xid": 13, "critical": False, "at": timezone.now().isoformat()}]))
    assert not Device.objects.get(node__name="a100-01", index=0).quarantined


def test_a_stray_process_keeps_its_device_out_of_packing(agent: Client) -> None:
    _post(agent, _report(memory_used_mib=20000, processes=[{"pid": 42, "used_memory_mib": 20000}]))
    snapshot, _ = build_snapshot(timezone.now())
    node = next(n for n in snapshot.nodes if n.name == "a100-01")
    assert node.devices[0].healthy is False


def test_a_stale_heartbeat_takes_the_node_out_of_packing(agent: Client, settings: object) -> None:
    _post(agent, _report())
    later = timezone.now() + timedelta(seconds=settings.HEARTBEAT_STALE_SECONDS + 5)  # type: ignore[attr-defined]
    snapshot, _ = build_snapshot(later)
    assert next(n for n in snapshot.nodes if n.name == "a100-01").ready is False
    snapshot, _ = build_snapshot(timezone.now())
    assert next(n for n in snapshot.nodes if n.name == "a100-01").ready is True


def test_the_readiness_check_needs_the_attempts_token_and_a_free_device(agent: Client) -> None:
    from portal.models import Attempt, Membership

    bob = Membership.objects.get(user__username="bob").user
    req = submit(bob, Membership.objects.get(user__username="bob").team, pool_name="a100-train")
    run_tick()
    attempt = Attempt.objects.get(request=req)
    url = f"/api/v1/agent/attempts/{attempt.pk}/ready"
    token = attempt_token(ready_token_key(), attempt.namespace, attempt.workload_name, attempt.pk)
    assert agent.get(url, HTTP_AUTHORIZATION="Bearer nope").status_code == 403
    # No report from the node yet: not ready, with the reason.
    body = agent.get(url, HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert body["ready"] is False and "report" in body["reason"]
    node = attempt.nodes[0]
    index = attempt.allocations.first().device.index
    report = _report(node=node)
    report["devices"][index].update(
        processes=[{"pid": 7, "used_memory_mib": 900}], memory_used_mib=900
    )  # type: ignore[index]
    _post(agent, report)
    assert agent.get(url, HTTP_AUTHORIZATION=f"Bearer {token}").json()["ready"] is False
    _post(agent, _report(node=node))
    assert agent.get(url, HTTP_AUTHORIZATION=f"Bearer {token}").json() == {
        "ready": True,
        "reason": "",
    }
    # Another attempt's token, a made-up id, no token at all: one answer, which tells nothing.
    missing = Client().get("/api/v1/agent/attempts/999999/ready")
    assert missing.status_code == 403
    assert Client().get(url).status_code == 403
    assert Client().get(url).json() == missing.json()
    other = agent.get("/api/v1/agent/attempts/999999/ready", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert other.status_code == 403 and other.json() == missing.json()


def test_probes_answer_whatever_the_host(client: Client) -> None:
    assert client.get("/healthz", HTTP_HOST="10.1.2.3:8000").status_code == 200
    resp = client.get("/metrics", HTTP_HOST="10.1.2.3:8000")
    assert resp.status_code == 200
    text = resp.content.decode()
    for name in (
        "quartermaster_pending_requests",
        "quartermaster_scheduler_tick_duration_seconds_count",
        "quartermaster_scheduler_tick_failures_total",
        "quartermaster_admitted_requests_total",
    ):
        assert name in text


def test_metrics_ask_for_a_token_when_one_is_set(client: Client, settings: object) -> None:
    settings.METRICS_TOKEN = "m-token"  # type: ignore[attr-defined]
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer m-token").status_code == 200


def test_each_pod_of_a_gang_asks_about_its_own_node(agent: Client) -> None:
    from portal.models import Attempt, Membership

    bob = Membership.objects.get(user__username="bob").user
    team = Membership.objects.get(user__username="bob").team
    req = submit(bob, team, pool_name="a100-train", count=8, pods=2)
    run_tick()
    attempt = Attempt.objects.get(request=req)
    first, second = attempt.nodes
    url = f"/api/v1/agent/attempts/{attempt.pk}/ready"
    auth = {
        "HTTP_AUTHORIZATION": "Bearer "
        + attempt_token(ready_token_key(), attempt.namespace, attempt.workload_name, attempt.pk)
    }
    _post(agent, _report(node=first))
    assert agent.get(url + "?rank=0", **auth).json()["ready"] is True
    # Rank 1 runs on the other node, which has not reported yet.
    body = agent.get(url + "?rank=1", **auth).json()
    assert body["ready"] is False and "report" in body["reason"]
    _post(agent, _report(node=second))
    assert agent.get(url + "?rank=1", **auth).json()["ready"] is True
    assert agent.get(url + "?rank=2", **auth).status_code == 404
    assert agent.get(url + "?rank=x", **auth).status_code == 404


def test_a_jobset_pod_asks_about_the_node_it_landed_on(agent: Client) -> None:
    """A JobSet's pods share one template: they name their node (?node=), not a rank."""
    from portal.models import Attempt, Membership

    bob = Membership.objects.get(user__username="bob").user
    team = Membership.objects.get(user__username="bob").team
    req = submit(bob, team, pool_name="a100-train", count=8, pods=2)
    run_tick()
    attempt = Attempt.objects.get(request=req)
    first, second = attempt.nodes
    url = f"/api/v1/agent/attempts/{attempt.pk}/ready"
    auth = {
        "HTTP_AUTHORIZATION": "Bearer "
        + attempt_token(ready_token_key(), attempt.namespace, attempt.workload_name, attempt.pk)
    }
    _post(agent, _report(node=first))
    assert agent.get(url + f"?node={first}", **auth).json()["ready"] is True
    body = agent.get(url + f"?node={second}", **auth).json()
    assert body["ready"] is False and "report" in body["reason"]
    assert agent.get(url + "?node=not-in-this-gang", **auth).status_code == 404
