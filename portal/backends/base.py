"""The cluster backend interface: inventory in, workloads out, status back.

Two implementations: `simulated` (the embedded default, a YAML-described
cluster whose workloads run for a simulated duration) and `kubernetes` (the
official client). The tick and the reconciler speak only this interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
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
    #: held by a pod Quartermaster did not create (healthy is then False: not usable)
    foreign: bool = False
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
class DiscoveredNode:
    """A node with NVIDIA GPUs as the cluster labels it, whether or not a pool selects it."""

    name: str
    labels: dict[str, str]
    gpus: int
    #: (key, value, effect)
    taints: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class GrantSpec:
    device: int
    milli: int
    gpu_memory_mib: int = 0
    mig_profile: str = ""
    mig_start: int = -1


@dataclass(frozen=True)
class PodLaunch:
    """One pod of a gang: its rank, the node the packer chose and its devices there."""

    rank: int
    node: str
    grants: tuple[GrantSpec, ...]


#: the rendezvous port every gang pod listens on (MASTER_PORT; the headless Service's port)
RENDEZVOUS_PORT = 29500


def member_name(gang: str, rank: int) -> str:
    """The workload name of a gang's pod `rank` (a gang of one keeps the attempt's name)."""
    return f"{gang}-{rank}"


def rendezvous_env(spec: LaunchSpec) -> tuple[tuple[str, str], ...]:
    """What a gang member is told about its gang, on every backend.

    MASTER_ADDR is rank 0's name under the gang's headless Service
    (`<gang>-0.<gang>.<namespace>.svc`): pods set `hostname` and `subdomain`.
    The PET_* twins are what a bare `torchrun train.py` reads (one node per pod,
    one process per device of the pod).
    """
    if not spec.gang:
        return ()
    master = f"{member_name(spec.gang, 0)}.{spec.gang}.{spec.namespace}.svc"
    return (
        ("WORLD_SIZE", str(spec.world_size)),
        ("RANK", str(spec.rank)),
        ("MASTER_ADDR", master),
        ("MASTER_PORT", str(RENDEZVOUS_PORT)),
        ("PET_NNODES", str(spec.world_size)),
        ("PET_NODE_RANK", str(spec.rank)),
        ("PET_MASTER_ADDR", master),
        ("PET_MASTER_PORT", str(RENDEZVOUS_PORT)),
        ("PET_NPROC_PER_NODE", str(max(1, len(spec.grants)))),
    )


def checkpoint_claim(request_id: int) -> str:
    """The name of a request's checkpoint storage: its PVC, its simulated folder."""
    return f"qm-ckpt-{request_id}"


def checkpoint_path(attempt_id: int) -> str:
    """Where an attempt's workload reports a finished checkpoint (docs/checkpoints.md)."""
    return f"/api/v1/attempts/{attempt_id}/checkpoint"


def checkpoint_env(
    spec: LaunchSpec, directory: str, *, url: str = "", token: str = ""
) -> tuple[tuple[str, str], ...]:
    """What a checkpointing workload is told, on every backend (docs/checkpoints.md).

    Set by the platform, never by a request (`QM_*` is reserved in portal.lib.contract):
    only for a request with a checkpoint interval. `QM_RESUME=1` on an attempt that
    follows a preempted or node-lost one, whose checkpoints are in the same directory.
    """
    if spec.checkpoint_interval_s <= 0:
        return ()
    env = [
        ("QM_CHECKPOINT_INTERVAL_S", str(spec.checkpoint_interval_s)),
        ("QM_CHECKPOINT_DIR", directory),
    ]
    if spec.resume:
        env.append(("QM_RESUME", "1"))
    if url and token:
        env += [("QM_CHECKPOINT_URL", url), ("QM_ATTEMPT_TOKEN", token)]
    return tuple(env)


