"""Loader for the Alibaba "openb" GPU trace (cluster-trace-gpu-v2023, the FGD paper's trace).

Two CSV kinds (see /work/shared/traces/README.md):

* node lists `openb_node_list_*.csv`: `sn,cpu_milli,memory_mib,gpu,model`;
* pod lists `openb_pod_list_*.csv`: `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
  pod_phase,creation_time,deletion_time,scheduled_time` (the `multigpu*` files have only the
  first five columns).

Quartermaster's own derivations (not in the trace, labelled as such in docs/packer.md):

1. Every trace GPU is a `TIME_SLICING` device with `replicas=1`, which the packer reads as
   "no cap on the number of slices, only on the compute share" — the trace shares GPUs by
   `gpu_milli` alone.
2. GPU memory per device comes from the model name (`TRACE_GPU_MEMORY_MIB`); the trace has no
   VRAM column. G2 and G3 are anonymised models whose memory is unknown: 16 GiB is assumed.
3. A pod becomes a `Shape` by `to_shape`: `num_gpu == 0` is a CPU-only request (`count=0`),
   `num_gpu == 1` with `gpu_milli < 1000` a shared slice, anything else `num_gpu` whole GPUs.
   `gpu_spec` (`V100M16|V100M32`) becomes `Shape.gpu_models`.

Times are kept as the trace gives them: seconds from the start of the trace, `None` when the
cell is empty or the column is absent.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from scheduling.types import (
    WHOLE_GPU_MILLI,
    Device,
    Node,
    Partitioning,
    ProfileKind,
    Shape,
)

#: pool name given to every node of a trace node list
TRACE_POOL = "openb"

#: GPU memory in MiB per trace model name (derivation 2 above)
TRACE_GPU_MEMORY_MIB: dict[str, int] = {
    "A10": 24 * 1024,
    "G2": 16 * 1024,  # anonymised model: assumed
    "G3": 16 * 1024,  # anonymised model: assumed
    "P100": 16 * 1024,
    "T4": 16 * 1024,
    "V100M16": 16 * 1024,
    "V100M32": 32 * 1024,
}

#: memory assumed for a model not in TRACE_GPU_MEMORY_MIB
UNKNOWN_GPU_MEMORY_MIB = 16 * 1024


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of an openb pod list."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    #: GPU share per GPU (0–1000), not GPU memory
    gpu_milli: int
    #: allowed GPU models; empty = any
    gpu_spec: frozenset[str] = frozenset()
    qos: str = ""
    pod_phase: str = ""
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None

    @property
    def gpu_request_milli(self) -> int:
        """Total GPU milli this pod asks for (`num_gpu × gpu_milli`)."""
        return self.num_gpu * self.gpu_milli

    def to_shape(self) -> Shape:
        """The request this pod makes of the packer (derivation 3 above)."""
        return to_shape(self)


def to_shape(pod: TracePod) -> Shape:
    """Turn a trace pod into a `Shape` (see the module docstring, derivation 3)."""
    if pod.num_gpu == 0:
        return Shape(
            kind=ProfileKind.WHOLE,
            count=0,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
            gpu_models=pod.gpu_spec,
        )
    if pod.num_gpu == 1 and pod.gpu_milli < WHOLE_GPU_MILLI:
        return Shape(
            kind=ProfileKind.SHARED,
            count=1,
            milli=pod.gpu_milli,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
            gpu_models=pod.gpu_spec,
        )
    return Shape(
        kind=ProfileKind.WHOLE,
        count=pod.num_gpu,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpu_models=pod.gpu_spec,
    )


def _int_or_none(cell: str | None) -> int | None:
    if cell is None or cell.strip() == "":
        return None
    return int(float(cell))


def trace_device(index: int, model: str) -> Device:
    """A trace GPU: time-sliced, no cap on slice count, memory from the model name."""
    return Device(
        index=index,
        model=model,
        memory_mib=TRACE_GPU_MEMORY_MIB.get(model, UNKNOWN_GPU_MEMORY_MIB),
        partitioning=Partitioning.TIME_SLICING,
    )


def load_nodes(path: str | Path, pool: str = TRACE_POOL) -> list[Node]:
    """Read an openb node list into `Node`s, in file order."""
    nodes: list[Node] = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            model = (row.get("model") or "").strip()
            gpus = int(row["gpu"] or 0)
            nodes.append(
                Node(
                    name=row["sn"],
                    pool=pool,
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    devices=tuple(trace_device(i, model) for i in range(gpus)),
                    labels=(("gpu-model", model),) if model else (),
                )
            )
    return nodes


def parse_gpu_spec(cell: str | None) -> frozenset[str]:
    """`"V100M16|V100M32"` -> frozenset({"V100M16", "V100M32"}); empty -> frozenset()."""
    if not cell:
        return frozenset()
    return frozenset(part.strip() for part in cell.split("|") if part.strip())


def load_pods(path: str | Path) -> list[TracePod]:
    """Read an openb pod list into `TracePod`s, in file order."""
    pods: list[TracePod] = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            pods.append(
                TracePod(
                    name=row["name"],
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    num_gpu=int(row["num_gpu"]),
                    gpu_milli=int(row["gpu_milli"]),
                    gpu_spec=parse_gpu_spec(row.get("gpu_spec")),
                    qos=row.get("qos") or "",
                    pod_phase=row.get("pod_phase") or "",
                    creation_time=_int_or_none(row.get("creation_time")),
                    deletion_time=_int_or_none(row.get("deletion_time")),
                    scheduled_time=_int_or_none(row.get("scheduled_time")),
                )
            )
    return pods


def workload_name(path: str | Path) -> str:
    """`openb_pod_list_default.csv` -> "default"; other names -> the file stem."""
    stem = Path(path).stem
    prefix = "openb_pod_list_"
    return stem[len(prefix) :] if stem.startswith(prefix) else stem
