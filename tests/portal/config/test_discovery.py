"""Discovery: GPU nodes grouped by their GPU labels, flagged, each open group with a proposed pool."""

from __future__ import annotations

from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.test import Client

from portal.backends.base import DiscoveredNode
from portal.lib.config import check
from portal.models import AuditEvent, Pool
from portal.selectors import discovery
from tests.base import World, make_world


def node(name: str, **labels: str) -> DiscoveredNode:
    return DiscoveredNode(name=name, labels=labels, gpus=8)


A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}
H100_MIG = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/mig.strategy": "mixed",
}


def test_it_groups_nodes_flags_them_and_proposes_pools() -> None:
    nodes = [
        node("a-1", **A100, pool="train"),
        node("a-2", **A100),
        node("h-1", **H100_MIG, **{"nvidia.com/mig.config": "all-1g.10gb"}),
        node("h-2", **H100_MIG, **{"nvidia.com/mig.config": "all-balanced"}),
    ]
    pools = {
        "train": {"pool": "train"},
        "all-a100": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
    }
    groups = discovery.group_nodes(nodes, pools)
    assert [[n.name for n in g.nodes] for g in groups] == [["a-1", "a-2"], ["h-1"], ["h-2"]]
    a100 = groups[0]
    assert [n.flag for n in a100.nodes] == ["2 pools select it: all-a100, train", ""]
    assert a100.proposal is not None and a100.proposal["partitioning"] == "exclusive"
    one_g, balanced = groups[1].proposal, groups[2].proposal
    assert groups[1].nodes[0].flag == "no pool selects it"
    assert one_g["mig_layout"] == ["1g.10gb"] * 7
    assert balanced["mig_layout"] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    # two groups of one product are told apart by their MIG configuration
    assert one_g["node_selector"]["nvidia.com/mig.config"] == "all-1g.10gb"
    assert one_g["name"] != balanced["name"]
    # the proposals are a valid configuration file
    assert check({"version": 1, "pools": [one_g, balanced, a100.proposal]}) == []


def test_a_group_one_pool_selects_needs_no_proposal() -> None:
    groups = discovery.group_nodes([node("a-1", **A100)], {"a": {"nvidia.com/gpu.memory": "81920"}})
    assert groups[0].proposal is None and groups[0].nodes[0].pools == ["a"]


class FakeBackend:
    def gpu_nodes(self) -> list[DiscoveredNode]:
        return [
            node("a100-01", **A100, **{"quartermaster.io/pool": "a100-train"}),
            node(
                "l40s-01",
                **{"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.memory": "46068"},
            ),
        ]


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery, "get_backend", FakeBackend)


@pytest.mark.django_db
def test_the_command_prints_groups_and_a_config_snippet(fake_cluster: None) -> None:
    make_world()
    out = StringIO()
    call_command("discover", stdout=out)
    text = out.getvalue()
    assert "a100-01  8 GPU(s)  pool a100-train" in text
    assert "l40s-01  8 GPU(s)  no pool selects it" in text
    out = StringIO()
    call_command("discover", "--yaml", stdout=out)
    doc = yaml.safe_load(out.getvalue())
    assert [p["name"] for p in doc["pools"]] == ["nvidia-l40s"]
    assert check(doc) == []


@pytest.mark.django_db
def test_an_admin_creates_the_proposed_pool_in_one_step(fake_cluster: None) -> None:
    w: World = make_world()
    admin = Client()
    admin.force_login(w.dave)
    page = admin.get("/ops/discover/").content.decode()
    assert "no pool selects it" in page and "Create pool nvidia-l40s" in page
    r = admin.post("/ops/discover/create/", {"name": "nvidia-l40s"})
    assert r.status_code == 302
    pool = Pool.objects.get(name="nvidia-l40s")
    assert pool.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert pool.gpu_memory_mib == 46068
    assert AuditEvent.objects.filter(action="pool.create", object_id=str(pool.pk)).exists()
    lead = Client()
    lead.force_login(w.alice)
    assert lead.get("/ops/discover/").status_code == 403
    assert lead.post("/ops/discover/create/", {"name": "nvidia-l40s"}).status_code == 403


def test_it_flags_an_unknown_mig_gpu_and_proposes_no_pool_for_it() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-GB300",
        "nvidia.com/gpu.memory": "284208",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "all-balanced",
    }
    (group,) = discovery.group_nodes([node("g-1", **labels)], {})
    assert group.problem == "unknown MIG GPU NVIDIA-GB300: not scheduled as MIG"
    assert group.nodes[0].flag == group.problem
    assert group.proposal is None


def test_it_proposes_the_balanced_layout_of_a_4_slice_gpu() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A30",
        "nvidia.com/gpu.memory": "24576",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "all-balanced",
    }
    (group,) = discovery.group_nodes([node("a30-1", **labels)], {})
    assert group.problem == ""
    assert group.proposal is not None
    assert group.proposal["mig_layout"] == ["2g.12gb", "1g.6gb", "1g.6gb"]


class UnknownMigBackend:
    def gpu_nodes(self) -> list[DiscoveredNode]:
        return [
            node(
                "gb300-01",
                **{
                    "nvidia.com/gpu.product": "NVIDIA-GB300",
                    "nvidia.com/gpu.memory": "284208",
                    "nvidia.com/mig.strategy": "mixed",
                    "nvidia.com/mig.config": "all-1g.35gb",
                },
            )
        ]


@pytest.mark.django_db
def test_the_page_tells_the_admin_an_unknown_mig_gpu_is_not_scheduled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(discovery, "get_backend", UnknownMigBackend)
    w: World = make_world()
    admin = Client()
    admin.force_login(w.dave)
    page = admin.get("/ops/discover/").content.decode()
    words = "unknown MIG GPU NVIDIA-GB300: not scheduled as MIG"
    assert f'<p class="notice" data-testid="problem">{words}</p>' in page
    assert f'data-testid="flag">{words}</span>' in page
    assert "Create pool" not in page