@dataclass(frozen=True)
class ServingSpec:
    """What makes an attempt a serving workload: replicas of a model server that run until
    stopped (a Deployment and a Service on Kubernetes; docs/serving.md)."""

    model: str
    revision: str
    #: "vllm", "tgi" or "triton": the metric names its /metrics serves
    runtime: str
    #: the class's TTFT p95 objective, seconds (0 = none)
    ttft_objective_s: float = 0.0


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one attempt, built by the server from stored rows only.

    A gang (a request with `pods` > 1) is one LaunchSpec with `pods` set, one
    `PodLaunch` per pod; `members()` splits it into one spec per pod, each with
    its `rank`, `world_size` and the gang's name. A single pod has `pods == ()`
    and `node`/`grants` say where it runs.
    """

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
    #: what shares the pool's GPUs between slices: none, time-slicing, mps, hami
    sharing_engine: str = "none"
    tolerations: tuple[tuple[str, str, str], ...] = ()
    max_runtime_s: int = 0
    #: simulated backend: how long the workload runs, and whether it fails
    simulated_duration_s: int = 0
    simulated_exit_code: int = 0
    #: a gang: every pod, rank 0 first (rank 0 hosts the rendezvous, MASTER_ADDR)
    pods: tuple[PodLaunch, ...] = ()
    #: set on a gang member (from `members()`): its rank, the gang's size and name
    rank: int = 0
    world_size: int = 1
    gang: str = ""
    #: seconds between checkpoints; 0 = the request does not checkpoint (no storage)
    checkpoint_interval_s: int = 0
    #: an earlier attempt was preempted or lost its node: resume from the checkpoint storage
    resume: bool = False
    #: set for a serving workload (replicas of a model server, `pods` of them)
    serving: ServingSpec | None = None
    #: the ProvisioningRequest that asked for the nodes this attempt was admitted to wait
    #: for (an autoscaled pool): its pods consume the capacity the cluster autoscaler
    #: booked for it; "" = none
    provisioning_request: str = ""

    @property
    def checkpoint_claim(self) -> str:
        return checkpoint_claim(self.request_id)

    @property
    def is_gang(self) -> bool:
        return self.world_size > 1 or len(self.pods) > 1

    def members(self) -> tuple[LaunchSpec, ...]:
        """One spec per pod: a gang's members (named `<name>-<rank>`), or this spec alone."""
        if len(self.pods) <= 1:
            return (self,)
        return tuple(
            replace(
                self,
                name=member_name(self.name, p.rank),
                node=p.node,
                grants=p.grants,
                pods=(),
                rank=p.rank,
                world_size=len(self.pods),
                gang=self.name,
            )
            for p in self.pods
        )


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


#: `WorkloadStatus.reason` of a workload another controller holds back: the portal never
#: suspends its Jobs, so a suspended one was suspended by someone else (Kueue, most likely:
#: docs/kubernetes.md, "Running beside Kueue")
SUSPENDED_BY_OTHERS = "SuspendedByOthers"


@dataclass(frozen=True)
class WorkloadStatus:
    name: str
    namespace: str
    outcome: Outcome
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    #: a gang: how many of its pods still run or wait to (their devices are held)
    active_pods: int = 0
    #: the last checkpoint the workload finished, where the backend knows it (simulated)
    last_checkpoint_at: datetime | None = None
    #: a gang: the rank of the pod whose ending this is (its log says why)
    pod: int = 0


@dataclass(frozen=True)
class WorkloadEvent:
    """One event about a workload (a Kubernetes Event of its Job or pods, or the simulation's)."""

    at: datetime | None
    #: "Normal" or "Warning"
    type: str
    reason: str
    message: str
    #: what it is about, e.g. "Job/qm-4-1" or "Pod/qm-4-1-x7k2p"
    object: str = ""


#: log lines kept on an attempt when it ends (the failure message shows them)
STORED_LOG_LINES = 40


@dataclass(frozen=True)
class ValidationSpec:
    """One node's burn-in workload (docs/lifecycle.md): all its GPUs, pinned to it, tolerating
    its cordon. `resources` are the extended resources it takes (e.g. {"nvidia.com/gpu": 8})."""

    name: str
    namespace: str
    node: str
    resources: tuple[tuple[str, int], ...]
    #: physical GPUs on the node: the device-visibility check expects them all
    devices: int = 0
    #: the `dcgmi diag -r` level to run
    dcgm_level: int = 1
    #: where the workload reports its results (empty: the results are read from its log)
    report_url: str = ""
    token: str = ""


@dataclass(frozen=True)
class ValidationStatus:
    """How a burn-in stands: not done yet, or done with its results (or a failure message)."""

    done: bool
    results: dict[str, object] = field(default_factory=dict)
    #: the workload itself failed (it never produced results): why
    error: str = ""
    #: not done because the workload does not exist (a launch lost): start it again
    missing: bool = False


#: the line a burn-in workload prints its results on, JSON after the prefix
VALIDATION_RESULT_PREFIX = "QM_VALIDATION "


