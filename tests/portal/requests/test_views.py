"""The pages through HTTP: what each persona sees and can change."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from portal.models import (
    AuditEvent,
    DeviceProfile,
    GpuRequest,
    Membership,
    Pool,
    Quota,
    WorkloadClass,
)
from portal.tick import reconcile
from portal.tick import run as tick
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def login(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def form_data(world: World, **kw) -> dict:
    data = {
        "team": world.vision.pk,
        "name": "resnet",
        "workload_class": WorkloadClass.objects.get(name="training").pk,
        "pool": Pool.objects.get(name="a100-train").pk,
        "profile": DeviceProfile.objects.get(name="whole").pk,
        "count": 1,
        "image": "registry.example.com/vision/train:1.0",
        "command": "python train.py",
        "env": "EPOCHS=3",
        "checkpoint_interval_s": 600,
        "max_runtime_s": 0,
        "estimated_runtime_s": 3600,
    }
    data.update(kw)
    return data


def test_it_shows_every_page_to_an_admin(world: World) -> None:
    submit(world.bob, world.vision, name="queued-one")
    tick.run_tick()
    c = login(world.dave)
    for name in [
        "home",
        "request-submit",
        "queue",
        "decisions",
        "team-list",
        "capacity",
        "audit",
        "settings",
    ]:
        r = c.get(reverse(f"portal:{name}"))
        assert r.status_code == 200, name
    r = c.get(reverse("portal:team-detail", args=[world.vision.pk]))
    assert r.status_code == 200


def test_it_submits_from_the_form_and_shows_the_request(world: World) -> None:
    c = login(world.bob)
    r = c.post(reverse("portal:request-submit"), form_data(world))
    assert r.status_code == 302
    req = GpuRequest.objects.get(name="resnet")
    assert req.team == world.vision and req.submitted_by == world.bob
    assert req.env == {"EPOCHS": "3"} and req.command == ["python", "train.py"]
    r = c.get(r["Location"])
    assert b"resnet" in r.content and b"pending" in r.content


def test_it_refuses_nvidia_env_names(world: World) -> None:
    c = login(world.bob)
    for env in [
        "NVIDIA_VISIBLE_DEVICES=all",
        "CUDA_VISIBLE_DEVICES=0",
        "nvidia_driver_capabilities=all",
    ]:
        r = c.post(reverse("portal:request-submit"), form_data(world, env=env))
        assert r.status_code == 400
        assert "set by the platform" in r.context["form"].errors["env"][0]
    assert not GpuRequest.objects.exists()


def test_it_refuses_a_team_the_user_is_not_in(world: World) -> None:
    c = login(world.carol)
    r = c.post(reverse("portal:request-submit"), form_data(world, team=world.vision.pk))
    assert r.status_code == 400
    assert "team" in r.context["form"].errors
    assert not GpuRequest.objects.exists()


def test_it_offers_only_profiles_the_pool_has(world: World) -> None:
    c = login(world.bob)
    mig = Pool.objects.get(name="h100-mig")
    r = c.get(reverse("portal:request-submit"), {"pool": mig.pk}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    # Profiles by what they are: "MIG 3g.40gb: 3/7 of a GPU, 40 GB", not their slugs.
    assert (
        b"MIG 3g.40gb: 3/7 of a GPU, 40 GB" in r.content
        and b"shared:" not in r.content
        and b">whole GPU<" not in r.content
    )
    # The profiles came: the form asks for a fresh preview once they are swapped in.
    assert r["HX-Trigger-After-Settle"] == "qm-profiles"
    # A profile the pool does not offer is refused.
    r = c.post(reverse("portal:request-submit"), form_data(world, pool=mig.pk))
    assert r.status_code == 400 and "profile" in r.context["form"].errors


def test_a_pool_change_keeps_the_profile_the_new_pool_offers(world: World) -> None:
    c = login(world.bob)
    a100 = Pool.objects.get(name="a100-train")
    mig = Pool.objects.get(name="h100-mig")
    whole = DeviceProfile.objects.get(name="whole")
    url = reverse("portal:request-submit")
    kept = c.get(url, {"pool": a100.pk, "profile": whole.pk}, HTTP_HX_REQUEST="true")
    assert f'<option value="{whole.pk}" selected>'.encode() in kept.content
    assert b"aria-invalid" not in kept.content
    # Not offered there: nothing is chosen, and the field is marked for the preview to explain.
    lost = c.get(url, {"pool": mig.pk, "profile": whole.pk}, HTTP_HX_REQUEST="true")
    assert b" selected>" not in lost.content.replace(b'value="" selected', b"")
    assert b'aria-invalid="true"' in lost.content and b'aria-required="true"' in lost.content


def test_required_fields_are_marked_and_errors_sit_beside_their_field(world: World) -> None:
    c = login(world.bob)
    body = c.get(reverse("portal:request-submit")).content.decode()
    assert (
        '<label for="id_image">Image <span class="req" aria-hidden="true">*</span></label>' in body
    )
    assert '<label for="id_name">Name</label>' in body
    r = c.post(reverse("portal:request-submit"), {**form_data(world), "image": ""})
    body = r.content.decode()
    assert r.status_code == 400
    assert 'aria-invalid="true"' in body and 'id="id_image_error"' in body
    assert 'aria-describedby="id_image_error"' in body


def test_an_htmx_submit_goes_to_the_request_page_with_a_whole_page_visit(world: World) -> None:
    c = login(world.bob)
    r = c.post(reverse("portal:request-submit"), form_data(world), HTTP_HX_REQUEST="true")
    req = GpuRequest.objects.get()
    assert r.status_code == 200 and r["HX-Redirect"] == f"/requests/{req.pk}/"
    # Refused: the page with the form and its errors, 400 (forms.js swaps the form in place).
    r = c.post(
        reverse("portal:request-submit"),
        {**form_data(world), "env": "QM_X=1"},
        HTTP_HX_REQUEST="true",
    )
    assert r.status_code == 400 and b'id="id_env_error"' in r.content


def test_it_previews_fits_now_without_writing(world: World) -> None:
    c = login(world.bob)
    counts = (GpuRequest.objects.count(), AuditEvent.objects.count())
    r = c.post(reverse("portal:request-preview"), form_data(world), HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert b"fits now on pool a100-train" in r.content
    assert (GpuRequest.objects.count(), AuditEvent.objects.count()) == counts


def test_it_previews_a_wait_with_reason_and_estimate(world: World) -> None:
    # Fill vision's a100 quota (16 guaranteed + 16 borrowable) and the pool (32 GPUs).
    for _ in range(4):
        submit(world.bob, world.vision, count=8)
    tick.run_tick()
    reconcile.reconcile()
    c = login(world.alice)
    r = c.post(reverse("portal:request-preview"), form_data(world, count=8), HTTP_HX_REQUEST="true")
    body = r.content.decode()
    assert "would wait:" in body, body
    assert "estimated start" in body


def test_it_lists_my_jobs_with_position_reason_and_cancel(world: World) -> None:
    for _ in range(5):
        submit(world.bob, world.vision, count=8)
    tick.run_tick()
    waiting = GpuRequest.objects.filter(state="pending").order_by("queue_position").first()
    assert waiting.queue_position >= 1
    c = login(world.bob)
    r = c.get(reverse("portal:home"))
    body = r.content.decode()
    assert f"#{waiting.queue_position}" in body
    assert waiting.status_message in body
    # Someone else's request (the lead's cancel) without a reason: the confirmation again,
    # 400, nothing cancelled. (One's own may go without a reason: tests/portal/teams.)
    r = login(world.alice).post(reverse("portal:request-cancel", args=[waiting.pk]), {"next": "/"})
    assert r.status_code == 400 and "Say why" in r.content.decode()
    waiting.refresh_from_db()
    assert waiting.state == "pending"
    r = c.post(
        reverse("portal:request-cancel", args=[waiting.pk]), {"next": "/", "reason": "wrong image"}
    )
    assert r.status_code == 302 and r["Location"] == "/"
    waiting.refresh_from_db()
    assert waiting.state == "cancelled"


def test_it_renders_partials_for_htmx(world: World) -> None:
    c = login(world.dave)
    for name, marker in [
        ("home", 'id="request-table"'),
        ("queue", 'id="queue-table"'),
        ("decisions", 'id="decision-log"'),
        ("capacity", 'id="capacity-map"'),
        ("audit", 'id="audit-log"'),
    ]:
        r = c.get(reverse(f"portal:{name}"), HTTP_HX_REQUEST="true")
        body = r.content.decode()
        assert body.lstrip().startswith("<div " + marker) or marker in body.split("\n", 1)[0], name
        assert "<html" not in body, name


def test_it_lets_a_lead_change_the_quota_within_the_grant(world: World) -> None:
    a100 = Pool.objects.get(name="a100-train")
    c = login(world.alice)
    url = reverse("portal:quota-edit", args=[world.vision.pk, a100.pk])
    p = f"pool{a100.pk}-"
    change = {p + "nominal": "12", p + "borrowing_limit": "4", p + "lending_limit": ""}
    # A quota change needs a reason: refused on the field, nothing changes.
    r = c.post(url, change)
    assert r.status_code == 400 and "Say why" in r.content.decode()
    assert Quota.objects.get(team=world.vision, pool=a100).nominal_milli == 16000
    r = c.post(url, {**change, p + "reason": "new project"})
    assert r.status_code == 302
    q = Quota.objects.get(team=world.vision, pool=a100)
    assert (q.nominal_milli, q.borrowing_limit_milli, q.lending_limit_milli) == (12000, 4000, None)
    event = AuditEvent.objects.filter(action="quota.set").first()
    assert event.actor == world.alice and event.after["nominal_milli"] == 12000
    assert event.reason == "new project"
    # Beyond what admins granted: refused on the field, nothing changes.
    r = c.post(url, {p + "nominal": "17", p + "reason": "more"})
    assert r.status_code == 400
    q.refresh_from_db()
    assert q.nominal_milli == 12000
    # The team page shows the change in its recent changes.
    r = c.get(reverse("portal:team-detail", args=[world.vision.pk]))
    assert "changed a quota: vision in pool a100-train" in r.content.decode()
    assert "guaranteed: 16 GPUs → 12 GPUs" in r.content.decode()


def test_it_refuses_quota_changes_from_a_member(world: World) -> None:
    a100 = Pool.objects.get(name="a100-train")
    r = login(world.bob).post(
        reverse("portal:quota-edit", args=[world.vision.pk, a100.pk]),
        {f"pool{a100.pk}-nominal": "1"},
    )
    assert r.status_code == 403
    assert Quota.objects.get(team=world.vision, pool=a100).nominal_milli == 16000


def test_it_lets_a_lead_cap_a_member(world: World) -> None:
    m = Membership.objects.get(user=world.bob, team=world.vision)
    r = login(world.alice).post(
        reverse("portal:member-edit", args=[world.vision.pk, m.pk]),
        {f"m{m.pk}-gpu_cap": "2.5", f"m{m.pk}-role": "lead"},
    )
    assert r.status_code == 302
    m.refresh_from_db()
    # Leads set caps; only admins change roles.
    assert m.gpu_cap_milli == 2500 and m.role == "member"


def test_it_lets_an_admin_grant_and_edit_classes_pools_and_nodes(world: World) -> None:
    c = login(world.dave)
    a100 = Pool.objects.get(name="a100-train")
    p = f"pool{a100.pk}-"
    r = c.post(
        reverse("portal:quota-edit", args=[world.vision.pk, a100.pk]),
        {p + "nominal": "20", p + "granted": "24", p + "reason": "grant for Q1"},
    )
    assert r.status_code == 302
    q = Quota.objects.get(team=world.vision, pool=a100)
    assert (q.granted_milli, q.nominal_milli) == (24000, 20000)

    wc = WorkloadClass.objects.get(name="training")
    data = {
        f"c{wc.pk}-{k}": v
        for k, v in {
            "band": 150,
            "preemption": "always",
            "min_runtime_s": 60,
            "max_queue_s": 0,
            "latency_objective_ms": "",
            "priority_class_name": "qm-training",
            "description": "x",
        }.items()
    }
    r = c.post(reverse("portal:class-edit", args=[wc.pk]), data)
    assert r.status_code == 302, r.content
    wc.refresh_from_db()
    assert wc.band == 150 and AuditEvent.objects.filter(action="class.update").exists()

    data = {
        f"p{a100.pk}-{k}": v
        for k, v in {
            "lifecycle": "maintenance",
            "inference_floor_milli": 0,
            "taints": "",
            "node_selector": "",
            "time_slicing_replicas": 1,
            "mig_layout": "",
            "interconnect": "nvswitch",
            "architecture": "ampere",
        }.items()
    }
    r = c.post(reverse("portal:pool-edit", args=[a100.pk]), data)
    assert r.status_code == 302, r.content
    a100.refresh_from_db()
    assert a100.lifecycle == "maintenance"

    node = a100.nodes.first()
    for action, cordoned in [("cordon", True), ("return", False), ("drain", True)]:
        r = c.post(reverse("portal:node-action", args=[node.pk, action]))
        assert r.status_code == 400  # a reason is required
        r = c.post(reverse("portal:node-action", args=[node.pk, action]), {"reason": "firmware"})
        assert r.status_code == 302
        node.refresh_from_db()
        assert node.cordoned is cordoned
    assert AuditEvent.objects.filter(action="node.drain").exists()


def test_it_filters_the_decision_log(world: World) -> None:
    for _ in range(5):
        submit(world.bob, world.vision, count=8)
    tick.run_tick()
    c = login(world.dave)
    r = c.get(reverse("portal:decisions"), {"kind": "wait"})
    assert r.status_code == 200
    kinds = {d.kind for d in r.context["page"]}
    assert kinds == {"wait"}
    r = c.get(reverse("portal:decisions"), {"kind": "admit", "node": "a100-01"})
    assert all("a100-01" in d.node for d in r.context["page"]) and len(r.context["page"]) >= 1


def test_it_draws_the_capacity_map(world: World) -> None:
    submit(world.bob, world.vision, count=2)
    tick.run_tick()
    r = login(world.dave).get(reverse("portal:capacity"))
    body = r.content.decode()
    assert 'class="cell allocated"' in body and "vision" in body
    assert 'class="cell free"' in body


def test_it_refuses_the_admin_pages_to_others(world: World) -> None:
    c = login(world.alice)
    for name in ["capacity", "audit", "settings"]:
        assert c.get(reverse(f"portal:{name}")).status_code == 403
