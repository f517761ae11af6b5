"""The settings page creates and retires pools and classes (admins); managed objects are marked."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from portal.models import AuditEvent, GpuRequest, Pool, WorkloadClass
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


NEW_POOL = {
    "p-new-name": "l40s",
    "p-new-gpu_model": "NVIDIA-L40S",
    "p-new-gpu_memory_mib": "46068",
    "p-new-partitioning": "exclusive",
    "p-new-lifecycle": "production",
    "p-new-inference_floor_milli": "0",
    "p-new-taints": "",
    "p-new-node_selector": "nvidia.com/gpu.product=NVIDIA-L40S",
    "p-new-mig_layout": "",
    "p-new-time_slicing_replicas": "1",
    "p-new-interconnect": "pcie",
    "p-new-architecture": "ada",
}


def test_an_admin_creates_a_pool_on_the_settings_page(world: World) -> None:
    r = login(world.dave).post("/ops/pools/new/", NEW_POOL)
    assert r.status_code == 302, r.content.decode()[:2000]
    pool = Pool.objects.get(name="l40s")
    assert pool.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert AuditEvent.objects.filter(action="pool.create", object_id=str(pool.pk)).count() == 1


def test_a_bad_selector_is_a_form_error_and_nothing_is_made(world: World) -> None:
    body = {**NEW_POOL, "p-new-node_selector": "bad key!=x"}
    r = login(world.dave).post("/ops/pools/new/", body)
    assert r.status_code == 400
    assert not Pool.objects.filter(name="l40s").exists()


def test_a_lead_cannot_create_a_pool_or_class(world: World) -> None:
    client = login(world.alice)
    assert client.post("/ops/pools/new/", NEW_POOL).status_code == 403
    assert (
        client.post("/ops/classes/new/", {"c-new-name": "x", "c-new-band": "1"}).status_code == 403
    )
    assert not Pool.objects.filter(name="l40s").exists()


def test_retiring_a_class_with_waiting_work_says_what_happens_first(world: World) -> None:
    req = submit(world.bob, world.vision, cls="interactive", profile_kind="whole", count=1)
    wc = WorkloadClass.objects.get(name="interactive")
    client = login(world.dave)
    r = client.post(f"/ops/classes/{wc.pk}/retire/", {})
    assert r.status_code == 200
    assert "1 waiting request(s)" in r.content.decode()
    wc.refresh_from_db()
    assert wc.retired_at is None
    training = WorkloadClass.objects.get(name="training")
    r = client.post(f"/ops/classes/{wc.pk}/retire/", {"confirm": "on", "move_to": training.pk})
    assert r.status_code == 302
    req.refresh_from_db()
    wc.refresh_from_db()
    assert wc.retired_at is not None
    assert req.workload_class == training and req.state == GpuRequest.State.PENDING
    page = client.get("/ops/settings/").content.decode()
    assert "Retired: interactive." in page


def test_managed_objects_are_marked_on_the_page(world: World) -> None:
    Pool.objects.filter(name="a100-train").update(config_managed=True)
    page = login(world.dave).get("/ops/settings/").content.decode()
    assert page.count("managed by the config file</span>") == 1


def test_an_admin_creates_a_class_on_the_settings_page(world: World) -> None:
    body = {
        "c-new-name": "urgent",
        "c-new-band": "900",
        "c-new-preemption": "never",
        "c-new-min_runtime_s": "0",
        "c-new-max_queue_s": "60",
        "c-new-description": "pages people",
        "c-new-priority_class_name": "",
        "c-new-teams": [str(world.vision.pk)],
        "c-new-restricted": "on",
    }
    r = login(world.dave).post("/ops/classes/new/", body)
    assert r.status_code == 302, r.content.decode()[:3000]
    wc = WorkloadClass.objects.get(name="urgent")
    assert wc.band == 900 and list(wc.teams.all()) == [world.vision]
    r = login(world.dave).post("/ops/classes/new/", {**body, "c-new-name": "b", "c-new-band": "-5"})
    assert r.status_code == 400


def test_the_settings_page_says_how_gangs_are_launched(
    world: World,
    settings,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """Simulated here; on Kubernetes, what K8S_GANG_API and discovery chose."""
    from portal.backends.kubernetes import KubernetesBackend
    from portal.selectors import gangs

    page = login(world.dave).get(reverse("portal:settings"))
    assert b'data-gang-api="simulated"' in page.content
    assert b"K8S_GANG_API=auto" in page.content

    from tests.k8s.test_jobset import Discovery

    found = KubernetesBackend(core=object(), batch=object(), custom=Discovery(["jobsets"]))
    monkeypatch.setattr(gangs, "get_backend", lambda: found)
    page = login(world.dave).get(reverse("portal:settings"))
    assert b'data-gang-api="jobset"' in page.content
    assert b"one JobSet" in page.content
    settings.K8S_GANG_API = "jobs"
    monkeypatch.setattr(gangs, "get_backend", lambda: KubernetesBackend(gang_api="jobs"))
    page = login(world.dave).get(reverse("portal:settings"))
    assert b'data-gang-api="jobs"' in page.content
    assert b"K8S_GANG_API=jobs" in page.content


def test_the_pool_form_sets_the_sharing_engine_and_refuses_it_on_a_whole_gpu_pool(
    world: World,
) -> None:
    shared = {**NEW_POOL, "p-new-partitioning": "time-slicing", "p-new-sharing_engine": "mps"}
    assert login(world.dave).post("/ops/pools/new/", shared).status_code == 302
    assert Pool.objects.get(name="l40s").sharing_engine == "mps"
    Pool.objects.filter(name="l40s").delete()
    whole = {**NEW_POOL, "p-new-partitioning": "exclusive", "p-new-sharing_engine": "hami"}
    r = login(world.dave).post("/ops/pools/new/", whole)
    assert r.status_code == 400 and "needs a time-slicing pool" in r.content.decode()
    assert not Pool.objects.filter(name="l40s").exists()


def test_the_settings_choices_read_as_their_names_are_written(world: World) -> None:
    """MPS, HAMi and MIG as NVIDIA and HAMi spell them, not Django's title-cased values."""
    body = login(world.dave).get(reverse("portal:settings")).content.decode()
    options = dict(re.findall(r'<option value="([a-z-]+)"[^>]*>([^<]+)</option>', body))
    assert options["mps"] == "MPS"
    assert options["hami"] == "HAMi"
    assert options["mig"] == "MIG"
    assert options["time-slicing"] == "time-slicing"
    assert options["none"] == "none"
    assert (options["never"], options["when-borrowing"], options["always"]) == (
        "never",
        "only when borrowing",
        "always",
    )
