"""`manage.py config export` and `config apply`: the site as one YAML file, applied idempotently."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from portal.lib.config import ConfigError, check, parse
from portal.models import AuditEvent, Pool, Quota, Team, WorkloadClass
from tests.base import World, make_world

pytestmark = pytest.mark.django_db

DEMO_CLUSTER = Path(__file__).resolve().parents[3] / "portal" / "demo" / "cluster.yaml"


@pytest.fixture
def world() -> World:
    return make_world()


def export() -> str:
    out = StringIO()
    call_command("config", "export", stdout=out)
    return out.getvalue()


def apply(tmp_path: Path, text: str, *args: str) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    out = StringIO()
    call_command("config", "apply", "-f", str(path), *args, stdout=out)
    return out.getvalue()


def test_export_then_apply_changes_nothing(world: World, tmp_path: Path) -> None:
    text = export()
    events = AuditEvent.objects.count()
    assert apply(tmp_path, text, "--dry-run").strip() == "No changes."
    assert apply(tmp_path, text).strip() == "No changes."
    assert AuditEvent.objects.count() == events
    # every object the file names is now marked as managed by it
    assert all(Pool.objects.values_list("config_managed", flat=True))
    assert all(Team.objects.values_list("config_managed", flat=True))
    assert export() == text


def test_it_prints_the_diff_field_by_field_and_audits_each_change(
    world: World, tmp_path: Path
) -> None:
    doc = yaml.safe_load(export())
    vision = next(t for t in doc["teams"] if t["name"] == "vision")
    vision["quotas"]["a100-train"]["nominal_milli"] = 20000
    doc["classes"].append({"name": "urgent", "band": 900, "preemption": "never"})
    doc["pools"] = [p for p in doc["pools"] if p["name"] != "l4-shared"]
    for team in doc["teams"]:
        team["quotas"].pop("l4-shared", None)
    text = yaml.safe_dump(doc)

    dry = apply(tmp_path, text, "--dry-run", "--prune")
    assert "changed quota vision@a100-train\n    nominal_milli: 16000 -> 20000" in dry
    assert "created class urgent" in dry
    assert "retired pool l4-shared" in dry
    assert not WorkloadClass.objects.filter(name="urgent").exists()
    assert Pool.objects.get(name="l4-shared").retired_at is None

    assert apply(tmp_path, text, "--prune") == dry.replace("would change", "changed")
    quota = Quota.objects.get(team__name="vision", pool__name="a100-train")
    assert quota.nominal_milli == 20000
    event = AuditEvent.objects.filter(action="quota.set").latest("id")
    assert (event.before["nominal_milli"], event.after["nominal_milli"]) == (16000, 20000)
    assert AuditEvent.objects.filter(action="class.create").count() == 1
    assert AuditEvent.objects.filter(action="pool.retire").count() == 1
    assert apply(tmp_path, text, "--prune").strip() == "No changes."


def test_without_prune_it_keeps_what_the_file_leaves_out(world: World, tmp_path: Path) -> None:
    doc = yaml.safe_load(export())
    doc["pools"] = [p for p in doc["pools"] if p["name"] != "l4-shared"]
    out = apply(tmp_path, yaml.safe_dump(doc))
    assert "not in the file (kept; --prune retires it) pool l4-shared" in out
    assert Pool.objects.get(name="l4-shared").retired_at is None


def test_it_refuses_a_bad_file_with_every_error_at_its_path(world: World, tmp_path: Path) -> None:
    doc = yaml.safe_load(export())
    doc["teams"][0]["colour"] = "red"
    doc["pools"][0]["node_selector"] = {"quartermaster.io/pool": "bad value!"}
    doc["pools"][1]["taints"] = [{"key": "x", "effect": "Sometimes"}]
    events = AuditEvent.objects.count()
    with pytest.raises(CommandError) as exc:
        apply(tmp_path, yaml.safe_dump(doc))
    message = str(exc.value)
    assert "nothing was changed" in message
    assert "teams[0]: Additional properties are not allowed ('colour' was unexpected)" in message
    assert (
        "pools[0].node_selector.quartermaster.io/pool: 'bad value!' is not a Kubernetes label value"
        in message
    )
    assert "pools[1].taints[0].effect" in message
    assert AuditEvent.objects.count() == events


def test_an_error_met_while_applying_rolls_back_everything(world: World, tmp_path: Path) -> None:
    doc = yaml.safe_load(export())
    doc["teams"][0]["weight"] = 7
    mig = next(p for p in doc["pools"] if p["partitioning"] == "mig")
    mig["mig_layout"] = ["4g.40gb", "4g.40gb"]  # two 4g slices do not fit one H100
    i = doc["pools"].index(mig)
    with pytest.raises(CommandError) as exc:
        apply(tmp_path, yaml.safe_dump(doc))
    assert f"pools[{i}].mig_layout: These profiles do not fit together" in str(exc.value)
    assert Team.objects.get(name=doc["teams"][0]["name"]).weight != 7


def test_it_creates_a_site_from_an_empty_database(tmp_path: Path) -> None:
    text = """
