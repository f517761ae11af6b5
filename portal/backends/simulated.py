"""The simulated cluster: nodes from a YAML file, workloads that live in the database.

A workload starts a moment after it is created, runs for its simulated
duration and ends with its simulated exit code; a stopped one reports
PREEMPTED. Web, worker and beat are separate processes, so the workloads are
rows, not memory.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.backends.base import (
    InventoryDevice,
    InventoryMig,
    InventoryNode,
    LaunchSpec,
    Outcome,
    WorkloadStatus,
    gang_status,
    member_name,
    rendezvous_env,
)
from portal.bulk import insert_rows
from portal.models import SimulatedWorkload
from scheduling import mig

START_DELAY = timedelta(seconds=1)


def _names(name: str, pods: int) -> list[str]:
    return [member_name(name, r) for r in range(pods)] if pods > 1 else [name]


class ClusterFileError(ValueError):
    pass


def load_cluster(path: str | Path) -> dict[str, Any]:
    """Read and check a simulated-cluster YAML file."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ClusterFileError(f"{path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("pools"), list):
        raise ClusterFileError(f"{path}: expected a mapping with a 'pools' list")
    for pool in data["pools"]:
        for key in ("name", "gpu_model", "gpu_memory_mib", "nodes"):
            if key not in pool:
                raise ClusterFileError(f"{path}: pool {pool.get('name', '?')} lacks '{key}'")
    return data


def mig_instances(layout: list[str], model: str, memory_mib: int) -> tuple[InventoryMig, ...]:
    """Lay out MIG profiles on one device by NVIDIA's geometry for its GPU family."""
    family = mig.family_for(model, memory_mib)
    placed = mig.layout(family, layout) if family is not None else None
    if placed is None:
        raise ClusterFileError(f"MIG layout {layout} does not fit one {model} device")
    return tuple(InventoryMig(m.profile, m.start, m.size) for m in placed)


def inventory_from_file(path: str | Path) -> list[InventoryNode]:
    data = load_cluster(path)
    nodes: list[InventoryNode] = []
    for pool in data["pools"]:
        spec = pool["nodes"]
        partitioning = pool.get("partitioning", "exclusive")
        migs = (
            mig_instances(
                pool.get("mig_layout", []), pool["gpu_model"], int(pool["gpu_memory_mib"])
            )
            if partitioning == "mig"
            else ()
        )
        for i in range(int(spec.get("count", 1))):
            name = f"{spec.get('prefix', pool['name'])}-{i + 1:02d}"
            unhealthy = set(spec.get("unhealthy", {}).get(name, []))
            devices = tuple(
                InventoryDevice(
                    index=d,
                    model=pool["gpu_model"],
                    memory_mib=int(pool["gpu_memory_mib"]),
                    uuid=f"GPU-sim-{name}-{d}",
                    healthy=d not in unhealthy,
                    partitioning=partitioning,
                    replicas=int(pool.get("replicas", 1)),
                    mig_instances=migs,
                )
                for d in range(int(spec.get("gpus", 8)))
            )
            nodes.append(
                InventoryNode(
                    name=name,
                    pool=pool["name"],
                    cpu_milli=int(spec.get("cpu_milli", 64000)),
                    memory_mib=int(spec.get("memory_mib", 512 * 1024)),
                    devices=devices,
                    labels={
                        "nvidia.com/gpu.product": pool["gpu_model"],
                        **pool.get("node_selector", {}),
                    },
                    taints=tuple(
                        (t["key"], t.get("value", ""), t.get("effect", "NoSchedule"))
                        for t in pool.get("taints", [])
                    ),
                    ready=name not in set(spec.get("not_ready", [])),
                    interconnect=pool.get("interconnect", "pcie"),
                )
            )
    return nodes


class SimulatedBackend:
    name = "simulated"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def inventory(self) -> list[InventoryNode]:
        return inventory_from_file(self.path)

    def launch(self, spec: LaunchSpec) -> None:
        """One workload per pod: a gang of N runs N workloads, each on its own node."""
        now = timezone.now()
        for member in spec.members():
            try:
                with transaction.atomic():
                    SimulatedWorkload.objects.create(**_workload(member, now))
            except IntegrityError:
                # Created before: a retried launch adopts it.
                pass

    def launch_many(self, specs: list[LaunchSpec]) -> None:
        """`launch` for each spec, in bulk inserts (the tick launches all it admitted at once)."""
        now = timezone.now()
        insert_rows(
            SimulatedWorkload,
            [_workload(member, now) for spec in specs for member in spec.members()],
            # Created before: a retried launch adopts it.
            ignore_conflicts=True,
        )

    def stop(self, name: str, namespace: str, grace_seconds: int = 30, pods: int = 1) -> None:
        SimulatedWorkload.objects.filter(
            name__in=_names(name, pods), namespace=namespace, stopped_at__isnull=True
        ).update(stopped_at=timezone.now())

    def status(self, name: str, namespace: str, pods: int = 1) -> WorkloadStatus:
        if pods > 1:
            members = [self._status(n, namespace) for n in _names(name, pods)]
            return gang_status(name, namespace, members)
        return self._status(name, namespace)

    def _status(self, name: str, namespace: str) -> WorkloadStatus:
        w = SimulatedWorkload.objects.filter(name=name, namespace=namespace).first()
        if w is None:
            return WorkloadStatus(name, namespace, Outcome.MISSING)
        now = timezone.now()
        if w.stopped_at is not None:
            return WorkloadStatus(
                name, namespace, Outcome.PREEMPTED, "Deleted", "stopped by the portal"
            )
        if now < w.starts_at:
            return WorkloadStatus(name, namespace, Outcome.PENDING)
        if now < w.ends_at:
            return WorkloadStatus(name, namespace, Outcome.RUNNING)
        if w.exit_code == 0:
            return WorkloadStatus(name, namespace, Outcome.SUCCEEDED, "Completed", exit_code=0)
        return WorkloadStatus(
            name,
            namespace,
            Outcome.FAILED,
            "Error",
            f"exited with code {w.exit_code}",
            exit_code=w.exit_code,
        )


def _workload(member: LaunchSpec, now: datetime) -> dict[str, Any]:
    """The SimulatedWorkload row of one pod."""
    return {
        "name": member.name,
        "namespace": member.namespace,
        "node": member.node,
        "spec": {
            "image": member.image,
            "command": list(member.command),
            "attempt": member.attempt_id,
            "env": dict(rendezvous_env(member)),
            "devices": [g.device for g in member.grants],
        },
        "created_at": now,
        "starts_at": now + START_DELAY,
        "ends_at": now + START_DELAY + timedelta(seconds=max(1, member.simulated_duration_s)),
        "exit_code": member.simulated_exit_code,
    }
