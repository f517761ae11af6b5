"""The handover set's generated parts: the cluster audit and the Mermaid cluster diagram
(docs/cluster-diagram.md is the diagram of the demo cluster, regenerated here)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

import portal
from portal.tick.run import run_tick
from tests.base import World, make_world, submit

ROOT = Path(portal.__file__).resolve().parents[1]


@pytest.fixture
def world(db: None) -> World:
    return make_world()


def test_the_committed_cluster_diagram_is_the_demo_clusters(tmp_path: Path) -> None:
    out = tmp_path / "diagram.md"
    call_command(
        "cluster_diagram",
        cluster_file="portal/demo/cluster.yaml",
        output=str(out),
        stdout=StringIO(),
    )
    assert out.read_text() == (ROOT / "docs" / "cluster-diagram.md").read_text(), (
        "run: python manage.py cluster_diagram --cluster-file portal/demo/cluster.yaml "
        "--output docs/cluster-diagram.md"
    )
    text = out.read_text()
    assert "driver 535.183.01 (drift)" in text and "style n_a100_04 stroke-dasharray" in text


def test_the_diagram_of_the_inventory_in_the_database(world: World) -> None:
    out = StringIO()
    call_command("cluster_diagram", stdout=out)
    text = out.getvalue()
    assert text.startswith("flowchart LR")
    assert 'subgraph n_pool_a100_train["pool a100-train: 32 GPUs"]' in text
    assert text.count("<br/>8× NVIDIA-A100-SXM4-80GB") == 4


def test_a_bad_cluster_file_is_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="--cluster-file"):
        call_command("cluster_diagram", cluster_file=str(tmp_path / "missing.yaml"))


def test_the_audit_shows_hardware_drivers_usage_and_pending_demand(world: World) -> None:
    for _ in range(5):
        submit(world.alice, world.vision, count=8)
    submit(world.carol, world.nlp, count=2, pool_name="l4-shared")
    run_tick()
    out = StringIO()
    call_command("audit_cluster", stdout=out)
    text = out.getvalue()
    assert (
        "| a100-train | production | NVIDIA-A100-SXM4-80GB (80 GiB) | exclusive | nvswitch | 4 | 32 |"
        in text
    )
    assert "driver: 535.183.01 ×1, 550.107.02 ×3 **drift**" in text
    assert "- vision on a100-train: 32 GPUs in 4 attempt(s)" in text
    assert "- vision: 1 training request(s) for whole on a100-train, 8 GPUs" in text
    data = json.loads(_run("audit_cluster", format="json", pool="l4-shared"))
    assert [h["pool"] for h in data["hardware"]] == ["l4-shared"]
    assert data["usage"] == [{"attempts": 1, "gpu_milli": 2000, "pool": "l4-shared", "team": "nlp"}]
    with pytest.raises(CommandError, match="--pool: no pool named 'nope'"):
        call_command("audit_cluster", pool="nope")


def _run(*args: str, **kw: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, **kw)
    return out.getvalue()
