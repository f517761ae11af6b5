"""The openb trace loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.trace import (
    TracePod,
    load_nodes,
    load_pods,
    parse_gpu_spec,
    to_shape,
    workload_name,
)
from scheduling.types import Partitioning, ProfileKind

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces" / "alibaba-gpu-v2023"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_nodes(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,V100M32\nn1,8000,1024,0,\n",
    )
    n0, n1 = load_nodes(path)
    assert (n0.name, n0.pool, n0.cpu_milli, n0.memory_mib) == ("n0", "openb", 64000, 262144)
    assert [d.index for d in n0.devices] == [0, 1]
    assert {d.model for d in n0.devices} == {"V100M32"}
    assert {d.memory_mib for d in n0.devices} == {32768}
    assert {d.partitioning for d in n0.devices} == {Partitioning.TIME_SLICING}
    assert n1.devices == ()


def test_load_pods_full_and_short_columns(tmp_path: Path) -> None:
    full = _write(
        tmp_path,
        "openb_pod_list_default.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,6000,12288,1,460,V100M16|V100M32,LS,Running,427061,12902960,427061\n"
        "p1,1000,100,0,0,,BE,Pending,5,,\n",
    )
    p0, p1 = load_pods(full)
    assert p0 == TracePod(
        "p0",
        6000,
        12288,
        1,
        460,
        frozenset({"V100M16", "V100M32"}),
        "LS",
        "Running",
        427061,
        12902960,
        427061,
    )
    assert p1.scheduled_time is None and p1.deletion_time is None and p1.creation_time == 5
    short = _write(
        tmp_path,
        "openb_pod_list_multigpu20.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,2,8,1000\n",
    )
    (p,) = load_pods(short)
    assert p.num_gpu == 8 and p.gpu_spec == frozenset() and p.creation_time is None
    assert workload_name(short) == "multigpu20" and workload_name(full) == "default"


@pytest.mark.parametrize(
    ("num_gpu", "gpu_milli", "kind", "count", "milli"),
    [
        (0, 0, ProfileKind.WHOLE, 0, 1000),
        (1, 460, ProfileKind.SHARED, 1, 460),
        (1, 1000, ProfileKind.WHOLE, 1, 1000),
        (8, 1000, ProfileKind.WHOLE, 8, 1000),
    ],
)
def test_to_shape(num_gpu: int, gpu_milli: int, kind: ProfileKind, count: int, milli: int) -> None:
    shape = to_shape(TracePod("p", 4000, 512, num_gpu, gpu_milli, parse_gpu_spec("T4|T4")))
    assert (shape.kind, shape.count, shape.milli) == (kind, count, milli)
    assert (shape.cpu_milli, shape.memory_mib, shape.gpu_models) == (4000, 512, frozenset({"T4"}))
    assert shape.gpus_milli == num_gpu * gpu_milli


@pytest.mark.skipif(not TRACES.exists(), reason="shared traces not present")
def test_real_trace_counts() -> None:
    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213
    assert sum(len(n.devices) for n in nodes) == 6212
    pods = load_pods(TRACES / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert sum(p.gpu_request_milli for p in pods) == 6086800
