"""The cluster backend interface: inventory in, workloads out, status back.

Two implementations: `simulated` (the embedded default, a YAML-described
cluster whose workloads run for a simulated duration) and `kubernetes` (the
official client). The tick and the reconciler speak only this interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class LaunchRefused(ValueError):
    """The backend will never run this spec as it is: the attempt ends, its devices go back."""


@dataclass(frozen=True)
class InventoryMig:
    profile: str
    start: int
    size: int


@dataclass(frozen=True)
class InventoryDevice:
    index: int
    model: str
    memory_mib: int
    uuid: str = ""
    healthy: bool = True
    #: "exclusive", "time-slicing" or "mig"
    partitioning: str = "exclusive"
    replicas: int = 1
    mig_instances: tuple[InventoryMig, ...] = ()


@dataclass(frozen=True)
class InventoryNode:
    name: str
    #: the pool the node belongs to (matched by label selector on a real cluster)
    pool: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[InventoryDevice, ...]
    labels: dict[str, str] = field(default_factory=dict)
    #: (key, value, effect)
    taints: tuple[tuple[str, str, str], ...] = ()
    ready: bool = True
    cordoned: bool = False
    interconnect: str = "pcie"


@dataclass(frozen=True)
class GrantSpec:
    device: int
    milli: int
    gpu_memory_mib: int = 0
    mig_profile: str = ""
    mig_start: int = -1


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one attempt, built by the server from stored rows only."""

    #: deterministic workload name, unique per attempt ("qm-<request>-<attempt>")
    name: str
    namespace: str
    request_id: int
    attempt_id: int
    attempt_number: int
    team: str
    workload_class: str
    priority_class: str
    pool: str
    node: str
    image: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    #: "whole", "mig" or "shared"
    profile_kind: str
    grants: tuple[GrantSpec, ...]
    cpu_milli: int
    memory_mib: int
    tolerations: tuple[tuple[str, str, str], ...] = ()
    #: every node of a gang (`node` is the first); empty or one node: a single pod
    nodes: tuple[str, ...] = ()
    max_runtime_s: int = 0
    #: simulated backend: how long the workload runs, and whether it fails
    simulated_duration_s: int = 0
    simulated_exit_code: int = 0


class Outcome(StrEnum):
    """How a workload stands, as the backend classifies it."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: preempted or evicted by the cluster: requeue, not charged to the user
    PREEMPTED = "preempted"
    #: the node went away: requeue from the last checkpoint
    NODE_LOST = "node_lost"
    #: image could not be pulled within the ready timeout: failed, no requeue
    IMAGE_PULL = "image_pull"
    #: killed for memory: failed
    OOM = "oom"
    #: the device plugin refused the pod (e.g. UnexpectedAdmissionError): bounded retries
    DEVICE_ERROR = "device_error"
    #: the workload is gone and nothing says why
    MISSING = "missing"


@dataclass(frozen=True)
class WorkloadStatus:
    name: str
    namespace: str
    outcome: Outcome
    reason: str = ""
    message: str = ""
    exit_code: int | None = None


class ClusterBackend(Protocol):
    name: str

    def inventory(self) -> list[InventoryNode]:
        """Every GPU node with what it can offer now."""
        ...

    def launch(self, spec: LaunchSpec) -> None:
        """Create the workload; creating one that exists already is not an error."""
        ...

    def stop(self, name: str, namespace: str, grace_seconds: int = 30) -> None:
        """Delete the workload with a grace period; a missing one is not an error."""
        ...

    def status(self, name: str, namespace: str) -> WorkloadStatus:
        """The workload's current outcome (MISSING if it does not exist)."""
        ...
