"""Admin and lead pages: the audit log in words, its filters and CSV, confirmations with a
reason, bulk actions, and the pool settings as plain fields."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from portal.models import AuditEvent, GpuRequest, Node, PolicyProfile, Pool, Quota, WorkloadClass
from portal.selectors.audit_words import describe
from portal.services.nodes import node_cordon, node_drain
from portal.services.teams import quota_set
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def login(user) -> Client:  # noqa: ANN001
    c = Client()
    c.force_login(user)
    return c


def _quota_change(world: World, nominal: int = 12000) -> Quota:
    a100 = Pool.objects.get(name="a100-train")
    return quota_set(
        actor=world.dave,
        team=world.vision,
        pool=a100,
        nominal_milli=nominal,
        borrowing_limit_milli=4500,
        reason="new project",
    )


def test_it_shows_the_audit_log_in_words(world: World) -> None:
    _quota_change(world)
    node = Node.objects.filter(pool__name="a100-train").first()
    node_cordon(actor=world.dave, node=node, reason="fan noise")
    r = login(world.dave).get(reverse("portal:audit"))
    body = r.content.decode()
    assert r.status_code == 200
    assert "changed a quota" in body and "vision in pool a100-train" in body
    # GPUs, not thousandths; old → new; the reason.
    assert '16 GPUs</span> → <span class="new">12 GPUs' in body
    assert 'borrowing limit: <span class="old">16 GPUs</span> → <span class="new">4.5 GPUs' in body
    assert "new project" in body
    assert f"cordoned a node: <strong>node {node.name} (pool a100-train)" in body
    assert "fan noise" in body
    assert "nominal_milli" not in body and "12000" not in body


def test_it_names_every_row_with_a_fixed_number_of_queries(world: World) -> None:
    c = login(world.dave)
    _quota_change(world)
    c.get(reverse("portal:audit"))
    with CaptureQueriesContext(connection) as few:
        c.get(reverse("portal:audit"))
    for n in range(30):
        _quota_change(world, nominal=1000 * (n % 10))
        node_cordon(actor=world.dave, node=Node.objects.order_by("pk")[n % 4], reason=f"r{n}")
        submit(world.bob, world.vision, name=f"job-{n}")
    with CaptureQueriesContext(connection) as many:
        r = c.get(reverse("portal:audit"))
    assert r.status_code == 200 and len(r.context["rows"]) == 50
    assert len(many.captured_queries) <= len(few.captured_queries) + 3, [
        q["sql"] for q in many.captured_queries
    ]


def test_it_filters_the_audit_log_by_text_and_date(world: World) -> None:
    _quota_change(world)
    node = Node.objects.filter(pool__name="h100-mig").first() or Node.objects.first()
    node_drain(actor=world.dave, node=node, reason="bad DIMM")
    submit(world.bob, world.vision, name="resnet")
    c = login(world.dave)

    def actions(**params: str) -> set[str]:
        r = c.get(reverse("portal:audit"), params)
        assert r.status_code == 200, r.content
        return {row.event.action for row in r.context["rows"]}

    # A pool name finds the quota changes in it (the event itself only holds ids).
    assert actions(q="a100-train") >= {"quota.set"}
    assert "node.drain" not in actions(q="a100-train") or node.pool.name == "a100-train"
    assert actions(q="DIMM") == {"node.drain"}
    assert actions(q="drained") == {"node.drain"}
    assert actions(q="bob") == {"request.submit"}
    today = timezone.now().date()
    assert actions(date_from=str(today), date_to=str(today)) >= {"quota.set", "node.drain"}
    assert actions(date_to=str(today - timedelta(days=1))) == set()
    assert actions(date_from=str(today + timedelta(days=1))) == set()
    # A bad date or a backwards range: 400 naming the field, not a crash.
    r = c.get(reverse("portal:audit"), {"date_from": "yesterday"})
    assert r.status_code == 400 and "Enter a valid date" in r.content.decode()
    r = c.get(reverse("portal:audit"), {"date_from": str(today), "date_to": "2000-01-01"})
    assert r.status_code == 400 and "before" in r.content.decode()


def test_it_exports_the_filtered_audit_log_as_csv(world: World) -> None:
    _quota_change(world)
    node = Node.objects.first()
    node_cordon(actor=world.dave, node=node, reason="fan noise")
    r = login(world.dave).get(reverse("portal:audit-csv"), {"q": "fan"})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(r.streaming_content).decode())))
    assert rows[0][:3] == ["when (UTC)", "who", "action"]
    assert len(rows) == 2 and rows[1][2] == "node.cordon"
    assert rows[1][7] == "fan noise" and "cordoned: no → yes" in rows[1][6]
    # All of it, past the CSV's chunk size, newest first with no duplicates.

    for n in range(7):
        _quota_change(world, nominal=1000 * n)
    from portal.views import audit as audit_views

    old = audit_views.CSV_CHUNK
    audit_views.CSV_CHUNK = 3
    try:
        r = login(world.dave).get(reverse("portal:audit-csv"))
        rows = list(csv.reader(io.StringIO(b"".join(r.streaming_content).decode())))
    finally:
        audit_views.CSV_CHUNK = old
    assert len(rows) - 1 == AuditEvent.objects.count()


def test_it_authorises_the_csv_like_the_page(world: World) -> None:
    _quota_change(world)
    for user in (world.alice, world.bob):
        assert login(user).get(reverse("portal:audit-csv")).status_code == 403
        assert login(user).get(reverse("portal:audit")).status_code == 403
    auditor = world.carol
    auditor.groups.add(Group.objects.get_or_create(name=settings.AUDITOR_GROUP)[0])
    assert login(auditor).get(reverse("portal:audit-csv")).status_code == 200
    assert Client().get(reverse("portal:audit-csv")).status_code == 302


def test_it_bulk_cancels_only_what_the_user_may_cancel(world: World) -> None:
    mine = [submit(world.bob, world.vision, name=f"b{i}") for i in range(3)]
    theirs = submit(world.carol, world.nlp, name="carols")
    c = login(world.bob)
    url = reverse("portal:requests-bulk-cancel")
    # No reason: the confirmation again, 400, nothing cancelled.
    r = c.post(url, {"ids": [m.pk for m in mine]})
    assert r.status_code == 400 and "Say why" in r.content.decode()
    # One request of another team refuses the lot: nothing is cancelled.
    r = c.post(url, {"ids": [mine[0].pk, theirs.pk], "reason": "oops"})
    assert r.status_code == 404
    assert GpuRequest.objects.filter(state="cancelled").count() == 0
    r = c.post(url, {"ids": [mine[0].pk, mine[1].pk], "reason": "wrong data set", "next": "/"})
    assert r.status_code == 302
    assert set(GpuRequest.objects.filter(state="cancelled").values_list("pk", flat=True)) == {
        mine[0].pk,
        mine[1].pk,
    }
    events = AuditEvent.objects.filter(action="request.cancel")
    assert {e.reason for e in events} == {"wrong data set"} and events.count() == 2
    # Read-only auditors cannot, even their own team's.
    world.alice.groups.add(Group.objects.get_or_create(name=settings.AUDITOR_GROUP)[0])
    r = login(world.alice).post(url, {"ids": [mine[2].pk], "reason": "x"})
    assert r.status_code in (403, 404)
    mine[2].refresh_from_db()
    assert mine[2].state == "pending"


def test_it_bulk_cordons_nodes_for_admins_only(world: World) -> None:
    nodes = list(Node.objects.order_by("pk")[:2])
    url = reverse("portal:nodes-bulk-action")
    data = {"ids": [n.pk for n in nodes], "action": "cordon", "reason": "rack move"}
    assert login(world.alice).post(url, data).status_code == 403
    assert not Node.objects.filter(cordoned=True).exists()
    c = login(world.dave)
    assert c.post(url, {**data, "reason": " "}).status_code == 400
    assert c.post(url, {**data, "action": "reboot"}).status_code == 400
    assert c.post(url, {**data, "ids": [999999]}).status_code == 404
    assert not Node.objects.filter(cordoned=True).exists()
    r = c.post(url, data)
    assert r.status_code == 302
    assert Node.objects.filter(cordoned=True).count() == 2
    assert set(
        AuditEvent.objects.filter(action="node.cordon").values_list("reason", flat=True)
    ) == {"rack move"}


def test_it_edits_pool_settings_as_plain_fields(world: World) -> None:
    a100 = Pool.objects.get(name="a100-train")
    c = login(world.dave)
    page = c.get(reverse("portal:settings")).content.decode()
    assert "Inference floor (GPUs)" in page and "key=value:Effect" in page
    p = f"p{a100.pk}-"
    data = {
        p + "lifecycle": "production",
        p + "inference_floor_milli": "2.5",
        p + "taints": "nvidia.com/gpu=present:NoSchedule\nteam-only:NoExecute",
        p + "node_selector": "qm.example.com/pool=a100, gpu=a100",
        p + "time_slicing_replicas": "1",
        p + "mig_layout": "",
        p + "interconnect": "nvswitch",
        p + "architecture": "ampere",
    }
    r = c.post(reverse("portal:pool-edit", args=[a100.pk]), data)
    assert r.status_code == 302, r.content.decode()
    a100.refresh_from_db()
    assert a100.inference_floor_milli == 2500
    assert a100.taints == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "team-only", "value": "", "effect": "NoExecute"},
    ]
    assert a100.node_selector == {"qm.example.com/pool": "a100", "gpu": "a100"}
    # The form shows them back in the same words.
    page = c.get(reverse("portal:settings")).content.decode()
    assert "nvidia.com/gpu=present:NoSchedule" in page and "gpu=a100" in page
    # Bad input: 400 naming the field, the input kept, nothing stored lost.
    bad = {**data, p + "taints": "nvidia.com/gpu=present:Sometimes", p + "mig_layout": "9g.1tb"}
    r = c.post(reverse("portal:pool-edit", args=[a100.pk]), bad)
    body = r.content.decode()
    assert r.status_code == 400
    assert "Line 1 (nvidia.com/gpu=present:Sometimes)" in body and "NoSchedule" in body
    assert "9g.1tb" in body and "is not a MIG profile" in body
    a100.refresh_from_db()
    assert a100.taints[0]["effect"] == "NoSchedule" and a100.inference_floor_milli == 2500
    r = c.post(reverse("portal:pool-edit", args=[a100.pk]), {**data, p + "node_selector": "gpu"})
    assert r.status_code == 400 and "write label=value" in r.content.decode()
    event = AuditEvent.objects.filter(action="pool.update").first()
    rows = login(world.dave).get(reverse("portal:audit")).context["rows"]
    text = next(row.changes_text for row in rows if row.event.pk == event.pk)
    assert "inference floor: 0 GPU → 2.5 GPUs" in text
    assert "taints: none → nvidia.com/gpu=present:NoSchedule, team-only:NoExecute" in text


def test_the_api_takes_a_reason_into_the_audit_log(world: World) -> None:
    from rest_framework.test import APIClient

    req = submit(world.bob, world.vision)
    c = APIClient()
    c.force_authenticate(world.bob)
    r = c.post(f"/api/v1/requests/{req.pk}/cancel/", {"reason": "x" * 501}, format="json")
    assert r.status_code == 400 and "reason" in r.json()["errors"]
    assert GpuRequest.objects.get(pk=req.pk).state == "pending"
    r = c.post(f"/api/v1/requests/{req.pk}/cancel/", {"reason": "typo"}, format="json")
    assert r.status_code == 200
    assert AuditEvent.objects.get(action="request.cancel").reason == "typo"
    c.force_authenticate(world.dave)
    node = Node.objects.first()
    r = c.post(f"/api/v1/nodes/{node.pk}/drain/", {"reason": "PSU"}, format="json")
    assert r.status_code == 200
    assert AuditEvent.objects.get(action="node.drain").reason == "PSU"
    a100 = Pool.objects.get(name="a100-train")
    r = c.put(
        f"/api/v1/teams/{world.vision.pk}/quotas/{a100.pk}/",
        {"nominal_milli": 8000, "reason": "rebalance"},
        format="json",
    )
    assert r.status_code == 200
    assert AuditEvent.objects.get(action="quota.set").reason == "rebalance"


def test_objects_known_by_name_are_named_with_their_kind(world: World) -> None:
    profile = PolicyProfile.objects.first() or PolicyProfile.objects.create(name="base")
    targets = {
        "pool": (Pool.objects.get(name="a100-train"), "pool a100-train"),
        "workloadclass": (WorkloadClass.objects.get(name="inference"), "class inference"),
        "team": (world.vision, "team vision"),
        "policyprofile": (profile, f"profile {profile.name}"),
    }
    events = [
        AuditEvent.objects.create(
            actor_name="dave", action="x.update", object_type=kind, object_id=str(obj.pk)
        )
        for kind, (obj, _) in targets.items()
    ]
    with CaptureQueriesContext(connection) as queries:
        rows = describe(events)
    assert [r.target for r in rows] == [name for _, name in targets.values()]
    assert len(queries) == len(targets)


def test_rollouts_and_validation_runs_are_named_not_deleted(world: World) -> None:
    from portal.models import Rollout, ValidationRun

    pool = Pool.objects.get(name="a100-train")
    node = Node.objects.filter(pool=pool).first()
    assert node is not None
    rollout = Rollout.objects.create(pool=pool, kind="driver", target="550.90")
    run = ValidationRun.objects.create(
        node=node, rollout=rollout, name="qm-validate-1", started_at=timezone.now()
    )
    events = [
        AuditEvent.objects.create(
            actor_name="system",
            action="rollout.start",
            object_type="rollout",
            object_id=str(rollout.pk),
        ),
        AuditEvent.objects.create(
            actor_name="system",
            action="validation.passed",
            object_type="validationrun",
            object_id=str(run.pk),
        ),
    ]
    with CaptureQueriesContext(connection) as queries:
        rows = describe(events)
    assert [r.target for r in rows] == [
        f"rollout #{rollout.pk} (driver 550.90 on pool a100-train)",
        f"validation #{run.pk} of node {node.name}",
    ]
    assert len(queries) == 2
    assert [r.what for r in rows] == ["started a rollout", "passed a node's validation"]


def test_a_label_that_was_not_there_reads_unset_not_none(world: World) -> None:
    """A rollout records the labels a node had before it: one it did not have is unset,
    not Python's None."""
    event = AuditEvent.objects.create(
        actor_name="rollout",
        action="rollout.apply",
        object_type="rollout",
        object_id="0",
        after={
            "labels": {"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"},
            "previous": {"nvidia.com/gpu-driver-upgrade-state": None, "gpu": "a100"},
        },
    )
    (row,) = describe([event])
    text = row.changes_text
    assert "previous: nvidia.com/gpu-driver-upgrade-state unset, gpu=a100" in text
    assert "None" not in text