class ClusterBackend(Protocol):
    name: str

    def gpu_nodes(self) -> list[DiscoveredNode]:
        """Every node with NVIDIA GPUs, pool or not (discovery)."""
        ...

    def inventory(self) -> list[InventoryNode]:
        """Every GPU node with what it can offer now."""
        ...

    def launch(self, spec: LaunchSpec) -> None:
        """Create the workload; creating one that exists already is not an error."""
        ...

    def stop(self, name: str, namespace: str, grace_seconds: int = 30, pods: int = 1) -> None:
        """Delete the workload (all `pods` of a gang) with a grace period; missing is fine."""
        ...

    def status(self, name: str, namespace: str, pods: int = 1) -> WorkloadStatus:
        """The workload's current outcome (MISSING if it does not exist); a gang's as a whole."""
        ...

    def checkpoints_delete(self, request_id: int, namespace: str) -> None:
        """Delete a request's checkpoint storage once it has ended for good; missing is fine."""
        ...

    def logs(
        self, name: str, namespace: str, tail_lines: int = 200, pods: int = 1, pod: int = 0
    ) -> str:
        """The last `tail_lines` lines the workload printed ("" if none or gone); of a gang,
        the pod of rank `pod` (rank 0 unless asked)."""
        ...

    def events(self, name: str, namespace: str, pods: int = 1) -> list[WorkloadEvent]:
        """Events about the workload and its pods, oldest first ([] if none or gone)."""
        ...

    def node_patch(
        self, name: str, labels: dict[str, str | None], unschedulable: bool | None = None
    ) -> None:
        """Set (None: remove) node labels, and cordon or uncordon the node."""
        ...

    def validation_launch(self, spec: ValidationSpec, started_at: datetime) -> None:
        """Start a node's burn-in; starting one that exists already is not an error."""
        ...

    def validation_status(self, spec: ValidationSpec, started_at: datetime) -> ValidationStatus:
        """The burn-in's state; done with results, or with `error` if it failed to run."""
        ...

    def validation_stop(self, spec: ValidationSpec) -> None:
        """Delete the burn-in workload; missing is fine."""
        ...

    def driver_api_in_use(self) -> str:
        """How a driver rollout tells the GPU Operator a version: "nvidiadriver",
        "clusterpolicy" or "labels" (GPU_OPERATOR_DRIVER_API; docs/lifecycle.md)."""
        ...

    def driver_version_write(self, api: str, name: str, version: str) -> None:
        """Ask the GPU Operator for `version`: the NVIDIADriver `name` (selecting the nodes
        labelled with it), or the ClusterPolicy; nothing with "labels"."""
        ...

    def device_plugin_version_write(self, version: str) -> None:
        """Set the device plugin's version on the GPU Operator's ClusterPolicy (under either
        Operator API: NVIDIADriver has no plugin field). LookupError when there is none."""
        ...

    def device_plugin_version(self, node: str) -> str:
        """The version the GPU Operator's device plugin runs on `node` (its Ready pod's image
        tag); "" when none is known or it is restarting."""
        ...


#: member outcomes that end a gang: the portal stops the other pods (all or nothing)
GANG_ENDINGS = (
    Outcome.FAILED,
    Outcome.OOM,
    Outcome.IMAGE_PULL,
    Outcome.DEVICE_ERROR,
    Outcome.PREEMPTED,
    Outcome.NODE_LOST,
)


def gang_status(name: str, namespace: str, members: list[WorkloadStatus]) -> WorkloadStatus:
    """A gang's outcome from its pods' (rank order). Checked in this order:

    1. a pod ended by failure, eviction or node loss -> that outcome (the lowest
       rank's), so that the portal stops the rest: a gang runs whole or not at all;
    2. every pod missing -> MISSING; some missing -> MISSING too (a create was
       lost: the relaunch creates the missing ones, adopting the others);
    3. every pod succeeded -> SUCCEEDED;
    4. every pod running or done -> RUNNING: started all or nothing;
    5. otherwise PENDING (some pods are not running yet).

    `active_pods` counts the pods still running or waiting: a gang being stopped
    has ended only when none is left.
    """
    active = sum(1 for st in members if st.outcome in (Outcome.RUNNING, Outcome.PENDING))
    return replace(_gang_outcome(name, namespace, members), active_pods=active)


def _gang_outcome(name: str, namespace: str, members: list[WorkloadStatus]) -> WorkloadStatus:
    for rank, st in enumerate(members):
        if st.outcome in GANG_ENDINGS:
            return replace(
                st,
                name=name,
                namespace=namespace,
                message=f"pod {rank}: {st.message or st.reason}",
                pod=rank,
            )
    missing = [r for r, st in enumerate(members) if st.outcome == Outcome.MISSING]
    if missing:
        return WorkloadStatus(
            name,
            namespace,
            Outcome.MISSING,
            "NotFound",
            f"pods {', '.join(map(str, missing))} of {len(members)} do not exist",
        )
    outcomes = {st.outcome for st in members}
    if outcomes == {Outcome.SUCCEEDED}:
        return WorkloadStatus(name, namespace, Outcome.SUCCEEDED, "Completed", exit_code=0)
    if outcomes <= {Outcome.RUNNING, Outcome.SUCCEEDED}:
        return WorkloadStatus(name, namespace, Outcome.RUNNING, "Running")
    waiting = sum(1 for st in members if st.outcome == Outcome.PENDING)
    return WorkloadStatus(
        name,
        namespace,
        Outcome.PENDING,
        "GangStarting",
        f"{waiting} of {len(members)} pods not running yet",
    )
