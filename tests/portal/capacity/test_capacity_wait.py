"""Where the wait went: each request's wait split by reason, through real ticks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.backends.base import Outcome, WorkloadStatus
from portal.models import GpuRequest, Node, NodeProvision, Pool, Quota
from portal.services.attempts import attempt_observe
from portal.services.autoscale import autoscale_step
from portal.services.pools import pool_update
from portal.tick import waits as capacity
from portal.tick.run import run_tick
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


def _at(req: GpuRequest, when: object) -> None:
    GpuRequest.objects.filter(pk=req.pk).update(created_at=when)


def _split(req: GpuRequest, now: object) -> dict[str, int]:
    req.refresh_from_db()
    return capacity.split(req, now)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "provisioning", "reason"),
    [
        ("borrowing-limit", False, "quota"),
        ("cohort-exhausted", False, "quota"),
        ("inference-floor", False, "quota"),
        ("member-cap", False, "quota"),
        ("no-capacity", False, "capacity"),
        ("preempting", False, "capacity"),
        ("awaiting-stop", False, "capacity"),
        ("no-capacity", True, "provisioning"),
        ("awaiting-nodes", True, "provisioning"),
        ("awaiting-nodes", False, "unschedulable"),
        ("pool-maintenance", False, "unschedulable"),
        ("backoff", False, "backoff"),
        ("borrowing-limit", True, "quota"),
    ],
)
def test_it_classifies_each_wait_code(code: str, provisioning: bool, reason: str) -> None:
    assert capacity.reason_of(code, provisioning) == reason


def test_it_splits_a_wait_into_quota_then_capacity_and_closes_it_on_admission() -> None:
    w = make_world()
    t0 = timezone.now()
    Quota.objects.filter(team=w.vision, pool__name="a100-train").update(
        nominal_milli=0, borrowing_limit_milli=0
    )
    req = submit(w.bob, w.vision, count=8)
    _at(req, t0)
    run_tick(t0 + timedelta(seconds=30))
    run_tick(t0 + timedelta(seconds=90))
    req.refresh_from_db()
    assert req.status_code == "borrowing-limit" and req.wait_reason == "quota"
    assert _split(req, t0 + timedelta(seconds=100))["quota"] == 100

    # The quota is raised but every node is cordoned: the wait goes on, for capacity.
    Quota.objects.filter(team=w.vision, pool__name="a100-train").update(nominal_milli=16000)
    Node.objects.filter(pool__name="a100-train").update(cordoned=True)
    run_tick(t0 + timedelta(seconds=120))
    run_tick(t0 + timedelta(seconds=150))
    req.refresh_from_db()
    assert req.status_code == "no-capacity" and req.wait_reason == "capacity"
    assert req.wait_quota_s == 120

    Node.objects.filter(pool__name="a100-train").update(cordoned=False)
    run_tick(t0 + timedelta(seconds=200))
    req.refresh_from_db()
    assert req.state == GpuRequest.State.ADMITTED and req.wait_reason == ""
    split = _split(req, t0 + timedelta(seconds=5000))
    assert split == {
        "unschedulable": 0,
        "quota": 120,
        "capacity": 80,
        "provisioning": 0,
        "backoff": 0,
    }


def test_a_requeued_request_waits_in_backoff_then_starts_over() -> None:
    w = make_world()
    req = submit(w.bob, w.vision, count=1)
    t0 = timezone.now()
    run_tick(t0)
    attempt = req.attempts.get()
    attempt_observe(
        attempt_id=attempt.pk, status=WorkloadStatus("x", "y", Outcome.NODE_LOST), now=t0
    )
    req.refresh_from_db()
    assert req.state == GpuRequest.State.PENDING and req.wait_reason == "backoff"
    assert req.requeue_at is not None
    back = req.requeue_at + timedelta(seconds=1)
    run_tick(back)
    req.refresh_from_db()
    assert req.state == GpuRequest.State.ADMITTED
    # Requeued at t0, started again at the first tick after its backoff ended.
    assert req.wait_backoff_s == int((back - t0).total_seconds()) > 0
    assert req.wait_capacity_s == 0 and req.wait_reason == ""


def _autoscaled(name: str = "a100-train", max_nodes: int = 6) -> Pool:
    Pool.objects.filter(name=name).update(
        autoscaled=True, min_nodes=0, max_nodes=max_nodes, node_gpus=8, idle_release_s=300
    )
    return Pool.objects.get(name=name)


def test_an_outgrown_autoscaled_pool_shows_provisioning_then_new_nodes_then_the_work_running(
    settings: object,
) -> None:
    w = make_world()
    _autoscaled()
    Quota.objects.filter(team=w.vision, pool__name="a100-train").update(
        nominal_milli=48000, borrowing_limit_milli=0
    )
    t0 = timezone.now()
    first = [submit(w.bob, w.vision, count=8) for _ in range(4)]
    burst = [submit(w.bob, w.vision, count=8) for _ in range(2)]
    for r in first + burst:
        _at(r, t0)
    run_tick(t0)
    assert all(r.attempts.exists() for r in first)
    burst[0].refresh_from_db()
    assert burst[0].status_code == "no-capacity" and burst[0].wait_reason == "capacity"

    counts = autoscale_step(t0 + timedelta(seconds=10))
    provision = NodeProvision.objects.get()
    assert counts["asked"] == 1 and provision.nodes == 2 and not provision.atomic
    assert sorted(provision.request_ids) == sorted(r.pk for r in burst)
    run_tick(t0 + timedelta(seconds=10))
    burst[0].refresh_from_db()
    assert burst[0].wait_reason == "provisioning" and burst[0].wait_capacity_s == 10

    # Not ready yet: no nodes, nothing more asked for the same requests.
    assert autoscale_step(t0 + timedelta(seconds=15))["asked"] == 0
    assert Node.objects.filter(pool__name="a100-train").count() == 4
    ready = provision.ready_at + timedelta(seconds=1)
    assert autoscale_step(ready)["provisioned"] == 1
    assert Node.objects.filter(pool__name="a100-train").count() == 6
    run_tick(ready)
    for r in burst:
        r.refresh_from_db()
        assert r.state == GpuRequest.State.ADMITTED
        assert r.wait_provisioning_s == int((ready - (t0 + timedelta(seconds=10))).total_seconds())
        assert set(r.attempts.get().nodes) <= {f"{provision.name}-1", f"{provision.name}-2"}


def test_a_gang_asks_for_its_nodes_atomically_and_idle_added_nodes_are_released() -> None:
    w = make_world()
    _autoscaled()
    Node.objects.filter(pool__name="a100-train").update(cordoned=True)
    t0 = timezone.now()
    gang = submit(w.bob, w.vision, count=8, pods=2)
    _at(gang, t0)
    run_tick(t0)
    autoscale_step(t0)
    provision = NodeProvision.objects.get()
    assert provision.atomic and provision.nodes == 2 and provision.request_ids == [gang.pk]
    ready = provision.ready_at + timedelta(seconds=1)
    autoscale_step(ready)
    run_tick(ready)
    gang.refresh_from_db()
    assert gang.state == GpuRequest.State.ADMITTED

    # The gang ends; its nodes sit idle, and are released only after idle_release_s.
    attempt = gang.attempts.get()
    attempt_observe(
        attempt_id=attempt.pk, status=WorkloadStatus("x", "y", Outcome.SUCCEEDED), now=ready
    )
    assert autoscale_step(ready + timedelta(seconds=100))["released"] == 0
    assert autoscale_step(ready + timedelta(seconds=400))["released"] == 2
    added = Node.objects.filter(labels__has_key="quartermaster.io/provision")
    assert all(not n.ready and n.cordoned for n in added)


def test_a_shape_only_new_nodes_could_hold_waits_as_unschedulable_not_rejected() -> None:
    w = make_world()
    pool = _autoscaled(max_nodes=4)
    # The pool is full at its maximum: a 16-GPU pod fits no node, none may be added.
    req = submit(w.bob, w.vision, count=8)
    Pool.objects.filter(pk=pool.pk).update(node_gpus=16, max_nodes=5)
    big = GpuRequest.objects.get(pk=req.pk)
    GpuRequest.objects.filter(pk=big.pk).update(count=16)
    run_tick()
    big.refresh_from_db()
    assert big.state == GpuRequest.State.PENDING
    assert big.status_code == "awaiting-nodes" and big.wait_reason == "unschedulable"


def test_the_request_and_queue_pages_show_where_the_wait_went(client: Client) -> None:
    w = make_world()
    Quota.objects.filter(team=w.vision, pool__name="a100-train").update(
        nominal_milli=0, borrowing_limit_milli=0
    )
    t0 = timezone.now() - timedelta(seconds=600)
    req = submit(w.bob, w.vision, count=8)
    _at(req, t0)
    run_tick()
    client.force_login(w.bob)
    page = client.get(f"/requests/{req.pk}/").content.decode()
    assert 'data-testid="wait-quota"' in page and "10 min" in page
    queue = client.get("/queue/").content.decode()
    assert 'data-testid="queue-wait-quota"' in queue and "10 min" in queue
    # carol is not on vision: the queue she sees sums nothing of it
    client.force_login(w.carol)
    assert 'data-testid="queue-wait-quota"' not in client.get("/queue/").content.decode()


def _metrics() -> dict[str, float]:
    from django.test.utils import override_settings

    from portal.metrics.collector import metrics_text

    with override_settings(METRICS_REPLICA="web-0"):
        text = metrics_text().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("quartermaster_") and (
            "wait" in line or "demand" in line or "unfit" in line or "provisioning" in line
        ):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_metrics_export_the_wait_by_reason_pending_demand_and_nodes_being_added() -> None:
    w = make_world()
    _autoscaled(max_nodes=6)
    Node.objects.filter(pool__name="a100-train").update(cordoned=True)
    t0 = timezone.now() - timedelta(seconds=300)
    reqs = [submit(w.bob, w.vision, count=8), submit(w.bob, w.vision, count=4)]
    shared = submit(w.bob, w.vision, pool_name="l4-shared", profile_kind="shared", milli=500)
    Quota.objects.filter(team=w.vision, pool__name="l4-shared").update(
        nominal_milli=0, borrowing_limit_milli=0
    )
    for r in [*reqs, shared]:
        _at(r, t0)
    run_tick(t0 + timedelta(seconds=100))
    autoscale_step(t0 + timedelta(seconds=100))
    run_tick(t0 + timedelta(seconds=200))
    m = _metrics()

    def wait(reason: str, pool: str = "a100-train") -> float:
        return m[
            f'quartermaster_request_wait_seconds{{class="training",pool="{pool}",'
            f'reason="{reason}",team="vision"}}'
        ]

    # 2 requests × 200 s for capacity (stretch closed), then 100 s each provisioning so far
    assert wait("capacity") == 400
    provisioning = wait("provisioning")
    assert 200 <= provisioning <= 260
    oldest = 'quartermaster_request_wait_oldest_seconds{pool="a100-train",reason="provisioning"}'
    assert m[oldest] >= 100
    assert wait("quota", "l4-shared") >= 300
    assert m['quartermaster_pending_demand_gpus{pool="a100-train",profile="whole"}'] == 12
    assert m['quartermaster_pending_demand_gpus{pool="l4-shared",profile="shared-500m"}'] == 0.5
    assert m['quartermaster_pending_unfit_gpus{pool="a100-train",profile="whole"}'] == 0
    assert m['quartermaster_provisioning_nodes{pool="a100-train"}'] == 2


def test_the_api_reports_pending_demand_per_pool_and_profile_scoped_to_the_caller(
    client: Client,
) -> None:
    w = make_world()
    _autoscaled()
    Node.objects.filter(pool__name="a100-train").update(cordoned=True)
    submit(w.bob, w.vision, count=8)
    big = submit(w.bob, w.vision, count=8)
    submit(w.carol, w.nlp, count=2)
    Pool.objects.filter(name="a100-train").update(node_gpus=16)
    GpuRequest.objects.filter(pk=big.pk).update(count=12)
    run_tick()
    autoscale_step()
    client.force_login(w.bob)
    rows = client.get("/api/v1/capacity/demand/").json()
    assert rows == [
        {
            "pool": "a100-train",
            "profile": "whole",
            "requests": 2,
            "units": 20,
            "gpus_milli": 20000,
            "unfit_requests": 1,
            "unfit_gpus_milli": 12000,
            "provisioning_nodes": 2,
        }
    ]
    client.force_login(w.dave)
    (row,) = client.get("/api/v1/capacity/demand/").json()
    assert row["requests"] == 3 and row["gpus_milli"] == 22000


def test_autoscale_settings_are_changed_through_the_audited_service() -> None:
    from django.core.exceptions import ValidationError

    from portal.models import AuditEvent, PolicyVersion

    w = make_world()
    pool = Pool.objects.get(name="a100-train")
    pool_update(actor=w.dave, pool=pool, autoscaled=True, min_nodes=2, max_nodes=6)
    event = AuditEvent.objects.get(action="pool.update")
    assert event.before["autoscaled"] is False and event.after["max_nodes"] == 6
    assert PolicyVersion.objects.filter(action="pool.update").exists()
    with pytest.raises(ValidationError) as err:
        pool_update(actor=w.dave, pool=pool, min_nodes=8)
    assert "max_nodes" in err.value.message_dict
    assert Pool.objects.get(pk=pool.pk).min_nodes == 2
