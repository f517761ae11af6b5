"""Pool lifecycle through the API and the pages: node software and drift, rollouts (admins
start them, auditors read them), the burn-in's result report, the MIG layout proposal."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from portal.api.lifecycle import validation_token
from portal.lib import lifecycle
from portal.models import AuditEvent, Node, Pool, Rollout, ValidationRun
from portal.services.mig_relayout import config_name, mig_demand, proposal_for
from portal.services.rollouts import rollout_start, rollouts_advance
from portal.services.validations import validation_report, validation_start
from portal.tick.run import run_tick
from scheduling import mig, relayout
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def auditor(settings: Any) -> Any:
    user = get_user_model().objects.create_user("erin", password="pw-erin-123")
    user.groups.add(Group.objects.get_or_create(name=settings.AUDITOR_GROUP)[0])
    return user


# -- software inventory ------------------------------------------------------------------


def test_node_software_is_read_from_gfd_labels_new_and_deprecated() -> None:
    assert lifecycle.node_software(
        {
            "nvidia.com/cuda.driver.major": "535",
            "nvidia.com/cuda.driver.minor": "104",
            "nvidia.com/cuda.driver.rev": "05",
            "nvidia.com/cuda.runtime-version.major": "12",
            "nvidia.com/cuda.runtime-version.minor": "2",
            "quartermaster.io/gpu-operator-version": "v24.9.0",
        }
    ) == {
        "driver": "535.104.05",
        "cuda": "12.2",
        "device_plugin": "",
        "gpu_operator": "v24.9.0",
        "mig_config": "",
    }


def test_synced_nodes_store_their_software_and_the_capacity_page_flags_drift(
    world: World,
) -> None:
    a1 = Node.objects.get(name="a100-01")
    assert a1.software["driver"] == "550.107.02" and a1.software["cuda"] == "12.4"
    assert a1.software["device_plugin"] == "v0.17.0"
    assert Node.objects.get(name="a100-04").software["driver"] == "535.183.01"
    page = client_for(world.dave).get("/ops/capacity/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "drift: driver" in html
    assert "driver 550.107.02" in html


def test_the_pool_page_lists_versions_flags_the_odd_node_and_shows_the_impact(
    world: World,
) -> None:
    pool = Pool.objects.get(name="a100-train")
    r = client_for(world.dave).get(f"/ops/pools/{pool.pk}/lifecycle/")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'data-node="a100-04" class="drift"' in html
    assert "535.183.01 on 1 node" in html and "550.107.02 on 3 nodes" in html
    assert 'id="impact"' in html and "25.0 %" in html
    # A preview shows the waves without starting anything.
    r = client_for(world.dave).post(
        f"/ops/pools/{pool.pk}/rollouts/",
        {
            "kind": "driver",
            "target": "550.127.05",
            "canary_nodes": 1,
            "wave_percent": 50,
            "max_failed_nodes": 0,
            "drain_timeout_s": 3600,
            "apply_timeout_s": 900,
            "nccl_busbw_gbps": 100,
            "warmup_max_s": 120,
            "preview": "1",
        },
    )
    assert r.status_code == 200 and "a100-02, a100-03" in r.content.decode()
    assert Rollout.objects.count() == 0


def test_members_may_not_see_the_pool_page(world: World) -> None:
    pool = Pool.objects.get(name="a100-train")
    assert client_for(world.bob).get(f"/ops/pools/{pool.pk}/lifecycle/").status_code == 403
    r = client_for(world.bob).post(f"/ops/nodes/{Node.objects.first().pk}/validate/")
    assert r.status_code == 403 and not ValidationRun.objects.exists()


# -- rollouts API ------------------------------------------------------------------------


def test_admins_start_a_rollout_over_the_api_and_auditors_read_it(
    world: World, settings: Any
) -> None:
    r = client_for(world.dave).post(
        "/api/v1/rollouts/",
        {"pool": "a100-train", "kind": "driver", "target": "550.127.05", "wave_percent": 50},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["waves"] == [["a100-01"], ["a100-02", "a100-03"], ["a100-04"]]
    assert [n["step"] for n in body["nodes"]] == ["waiting"] * 4
    assert AuditEvent.objects.filter(action="rollout.start", actor=world.dave).count() == 1
    erin = auditor(settings)
    got = client_for(erin).get(f"/api/v1/rollouts/{body['id']}/")
    assert got.status_code == 200 and got.json()["target"] == "550.127.05"
    assert client_for(erin).get("/api/v1/rollouts/").json()["count"] == 1
    page = client_for(erin).get(f"/ops/rollouts/{body['id']}/")
    assert page.status_code == 200 and "Rollback criteria" in page.content.decode()
    denied = client_for(erin).post(
        "/api/v1/rollouts/",
        {"pool": "l4-shared", "kind": "driver", "target": "1"},
        content_type="application/json",
    )
    assert denied.status_code == 403
    assert client_for(world.bob).get(f"/api/v1/rollouts/{body['id']}/").status_code == 403


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"pool": "nope", "kind": "driver", "target": "1.2"}, "pool"),
        ({"pool": "a100-train", "kind": "bios", "target": "1.2"}, "kind"),
        ({"pool": "a100-train", "kind": "mig-layout", "target": "all-1g.10gb"}, "kind"),
        ({"pool": "a100-train", "kind": "driver", "target": "a b"}, "target"),
        (
            {"pool": "a100-train", "kind": "driver", "target": "1", "wave_percent": 0},
            "wave_percent",
        ),
        (
            {"pool": "a100-train", "kind": "driver", "target": "1", "thresholds": {"x": 1}},
            "thresholds",
        ),
        ({"pool": "a100-train", "kind": "driver", "target": "1", "nodeName": "x"}, "nodeName"),
    ],
)
def test_a_bad_rollout_is_refused_naming_the_field(world: World, data: dict, field: str) -> None:
    r = client_for(world.dave).post("/api/v1/rollouts/", data, content_type="application/json")
    assert r.status_code == 400 and field in r.json()["errors"], r.content
    assert not Rollout.objects.exists()


FORM = {
    "kind": "driver",
    "target": "550.127.05",
    "canary_nodes": 1,
    "wave_percent": 50,
    "max_failed_nodes": 0,
    "drain_timeout_s": 3600,
    "apply_timeout_s": 900,
    "nccl_busbw_gbps": 100,
    "warmup_max_s": 120,
}


@pytest.mark.parametrize("level", ["0", "5", "2.5", "two"])
def test_the_rollout_form_refuses_a_dcgm_level_outside_1_to_4_naming_the_field(
    world: World, level: str
) -> None:
    pool = Pool.objects.get(name="a100-train")
    r = client_for(world.dave).post(
        f"/ops/pools/{pool.pk}/rollouts/", {**FORM, "dcgm_diag_level": level}
    )
    assert r.status_code == 400
    assert r.context["form"].errors["dcgm_diag_level"] == [
        "DCGM diagnostics level: a whole number from 1 to 4."
    ]
    assert "DCGM diagnostics level: a whole number from 1 to 4." in r.content.decode()
    assert not Rollout.objects.exists()


def test_the_rollout_form_sets_the_dcgm_level_and_the_page_shows_the_driver_api(
    world: World, settings: Any
) -> None:
    settings.VALIDATION_DCGM_DIAG_LEVEL = 1
    pool = Pool.objects.get(name="a100-train")
    dave = client_for(world.dave)
    page = dave.get(f"/ops/pools/{pool.pk}/lifecycle/").content.decode()
    assert 'name="dcgm_diag_level"' in page
    r = dave.post(f"/ops/pools/{pool.pk}/rollouts/", {**FORM, "dcgm_diag_level": "3"})
    assert r.status_code == 302, r.content
    rollout = Rollout.objects.get()
    assert rollout.thresholds["dcgm_diag_level"] == 3
    html = dave.get(f"/ops/rollouts/{rollout.pk}/").content.decode()
    # The simulated backend has no GPU Operator: the node labels are the change.
    assert 'data-driver-api="labels"' in html and "node labels" in html
    assert "DCGM diagnostics level 3" in html
    assert "qm-rollout-" not in html
    # Left out, the form keeps the site's level.
    Rollout.objects.update(state=Rollout.State.HALTED)
    r = dave.post(f"/ops/pools/{pool.pk}/rollouts/", FORM)
    assert r.status_code == 302, r.content
    assert Rollout.objects.latest("pk").thresholds["dcgm_diag_level"] == 1

    # Through the GPU Operator's NVIDIADriver: one resource per wave, named on its wave.
    rollout.impact = {**rollout.impact, "driver_api": "nvidiadriver"}
    rollout.save(update_fields=["impact"])
    html = dave.get(f"/ops/rollouts/{rollout.pk}/").content.decode()
    assert 'data-driver-api="nvidiadriver"' in html
    for i in range(len(rollout.waves)):
        name = lifecycle.driver_wave_name(rollout.pk, i)
        assert f'data-nvidiadriver="{name}"' in html
    rollout.impact = {**rollout.impact, "driver_api": "clusterpolicy"}
    rollout.save(update_fields=["impact"])
    html = dave.get(f"/ops/rollouts/{rollout.pk}/").content.decode()
    assert 'data-driver-api="clusterpolicy"' in html and "ClusterPolicy" in html
    assert "data-nvidiadriver" not in html
    # A device plugin's version is the ClusterPolicy's even where drivers are NVIDIADrivers.
    rollout.kind, rollout.impact["driver_api"] = "device-plugin", "nvidiadriver"
    rollout.save(update_fields=["kind", "impact"])
    html = dave.get(f"/ops/rollouts/{rollout.pk}/").content.decode()
    assert 'data-driver-api="clusterpolicy"' in html and "data-nvidiadriver" not in html


def test_a_burn_in_reports_its_results_with_its_own_token(world: World) -> None:
    node = Node.objects.get(name="a100-01")
    run = validation_start(actor=world.dave, node=node)
    url = f"/api/v1/validations/{run.pk}/result"
    results = {"devices_visible": 8, "nccl_busbw_gbps": 20, "dcgm_diag": "pass", "warmup_s": 9}
    wrong = Client().post(
        url, results, content_type="application/json", HTTP_AUTHORIZATION="Bearer x"
    )
    assert wrong.status_code == 403
    ok = Client().post(
        url,
        results,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {validation_token(run)}",
    )
    assert ok.status_code == 200, ok.content
    rollouts_advance()
    run.refresh_from_db()
    node.refresh_from_db()
    # The reported figures are judged, not the simulation's: 20 GB/s fails.
    assert run.state == "failed" and "20 GB/s" in run.reason
    assert node.cordoned and "validation failed" in node.maintenance_reason


# -- MIG re-layout -------------------------------------------------------------------------


def test_the_layout_search_follows_the_demand_and_leaves_nothing_idle() -> None:
    fam = mig.H100_80GB
    only_small = relayout.propose(fam, {"1g.10gb": 10})
    assert only_small is not None and only_small.profiles == ("1g.10gb",) * 7
    assert only_small.idle == 0
    mixed = relayout.propose(fam, {"3g.40gb": 1, "1g.10gb": 3})
    # 3 + 4 slices against a target of 3.5 each: as close as 3 + 3, and nothing idle.
    assert mixed is not None and mixed.profiles == ("3g.40gb",) + ("1g.10gb",) * 4
    assert mixed.idle == 0
    assert mig.layout(fam, mixed.profiles) is not None
    assert relayout.propose(fam, {}) is None


def test_the_pool_page_proposes_a_mig_layout_from_pending_demand(
    world: World, settings: Any
) -> None:
    settings.MIG_RELAYOUT_POOLS = ["h100-mig"]
    for _ in range(6):
        submit(
            world.carol,
            world.nlp,
            cls="inference",
            pool_name="h100-mig",
            profile_kind="mig",
            mig_profile="1g.10gb",
        )
    pool = Pool.objects.get(name="h100-mig")
    demand = mig_demand(pool)
    assert demand.get("1g.10gb", 0) >= 6
    proposal = proposal_for(pool)
    assert proposal is not None and proposal["allowed"]
    assert proposal["profiles"].count("1g.10gb") >= 4
    assert proposal["config_name"] == config_name(tuple(proposal["profiles"]))
    html = client_for(world.dave).get(f"/ops/pools/{pool.pk}/lifecycle/").content.decode()
    assert "Proposed MIG layout" in html and proposal["config_name"] in html
    # It applies through a MIG-layout rollout of that config, from the page.
    assert f"Roll out {proposal['config_name']}</button>" in html
    r = client_for(world.dave).post(f"/ops/pools/{pool.pk}/mig-relayout/")
    rollout = Rollout.objects.get()
    assert r.status_code == 302 and r["Location"] == f"/ops/rollouts/{rollout.pk}/"
    assert rollout.kind == "mig-layout" and rollout.target == proposal["config_name"]
    settings.MIG_RELAYOUT_POOLS = []
    again = client_for(world.dave).post(f"/ops/pools/{pool.pk}/mig-relayout/")
    assert again.status_code == 400 and Rollout.objects.count() == 1


def test_a_pool_is_validated_node_by_idle_node(world: World, settings: Any) -> None:
    settings.SIMULATED_VALIDATION_SECONDS = 0
    submit(world.alice, world.vision, count=8)  # busy: one a100 node
    run_tick()
    pool = Pool.objects.get(name="a100-train")
    r = client_for(world.dave).post(f"/ops/pools/{pool.pk}/validate/")
    assert r.status_code == 302
    validated = sorted(ValidationRun.objects.values_list("node__name", flat=True))
    assert len(validated) == 3 and all(n.startswith("a100-") for n in validated)
    assert AuditEvent.objects.filter(action="node.validate").count() == 3
    rollouts_advance()
    states = dict(ValidationRun.objects.values_list("node__name", "state"))
    assert states.get("a100-02", "failed") == "failed"
    assert sum(1 for s in states.values() if s == "passed") >= 2


@pytest.mark.parametrize(
    "figures",
    [
        {"devices_visible": "eight"},
        {"devices_visible": 8, "nccl_busbw_gbps": [1]},
        {"devices_visible": 8, "nccl_busbw_gbps": 200, "dcgm_diag": "pass", "warmup_s": "x"},
    ],
)
def test_unreadable_reported_figures_fail_the_node_not_the_step(
    world: World, figures: dict
) -> None:
    node = Node.objects.get(name="a100-01")
    run = validation_start(actor=world.dave, node=node)
    validation_report(run=run, results=figures)
    rollouts_advance()
    run.refresh_from_db()
    assert run.state == "failed" and run.reason == "the results could not be read as numbers"


@pytest.mark.django_db(transaction=True)  # the node changes are written after commit
def test_an_admin_halts_a_running_rollout_and_its_burn_ins_still_finish(
    world: World, settings: Any
) -> None:
    settings.SIMULATED_VALIDATION_SECONDS = 3600  # the canary's burn-in runs on
    pool = Pool.objects.get(name="l4-shared")
    rollout = rollout_start(actor=world.dave, pool=pool, kind="driver", target="1.2")
    for _ in range(4):  # cordon, drain (nothing runs), apply, the change took: validate
        rollouts_advance()
    assert ValidationRun.objects.filter(state="running").count() == 1
    assert client_for(world.bob).post(f"/api/v1/rollouts/{rollout.pk}/halt/").status_code == 403
    r = client_for(world.dave).post(
        f"/api/v1/rollouts/{rollout.pk}/halt/",
        {"reason": "bad batch"},
        content_type="application/json",
    )
    assert r.status_code == 200 and r.json()["state"] == "halted"
    assert r.json()["halt_reason"] == "halted by dave in wave 0: bad batch"
    again = client_for(world.dave).post(f"/api/v1/rollouts/{rollout.pk}/halt/")
    assert again.status_code == 400 and "state" in again.json()["errors"]
    assert AuditEvent.objects.filter(action="rollout.halt", actor=world.dave).count() == 1
    settings.SIMULATED_VALIDATION_SECONDS = 0
    rollouts_advance()
    assert ValidationRun.objects.get().state == "passed"
    assert Node.objects.get(name="l4-01").cordoned  # left for an admin to return


def test_a_missing_rollout_is_404_and_only_admins_halt(world: World, settings: Any) -> None:
    dave, erin = client_for(world.dave), client_for(auditor(settings))
    assert dave.get("/ops/rollouts/999999/").status_code == 404
    assert dave.get("/api/v1/rollouts/999999/").status_code == 404
    assert dave.post("/ops/rollouts/999999/halt/").status_code == 404
    assert dave.post("/api/v1/rollouts/999999/halt/", {}, "application/json").status_code == 404
    assert erin.post("/ops/rollouts/999999/halt/").status_code == 403
    assert erin.post("/api/v1/rollouts/999999/halt/", {}, "application/json").status_code == 403


@pytest.mark.parametrize(
    ("engine", "words"),
    [
        ("none", "time-slicing — memory is not isolated"),
        ("time-slicing", "time-slicing — memory is not isolated"),
        ("mps", "MPS — per-slice memory limit and compute share enforced"),
        ("hami", "HAMi — per-slice memory and compute caps enforced"),
    ],
)
def test_the_pool_page_says_how_the_gpus_are_shared(world: World, engine: str, words: str) -> None:
    pool = Pool.objects.get(partitioning="time-slicing")
    Pool.objects.filter(pk=pool.pk).update(sharing_engine=engine)
    html = client_for(world.dave).get(f"/ops/pools/{pool.pk}/lifecycle/").content.decode()
    assert f'<span data-testid="sharing">{words}</span>' in html
    whole = Pool.objects.get(name="a100-train")
    assert 'data-testid="sharing"' not in (
        client_for(world.dave).get(f"/ops/pools/{whole.pk}/lifecycle/").content.decode()
    )
