"""The packing benchmark end to end on a small slice of the openb trace."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from scheduling.bench import packing

TRACES = packing.TRACE_DIR


def small_trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "openb_pod_list_small.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n0,96000,393216,8,G2\nn1,104000,524288,2,T4\nn2,32000,131072,4,V100M16\nn3,8000,32768,1,V100M16\n"
    )
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,4000,8192,1,1000,,LS,Running,0,10,0\n"
        "p1,6000,12288,1,460,,LS,Running,1,10,1\n"
        "p2,8000,16384,2,1000,,BE,Running,2,10,2\n"
        "p3,2000,4096,0,0,,BE,Running,3,10,3\n"
        "p4,4000,8192,1,500,V100M16,LS,Running,4,10,4\n"
        "p5,16000,8192,4,1000,,LS,Running,5,10,5\n"
    )
    return nodes, pods


def test_small_trace_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = small_trace(tmp_path)
    out = tmp_path / "placements.csv"
    argv = [
        "--json",
        "--nodes",
        str(nodes),
        "--pods",
        str(pods),
        "--policy",
        "fgd",
        "--seed",
        "3",
        "--placements",
        str(out),
    ]
    assert packing.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert row["policy"] == "fgd" and row["seed"] == 3 and row["workload"] == "small"
    assert set(row) >= {
        "alloc_at_100",
        "curve",
        "pods",
        "failed",
        "seconds",
        "placements_per_s",
        "peak_rss_mb",
    }
    assert list(row["curve"]) == [str(i) for i in range(131)]
    # inflated to 1.3 × 15 GPUs = 19.5 GPUs of requests
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == row["pods"]
    assert [int(r["seq"]) for r in rows] == list(range(len(rows)))
    assert sum(1 for r in rows if not r["node"]) == row["failed"]
    for r in rows:
        if r["node"] and r["gpus"]:
            for part in r["gpus"].split(";"):
                dev, milli = part.split(":")
                assert 0 <= int(dev) < 8 and 0 < int(milli) <= 1000
    # the same run again gives the same placements (deterministic)
    again = tmp_path / "again.csv"
    packing.main([*argv[:-1], str(again)])
    assert again.read_text() == out.read_text()


def test_several_policies_and_seeds_print_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = small_trace(tmp_path)
    assert (
        packing.main(
            [
                "--nodes",
                str(nodes),
                "--pods",
                str(pods),
                "--policy",
                "all",
                "--seeds",
                "1-2",
                "--replicate",
                "2",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert len(rows) == 2 * len(packing.ALL_POLICIES)
    assert {r["policy"] for r in rows} == set(packing.ALL_POLICIES)
    assert "mean ± sd" in captured.err


def test_arrivals_inflate_to_tune() -> None:
    from scheduling.trace import TracePod

    pods = [TracePod(f"p{i}", 0, 0, 1, 1000) for i in range(5)]
    seq = packing.arrivals(pods, 42, capacity_milli=10_000, tune=1.3)
    assert len(seq) == 13  # 5 originals + 8 draws = 13 GPUs <= 13 GPUs
    assert sorted(p.name for p in seq[:5]) == [p.name for p in pods]
    assert packing.arrivals(pods, 42, 10_000, 1.3) == seq


def test_parse_seeds() -> None:
    assert packing.parse_seeds("42-45") == [42, 43, 44, 45]
    assert packing.parse_seeds("1,3") == [1, 3]


@pytest.mark.skipif(
    not (TRACES / "openb_pod_list_default.csv").exists(), reason="shared traces not present"
)
def test_real_trace_slice(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        packing.main(["--limit", "300", "--tune", "0.05", "--policy", "default", "--seed", "42"])
        == 0
    )
    row = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert row["workload"] == "default" and row["pods"] >= 300


def one_gpu_trace(tmp_path: Path) -> tuple[Path, Path]:
    """One node with one GPU; two 1-GPU pods and a CPU-only one: one GPU pod cannot fit."""
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,32768,1,T4\n")
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,2000,4096,1,1000,,LS,Running,0,10,0\n"
        "p1,2000,4096,1,1000,,LS,Running,100,10,1\n"
        "c0,1000,1024,0,0,,BE,Running,200,10,2\n"
    )
    return nodes, pods


@pytest.mark.parametrize("per_tick", [1, 2, 3])
def test_per_tick_counts_what_its_tick_does_not_admit_as_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], per_tick: int
) -> None:
    nodes, pods = one_gpu_trace(tmp_path)
    out = tmp_path / "placements.csv"
    argv = ["--json", "--nodes", str(nodes), "--pods", str(pods), "--seed", "1"]
    argv += ["--per-tick", str(per_tick), "--placements", str(out)]
    assert packing.main(argv) == 0
    row = json.loads(capsys.readouterr().out.strip())
    assert row["policy"] == "fgd-bestfit" and row["workload"] == "tiny"
    assert row["pods"] == 3 and row["failed"] == 1
    # 2 GPUs arrived of 1: the last bin with arrivals (200 %) is past the curve; at 100 %
    # the one GPU was allocated
    assert row["alloc_at_100"] == 100.0
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["node"] for r in rows].count("") == 1
    assert {r["node"] for r in rows} == {"", "n0"}


def test_per_tick_runs_schedule_with_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tick goes through schedule() with the pool's history, fed before the tick."""
    from scheduling import workload
    from scheduling.trace import load_nodes, load_pods
    from scheduling.types import Policy

    nodes_csv, pods_csv = small_trace(tmp_path)
    ticks: list[tuple[int, dict[object, float]]] = []
    real = packing.schedule

    def spy(snap, now_ms, policy):  # type: ignore[no-untyped-def]
        (wl,) = snap.workloads
        ticks.append((len(snap.pending), dict(wl.weights)))
        assert all(workload.shape_key(r.shape) in dict(wl.weights) for r in snap.pending)
        return real(snap, now_ms, policy)

    monkeypatch.setattr(packing, "schedule", spy)
    pods = load_pods(pods_csv)
    r = packing.run_per_tick(
        load_nodes(nodes_csv), pods, per_tick=2, seed=5, workload="small", policy=Policy()
    )
    assert len(ticks) == (r.pods + 1) // 2
    assert [n for n, _ in ticks[:-1]] == [2] * (len(ticks) - 1)
    # cold start: the prior of the nodes, then the requests outweigh it
    first, last = ticks[0][1], ticks[-1][1]
    assert sum(last.values()) > sum(first.values())
    assert len(r.curve) == packing.BINS
