"""Restricted classes mean what they say: a class bound to workload kinds and pools takes only
those, through the API, the submit form and the preview alike (issue 32, item 4).

The probe found members of a team granted the restricted inference class submitting ordinary
batch work in it, on any pool: band 300, never preempted, first in the queue.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from portal.models import AuditEvent, DeviceProfile, GpuRequest, Pool, WorkloadClass
from portal.models.pools import WORKLOAD_KINDS
from tests.base import World, api_secret, make_world, submit, submit_serving

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    w = make_world()
    inference = WorkloadClass.objects.get(name="inference")
    inference.restricted = True
    inference.kinds = ["serving"]
    inference.save()
    inference.teams.set([w.vision])
    inference.pools.set([Pool.objects.get(name="h100-mig")])
    return w


def api(user: Any) -> Client:
    secret = api_secret(user)
    return Client(HTTP_AUTHORIZATION=f"Token {secret}")


BATCH_IN_INFERENCE = {
    "team": "vision",
    "workload_class": "inference",
    "pool": "h100-mig",
    "profile": "mig-1g.10gb",
    "image": "registry.example.com/vision/train:1.0",
    "command": ["python", "train.py"],
}
SERVING = {
    **BATCH_IN_INFERENCE,
    "kind": "serving",
    "command": [],
    "image": "vllm/vllm-openai:v0.6.3",
    "model_name": "meta-llama/Llama-3.1-8B-Instruct",
    "model_revision": "2024-07-23",
    "runtime": "vllm",
}


def test_the_kinds_are_the_requests_kinds() -> None:
    assert tuple(GpuRequest.Kind.values) == WORKLOAD_KINDS


def test_a_members_batch_request_in_the_inference_class_is_a_400_naming_the_field(
    world: World,
) -> None:
    r = api(world.bob).post(
        "/api/v1/requests/", BATCH_IN_INFERENCE, content_type="application/json"
    )
    assert r.status_code == 400, r.content
    assert "serving" in r.json()["errors"]["workload_class"][0]
    assert not GpuRequest.objects.exists()


def test_a_serving_workload_in_the_inference_class_is_taken(world: World) -> None:
    r = api(world.bob).post("/api/v1/requests/", SERVING, content_type="application/json")
    assert r.status_code == 201, r.content
    assert GpuRequest.objects.get().kind == "serving"


@pytest.mark.parametrize("pool", ["a100-train", "any", None])
def test_a_pool_the_class_is_not_bound_to_is_a_400_naming_the_pool(
    world: World, pool: str | None
) -> None:
    body = {**SERVING, "pool": pool, "profile": "whole"}
    r = api(world.bob).post("/api/v1/requests/", body, content_type="application/json")
    assert r.status_code == 400, r.content
    assert "h100-mig" in r.json()["errors"]["pool"][0]
    assert not GpuRequest.objects.exists()


def test_the_service_refuses_it_too(world: World) -> None:
    with pytest.raises(ValidationError) as exc:
        submit(
            world.bob,
            world.vision,
            cls="inference",
            pool_name="h100-mig",
            profile_kind="mig",
            mig_profile="1g.10gb",
        )
    assert "workload_class" in exc.value.message_dict
    served = submit_serving(
        world.bob,
        world.vision,
        image="vllm/vllm-openai:v0.6.3",
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        model_revision="2024-07-23",
        runtime="vllm",
    )
    assert served.kind == "serving"


PREVIEW = {k: BATCH_IN_INFERENCE[k] for k in ("team", "workload_class", "pool", "profile")}


def test_the_preview_says_the_same(world: World) -> None:
    r = api(world.bob).post("/api/v1/requests/preview/", PREVIEW, content_type="application/json")
    assert r.status_code == 200
    body = r.json()
    assert body["outcome"] == "rejected"
    assert body["field"] == "workload_class"
    assert "serving" in body["message"]
    r = api(world.bob).post(
        "/api/v1/requests/preview/",
        {**PREVIEW, "kind": "serving", "pool": "any"},
        content_type="application/json",
    )
    assert r.json()["outcome"] == "rejected" and r.json()["field"] == "pool"
    r = api(world.bob).post(
        "/api/v1/requests/preview/",
        {**PREVIEW, "kind": "serving"},
        content_type="application/json",
    )
    assert r.json()["outcome"] != "rejected", r.json()


def _form(**fields: Any) -> dict[str, Any]:
    inference = WorkloadClass.objects.get(name="inference")
    return {
        "team": fields.pop("team"),
        "workload_class": inference.pk,
        "pool": Pool.objects.get(name="h100-mig").pk,
        "profile": DeviceProfile.objects.get(name="mig-1g.10gb").pk,
        "count": 1,
        "image": "registry.example.com/vision/train:1.0",
        "command": "python train.py",
        "checkpoint_interval_s": 0,
        "max_runtime_s": 0,
        "estimated_runtime_s": 3600,
        "kind": "batch",
        **fields,
    }


def test_the_submit_form_refuses_it_on_the_field(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    r = c.post(reverse("portal:request-submit"), _form(team=world.vision.pk))
    assert r.status_code == 400
    form = r.context["form"]
    assert "serving" in " ".join(form.errors["workload_class"])
    assert not GpuRequest.objects.exists()
    r = c.post(reverse("portal:request-preview"), _form(team=world.vision.pk))
    assert b"serving" in r.content and b"rejected" in r.content


def test_an_unbound_class_takes_every_kind_and_pool(world: World) -> None:
    training = WorkloadClass.objects.get(name="training")
    assert training.refusal(team=world.vision, kind="batch", pool=None) is None
    assert submit(world.bob, world.vision, pool=None).pool is None


def test_admins_bind_a_class_on_the_settings_page_and_it_is_audited(world: World) -> None:
    training = WorkloadClass.objects.get(name="training")
    a100 = Pool.objects.get(name="a100-train")
    admin = Client()
    admin.force_login(world.dave)
    p = f"c{training.pk}"
    data = {
        f"{p}-band": training.band,
        f"{p}-preemption": training.preemption,
        f"{p}-min_runtime_s": training.min_runtime_s,
        f"{p}-max_queue_s": training.max_queue_s,
        f"{p}-priority_class_name": training.priority_class_name,
        f"{p}-description": "batch training",
        f"{p}-kinds": ["batch"],
        f"{p}-pools": [a100.pk],
    }
    r = admin.post(reverse("portal:class-edit", args=[training.pk]), data)
    assert r.status_code == 302, r.content[:2000]
    training.refresh_from_db()
    assert training.kinds == ["batch"]
    assert list(training.pools.all()) == [a100]
    assert AuditEvent.objects.get(action="class.pools").after == {"pools": ["a100-train"]}
    assert AuditEvent.objects.filter(action="class.update", after__kinds=["batch"]).exists()
    r = admin.post(
        reverse("portal:class-edit", args=[training.pk]), {**data, f"{p}-kinds": ["nightly"]}
    )
    assert r.status_code == 400