version: 1
profiles: [{name: whole, kind: whole}]
pools:
  - name: a100
    gpu_model: NVIDIA-A100-SXM4-80GB
    gpu_memory_mib: 81920
    node_selector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
classes: [{name: training, band: 100, default_profile: whole}]
teams:
  - name: vision
    quotas: {a100: {nominal_milli: 8000, granted_milli: 8000}}
"""
    out = apply(tmp_path, text)
    assert out.splitlines()[:5] == [
        "created profile whole",
        "created pool a100",
        "created team vision",
        "created class training",
        "created quota vision@a100",
    ]
    assert Quota.objects.get(team__name="vision").granted_milli == 8000
    assert apply(tmp_path, text).strip() == "No changes."


def test_a_pool_s_gpu_model_cannot_change_in_place(world: World, tmp_path: Path) -> None:
    doc = yaml.safe_load(export())
    doc["pools"][0]["gpu_model"] = "NVIDIA-L4"
    with pytest.raises(CommandError, match=r"pools\[0\].gpu_model: cannot change"):
        apply(tmp_path, yaml.safe_dump(doc))


def test_the_demo_cluster_file_is_a_valid_config_file() -> None:
    doc = parse(DEMO_CLUSTER.read_text(), str(DEMO_CLUSTER))
    assert {p["name"] for p in doc["pools"]} >= {"a100-train", "h100-mig"}
    assert check(doc) == []


def test_parse_reports_yaml_errors() -> None:
    with pytest.raises(ConfigError, match="not YAML"):
        parse("pools: [", "x.yaml")


def test_memberships_by_group_come_from_the_file_and_sign_in_applies_them(
    world: World, tmp_path: Path, settings
) -> None:
    from django.contrib.auth import get_user_model

    from portal.models import Membership
    from portal.services.sso import sso_sync

    settings.OIDC_GROUP_MAP = []
    doc = yaml.safe_load(export())
    nlp = next(t for t in doc["teams"] if t["name"] == "nlp")
    nlp["groups"] = {"gpu-nlp": "member", "gpu-nlp-leads": "lead"}
    out = apply(tmp_path, yaml.safe_dump(doc))
    assert (
        "changed team nlp\n    groups: {} -> {'gpu-nlp': 'member', 'gpu-nlp-leads': 'lead'}" in out
    )
    eve = get_user_model().objects.create_user("eve")
    sso_sync(user=eve, groups=["gpu-nlp-leads", "gpu-nlp"])
    assert Membership.objects.get(user=eve, team__name="nlp").role == "lead"
    nlp["groups"] = {"gpu-nlp": "boss"}
    with pytest.raises(CommandError, match=r"teams\[\d\]\.groups\.gpu-nlp: 'boss' is not one of"):
        apply(tmp_path, yaml.safe_dump(doc))


def _inference(doc: dict) -> dict:
    return next(c for c in doc["classes"] if c["name"] == "inference")


def test_a_class_s_kinds_and_pools_go_through_the_file(world: World, tmp_path: Path) -> None:
    from portal.services.pools import workload_class_update

    wc = WorkloadClass.objects.get(name="inference")
    workload_class_update(
        actor=None,
        workload_class=wc,
        kinds=["serving"],
        pools=[Pool.objects.get(name="h100-mig")],
    )
    doc = yaml.safe_load(export())
    assert (_inference(doc)["kinds"], _inference(doc)["pools"]) == (["serving"], ["h100-mig"])
    training = next(c for c in doc["classes"] if c["name"] == "training")
    assert (training["kinds"], training["pools"]) == ([], [])
    assert apply(tmp_path, export()).strip() == "No changes."

    _inference(doc)["kinds"] = ["batch", "serving"]
    _inference(doc)["pools"] = ["a100-train", "h100-mig"]
    events = AuditEvent.objects.latest("id").pk
    out = apply(tmp_path, yaml.safe_dump(doc))
    assert "changed class inference" in out
    assert "    kinds: ['serving'] -> ['batch', 'serving']" in out
    assert "    pools: ['h100-mig'] -> ['a100-train', 'h100-mig']" in out
    wc.refresh_from_db()
    assert wc.kinds == ["batch", "serving"]
    assert sorted(wc.pools.values_list("name", flat=True)) == ["a100-train", "h100-mig"]
    event = AuditEvent.objects.get(action="class.pools", id__gt=events)
    assert event.after == {"pools": ["a100-train", "h100-mig"]}
    event = AuditEvent.objects.get(action="class.update", id__gt=events)
    assert (event.before["kinds"], event.after["kinds"]) == (["serving"], ["batch", "serving"])
    assert apply(tmp_path, yaml.safe_dump(doc)).strip() == "No changes."

    # left out: every kind, every pool (the model's defaults), as for the other keys
    del _inference(doc)["kinds"], _inference(doc)["pools"]
    out = apply(tmp_path, yaml.safe_dump(doc))
    assert "    pools: ['a100-train', 'h100-mig'] -> []" in out
    wc.refresh_from_db()
    assert wc.kinds == [] and not wc.pools.exists()


def test_a_class_s_kinds_and_pools_are_checked(world: World, tmp_path: Path) -> None:
    doc = yaml.safe_load(export())
    i = doc["classes"].index(_inference(doc))
    _inference(doc)["kinds"] = ["gpu"]
    assert any(e.startswith(f"classes[{i}].kinds[0]:") for e in check(doc))

    _inference(doc)["kinds"] = ["serving"]
    _inference(doc)["pools"] = ["nowhere"]
    with pytest.raises(CommandError) as cmd:
        apply(tmp_path, yaml.safe_dump(doc))
    assert f"classes[{i}].pools: no live pool 'nowhere'" in str(cmd.value)
    assert WorkloadClass.objects.get(name="inference").kinds == []


def test_export_then_apply_on_the_demo_changes_nothing(tmp_path: Path) -> None:
    from portal.demo.seed import seed

    seed()
    text = export()
    inference = _inference(yaml.safe_load(text))
    assert (inference["kinds"], inference["pools"]) == (["serving"], ["h100-mig"])
    assert apply(tmp_path, text).strip() == "No changes."


def test_prune_retires_a_team_the_file_leaves_out(world: World, tmp_path: Path) -> None:
    from tests.base import submit

    waiting = submit(world.carol, world.nlp, pool_name="l4-shared", count=1)
    doc = yaml.safe_load(export())
    doc["teams"] = [t for t in doc["teams"] if t["name"] != "nlp"]
    text = yaml.safe_dump(doc)

    out = apply(tmp_path, text)
    assert "not in the file (kept; --prune retires it) team nlp" in out
    assert Team.objects.get(name="nlp").retired_at is None

    dry = apply(tmp_path, text, "--dry-run", "--prune")
    assert "retired team nlp" in dry
    assert Team.objects.get(name="nlp").retired_at is None
    assert apply(tmp_path, text, "--prune") == dry.replace("would change", "changed")
    nlp = Team.objects.get(name="nlp")
    assert nlp.retired_at is not None
    waiting.refresh_from_db()
    assert waiting.state == "cancelled"
    event = AuditEvent.objects.get(action="team.retire", object_id=str(nlp.pk))
    assert event.actor is None and event.after["cancelled"] == 1
    # retired: out of the export, and the same name cannot come back in place
    assert "nlp" not in [t["name"] for t in yaml.safe_load(export())["teams"]]
    assert apply(tmp_path, text, "--prune").strip() == "No changes."
    doc["teams"].append({"name": "nlp"})
    with pytest.raises(CommandError) as exc:
        apply(tmp_path, yaml.safe_dump(doc))
    assert "teams[" in str(exc.value) and "team nlp is retired" in str(exc.value)


def test_a_pool_s_sharing_engine_goes_through_the_file(world: World, tmp_path: Path) -> None:
    doc = yaml.safe_load(export())
    shared = next(p for p in doc["pools"] if p["name"] == "l4-shared")
    assert shared["sharing_engine"] == "none"
    shared["sharing_engine"] = "hami"
    out = apply(tmp_path, yaml.safe_dump(doc))
    assert "sharing_engine" in out
    assert Pool.objects.get(name="l4-shared").sharing_engine == "hami"
    assert yaml.safe_load(export())["pools"] == doc["pools"]
    # only a time-slicing pool shares its GPUs; an unknown engine is refused at its path
    whole = next(p for p in doc["pools"] if p["partitioning"] == "exclusive")
    whole["sharing_engine"] = "mps"
    with pytest.raises(CommandError, match="sharing engine"):
        apply(tmp_path, yaml.safe_dump(doc))
    whole["sharing_engine"] = "magic"
    errors = check(doc)
    assert errors and "sharing_engine" in str(errors[0])
