"""The Kubernetes adapter: every call to the `kubernetes` client lives here.

Plain functions over a `CoreV1Api` / `BatchV1Api` that the caller passes in,
so tests hand in the in-memory fake (tests/fakes/fake_k8s.py) and nothing here
imports Django. Four jobs:

1. **Inventory** — `inventory_from_nodes()` turns Node objects (GPU Feature
   Discovery labels, `status.allocatable`, taints, readiness, cordon) into
   `InventoryNode`s, minus what pods that Quartermaster did not create already
   hold on each node (Quartermaster's own attempts are counted by the
   database's allocations, so counting them here would count them twice).
2. **Launch** — `job_build()` makes an allowlisted `batch/v1` Job from a
   `LaunchSpec`; `job_create()` creates it and adopts an existing one on `409`.
3. **Stop** — `job_delete()` deletes with a grace period; a missing Job is fine.
4. **Status** — `classify()` turns a Job and its pods into an `Outcome`;
   `WorkloadWatcher` keeps Jobs and pods current with a watch that relists on
   `410 Gone`, plus a periodic resync.

Names follow ECOSYSTEM.md §1–§2 verbatim; failure signals follow
RELIABILITY.md §6.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from portal.backends.base import (
    InventoryDevice,
    InventoryMig,
    InventoryNode,
    LaunchSpec,
    Outcome,
    WorkloadStatus,
)
from scheduling import mig

log = logging.getLogger(__name__)

# --- Names (ECOSYSTEM.md §1, §2) -------------------------------------------------

GPU = "nvidia.com/gpu"
GPU_SHARED = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"

LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_SHARING = "nvidia.com/gpu.sharing-strategy"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_MIG_STATE = "nvidia.com/mig.config.state"
LABEL_GPU_PRESENT = "nvidia.com/gpu.present"
LABEL_WORKLOAD_CONFIG = "nvidia.com/gpu.workload.config"
LABEL_HOSTNAME = "kubernetes.io/hostname"
#: fallback pool label when no pool selectors are configured
LABEL_POOL = "quartermaster.io/pool"
LABEL_INTERCONNECT = "quartermaster.io/interconnect"

# Labels on every Job and pod Quartermaster creates.
MANAGED_BY = "quartermaster"
L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_PART_OF = "app.kubernetes.io/part-of"
L_MANAGED_BY = "app.kubernetes.io/managed-by"
L_REQUEST = "quartermaster.io/request-id"
L_ATTEMPT_ID = "quartermaster.io/attempt-id"
L_ATTEMPT = "quartermaster.io/attempt"
L_TEAM = "quartermaster.io/team"
L_CLASS = "quartermaster.io/class"
L_POOL = "quartermaster.io/pool"
A_NODE = "quartermaster.io/node"
A_GRANTS = "quartermaster.io/grants"
MANAGED_SELECTOR = f"{L_MANAGED_BY}={MANAGED_BY}"

MAIN_CONTAINER = "main"
READY_CONTAINER = "wait-for-device"
#: exit codes of the readiness init container (see READY_SCRIPT)
READY_EXIT_BUSY = 75
READY_EXIT_REFUSED = 76

TERMINAL_PHASES = ("Succeeded", "Failed")

# --- Errors ------------------------------------------------------------------------


class LaunchRefused(ValueError):
    """The LaunchSpec asks for something a generated Job may never carry."""


class JobConflict(RuntimeError):
    """A Job with the deterministic name exists but belongs to another attempt."""


# --- Small helpers -----------------------------------------------------------------


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def quantity(value: Any) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "16Gi", "8"); garbage counts as zero."""
    try:
        return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError):
        return Decimal(0)


_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def label_value(value: object) -> str:
    """Return `value` made into a valid label value (≤ 63 chars, alphanumeric ends)."""
    text = _LABEL_VALUE_BAD.sub("-", str(value))[:63]
    return text.strip("-_.")


def _now() -> datetime:
    return datetime.now(UTC)


def _age_s(ts: datetime | None, now: datetime) -> float:
    if ts is None:
        return 0.0
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (now - ts).total_seconds()


# --- Inventory ---------------------------------------------------------------------


def nodes_list_gpu(core: Any, label_selector: str | None = None) -> list[Any]:
    """Every Node (optionally by label selector); GPU-less nodes drop out later."""
    kwargs = {"label_selector": label_selector} if label_selector else {}
    return list(core.list_node(**kwargs).items)


def pods_list_active(core: Any, namespaces: Sequence[str] | None = None) -> list[Any]:
    """Non-terminal pods: cluster-wide when `namespaces` is None, else from those namespaces."""
    selector = "status.phase!=Succeeded,status.phase!=Failed"
    if namespaces is None:
        return list(core.list_pod_for_all_namespaces(field_selector=selector).items)
    pods: list[Any] = []
    for ns in namespaces:
        pods.extend(core.list_namespaced_pod(ns, field_selector=selector).items)
    return pods


def pool_for_labels(
    labels: Mapping[str, str], pool_selectors: Mapping[str, Mapping[str, str]]
) -> str | None:
    """Return the pool whose selector matches the labels.

    1. a selector matches when every one of its labels has exactly that value;
       an empty selector matches nothing (it would grab every node);
    2. of several matches, the selector with the most labels wins;
    3. then the pool name, for deterministic ties.
    """
    matches = [
        (-len(sel), name)
        for name, sel in pool_selectors.items()
        if sel and all(labels.get(k) == str(v) for k, v in sel.items())
    ]
    return min(matches)[1] if matches else None


def pod_requests(pod: Any) -> dict[str, Decimal]:
    """Effective requests of a pod: max(sum of containers, largest init container) + overhead."""
    total: dict[str, Decimal] = {}
    for c in pod.spec.containers or ():
        for k, v in _container_requests(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in pod.spec.init_containers or ():
        for k, v in _container_requests(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    for k, v in (pod.spec.overhead or {}).items():
        total[k] = total.get(k, Decimal(0)) + quantity(v)
    return total


def _container_requests(container: Any) -> dict[str, Decimal]:
    res = container.resources
    if res is None:
        return {}
    # Extended resources may be given as limits only; requests then default to limits.
    merged = dict(res.limits or {})
    merged.update(res.requests or {})
    return {k: quantity(v) for k, v in merged.items()}


def is_managed(obj: Any) -> bool:
    labels = obj.metadata.labels or {}
    return labels.get(L_MANAGED_BY) == MANAGED_BY


def _node_ready(node: Any) -> bool:
    for cond in node.status.conditions or ():
        if cond.type == "Ready":
            return bool(cond.status == "True")
    return False


def _model(labels: Mapping[str, str]) -> str:
    product = labels.get(LABEL_PRODUCT, "")
    product = product.removesuffix("-SHARED")
    return product.split("-MIG-", 1)[0] or "unknown"


def _spread_units(count: int, per_device: int, usable: int) -> list[int]:
    """Usable units per device: fill devices in index order with `usable` units.

    Node objects do not say *which* device lost a unit (to a foreign pod or to
    the device plugin's health check), only how many; the node agent reports
    the real device. So the last devices are the ones shown short.
    """
    return [max(0, min(per_device, usable - i * per_device)) for i in range(count)]


def node_inventory(
    node: Any,
    pods: Iterable[Any],
    pool: str,
    *,
    require_mig_state: bool = True,
) -> InventoryNode:
    """Describe one GPU node as the packer sees it.

    Capacity comes from `status.allocatable` (the device plugin lowers it when
    a device turns unhealthy), never `capacity`, minus the requests of
    non-terminal pods on the node that Quartermaster did not create. A node
    whose MIG state (`nvidia.com/mig.config.state`) is not `success` offers no
    MIG instance: its devices are marked unhealthy so nothing is packed there.
    """
    labels = dict(node.metadata.labels or {})
    name = node.metadata.name
    alloc = {k: quantity(v) for k, v in (node.status.allocatable or {}).items()}
    cap = {k: quantity(v) for k, v in (node.status.capacity or {}).items()}
    used: dict[str, Decimal] = {}
    for pod in pods:
        if pod.spec.node_name != name or is_managed(pod) or pod.status.phase in TERMINAL_PHASES:
            continue
        for k, v in pod_requests(pod).items():
            used[k] = used.get(k, Decimal(0)) + v

    def free(resource: str) -> int:
        return max(0, int(alloc.get(resource, Decimal(0)) - used.get(resource, Decimal(0))))

    cpu_milli = max(0, int((alloc.get("cpu", Decimal(0)) - used.get("cpu", Decimal(0))) * 1000))
    memory_mib = max(
        0, int((alloc.get("memory", Decimal(0)) - used.get("memory", Decimal(0))) / 2**20)
    )
    taints = tuple((t.key, t.value or "", t.effect) for t in (node.spec.taints or ()))
    return InventoryNode(
        name=name,
        pool=pool,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        devices=_devices(labels, alloc, cap, free, require_mig_state),
        labels=labels,
        taints=taints,
        ready=_node_ready(node),
        cordoned=bool(node.spec.unschedulable),
        interconnect=labels.get(LABEL_INTERCONNECT, "pcie"),
    )


def _devices(
    labels: Mapping[str, str],
    alloc: Mapping[str, Decimal],
    cap: Mapping[str, Decimal],
    free: Callable[[str], int],
    require_mig_state: bool,
) -> tuple[InventoryDevice, ...]:
    model = _model(labels)
    memory = _int(labels.get(LABEL_MEMORY))
    strategy = labels.get(LABEL_MIG_STRATEGY, "none")
    mig_resources = sorted(
        k for k in alloc if k.startswith(MIG_PREFIX) and not k.endswith(".shared")
    )
    if strategy in ("single", "mixed") and (mig_resources or strategy == "single"):
        mig_ok = labels.get(LABEL_MIG_STATE) == "success" or not require_mig_state
        return _mig_devices(labels, strategy, mig_resources, free, model, mig_ok)
    sharing = labels.get(LABEL_SHARING, "none")
    count = max(_int(labels.get(LABEL_COUNT)), int(cap.get(GPU, Decimal(0))))
    if GPU_SHARED in alloc or sharing in ("time-slicing", "mps"):
        resource = GPU_SHARED if GPU_SHARED in alloc else GPU
        replicas = max(1, _int(labels.get(LABEL_REPLICAS), 1))
        count = _int(labels.get(LABEL_COUNT)) or math.ceil(
            int(cap.get(resource, Decimal(0))) / replicas
        )
        units = _spread_units(count, replicas, free(resource))
        return tuple(
            InventoryDevice(
                index=i,
                model=model,
                memory_mib=memory,
                healthy=u > 0,
                partitioning="time-slicing",
                replicas=max(u, 1),
            )
            for i, u in enumerate(units)
        )
    units = _spread_units(count, 1, free(GPU))
    return tuple(
        InventoryDevice(index=i, model=model, memory_mib=memory, healthy=u > 0)
        for i, u in enumerate(units)
    )


def _device_memory_from_product(product: str) -> int:
    match = re.search(r"(\d+)GB", product.split("-MIG-", 1)[0])
    return int(match.group(1)) * 1024 if match else 0


def _mig_devices(
    labels: Mapping[str, str],
    strategy: str,
    mig_resources: Sequence[str],
    free: Callable[[str], int],
    model: str,
    mig_ok: bool,
) -> tuple[InventoryDevice, ...]:
    """MIG devices with a layout synthesised from per-profile counts.

    Node objects give how many instances of each profile are allocatable, not
    on which GPU or where; the layout below places them biggest first, each at
    its highest allowed start, which reproduces NVIDIA's default layouts
    (`all-balanced`, `all-1g.*`). The node agent reports the real placement.
    """
    product = labels.get(LABEL_PRODUCT, "")
    if strategy == "single":
        profile = product.split("-MIG-", 1)[1] if "-MIG-" in product else ""
        wanted = {profile: free(GPU)} if profile else {}
        device_memory = _device_memory_from_product(product) or _int(labels.get(LABEL_MEMORY)) * 8
    else:
        wanted = {r.removeprefix(MIG_PREFIX): free(r) for r in mig_resources}
        device_memory = _int(labels.get(LABEL_MEMORY)) or _device_memory_from_product(product)
    count = _int(labels.get(LABEL_COUNT)) if strategy == "mixed" else 0
    layouts: list[list[InventoryMig]] = [[] for _ in range(count)]
    order = sorted(wanted, key=lambda p: (-_compute(p), p))
    for profile in order:
        prof = mig.profile_for(model, device_memory, profile)
        if prof is None:
            continue
        size, starts = prof.slots, prof.starts
        for n in range(wanted[profile]):
            _place(layouts, profile, size, starts, n, grow=strategy == "single")
    if not mig_ok:
        layouts = [[] for _ in layouts]
    return tuple(
        InventoryDevice(
            index=i,
            model=model,
            memory_mib=device_memory,
            partitioning="mig",
            healthy=mig_ok,
            mig_instances=tuple(sorted(lay, key=lambda m: m.start)),
        )
        for i, lay in enumerate(layouts)
    )


def _compute(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def _place(
    layouts: list[list[InventoryMig]],
    profile: str,
    size: int,
    starts: tuple[int, ...],
    n: int,
    grow: bool,
) -> None:
    """Put one instance on a device, trying device `n mod count` first (spread evenly)."""
    count = len(layouts)
    for k in range(count):
        lay = layouts[(n + k) % count]
        used = 0
        for m in lay:
            used |= ((1 << m.size) - 1) << m.start
        if sum(_compute(m.profile) for m in lay) + _compute(profile) > 7:
            continue
        for start in sorted(starts, reverse=True):
            mask = ((1 << size) - 1) << start
            if start + size <= 8 and not used & mask:
                lay.append(InventoryMig(profile=profile, start=start, size=size))
                return
    if grow:
        layouts.append([])
        _place(layouts, profile, size, starts, len(layouts) - 1, grow=False)
    else:
        log.warning("MIG %s: %d instance(s) do not fit the synthesised layout", profile, 1)


def inventory_from_nodes(
    nodes: Iterable[Any],
    pods: Iterable[Any],
    pool_selectors: Mapping[str, Mapping[str, str]] | None,
    *,
    require_mig_state: bool = True,
) -> list[InventoryNode]:
    """InventoryNodes for every node that belongs to a pool, sorted by name.

    With `pool_selectors` None a node's pool is its `quartermaster.io/pool`
    label. Nodes in no pool, without any NVIDIA resource, or configured for VM
    passthrough (`nvidia.com/gpu.workload.config` other than `container`) are
    left out.
    """
    pods = list(pods)
    out: list[InventoryNode] = []
    for node in nodes:
        labels = node.metadata.labels or {}
        if pool_selectors is None:
            pool = labels.get(LABEL_POOL)
        else:
            pool = pool_for_labels(labels, pool_selectors)
        if not pool:
            continue
        if labels.get(LABEL_WORKLOAD_CONFIG, "container") != "container":
            continue
        resources = set(node.status.allocatable or {}) | set(node.status.capacity or {})
        if not any(r.startswith("nvidia.com/") for r in resources):
            continue
        out.append(node_inventory(node, pods, pool, require_mig_state=require_mig_state))
    return sorted(out, key=lambda n: n.name)


def node_facts(node: Any) -> dict[str, Any]:
    """What a launch needs to know about its node: hostname label and resource names."""
    labels = node.metadata.labels or {}
    return {
        "hostname": labels.get(LABEL_HOSTNAME, node.metadata.name),
        "resources": sorted((node.status.allocatable or {}).keys()),
        "mig_strategy": labels.get(LABEL_MIG_STRATEGY, "none"),
    }


# --- Launch ------------------------------------------------------------------------

# The readiness init container. It asks the portal whether the devices this pod
# was given are free (the node agent saw no stray process and a healthy device)
# and exits 0 when they are. It polls inside one run rather than exiting and
# being restarted, because a Job with a podFailurePolicy must use
# restartPolicy Never, where a failing init container fails the pod.
# Contract (docs/kubernetes.md): GET <url>?devices=<NVIDIA_VISIBLE_DEVICES> with
# `Authorization: Bearer <attempt token>`; 200 {"ready": true} -> start;
# 200 {"ready": false} or 5xx or network error -> ask again; 403/404/410 -> give up.
READY_SCRIPT = """\
import json, os, sys, time, urllib.error, urllib.parse, urllib.request
url = os.environ["QM_READY_URL"]
devices = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
if devices:
    url += "?" + urllib.parse.urlencode({"devices": devices})
headers = {"Authorization": "Bearer " + os.environ["QM_READY_TOKEN"], "Accept": "application/json"}
deadline = time.monotonic() + int(os.environ.get("QM_READY_TIMEOUT", "300"))
interval = float(os.environ.get("QM_READY_INTERVAL", "5"))
while True:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            body = json.load(r)
        if body.get("ready"):
            print("devices ready"); sys.exit(0)
        print("waiting:", body.get("reason", "not ready"), flush=True)
    except urllib.error.HTTPError as e:
        if e.code in (403, 404, 410):
            print("portal refused:", e.code, flush=True); sys.exit(%(refused)d)
        print("portal answered", e.code, flush=True)
    except Exception as e:
        print("portal unreachable:", e, flush=True)
    if time.monotonic() > deadline:
        print("devices not free before the deadline", flush=True); sys.exit(%(busy)d)
    time.sleep(interval)
""" % {"refused": READY_EXIT_REFUSED, "busy": READY_EXIT_BUSY}


def attempt_token(key: str | bytes, namespace: str, name: str, attempt_id: int) -> str:
    """The per-attempt bearer token the readiness init container presents.

    An HMAC of the attempt's identity under a server key, so the portal can
    check it without storing it: recompute and `hmac.compare_digest`.
    """
    raw = key.encode() if isinstance(key, str) else key
    msg = f"quartermaster.attempt-ready:{namespace}/{name}/{attempt_id}".encode()
    return hmac.new(raw, msg, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class JobOptions:
    """Admin configuration of generated Jobs (never taken from a user's request)."""

    #: the portal's readiness URL prefix, e.g. "http://qm-web.qm.svc:8000"; "" disables the check
    portal_url: str = ""
    #: image of the readiness init container (the portal image: it has Python)
    ready_image: str = ""
    #: key for `attempt_token` (derived from SECRET_KEY by the backend)
    ready_token_key: str = ""
    ready_timeout_s: int = 300
    #: exit codes of the main container that fail the Job at once (137: OOMKilled,
    #: retrying the same spec fails the same way)
    fail_exit_codes: tuple[int, ...] = (137,)
    backoff_limit: int = 2
    ttl_seconds_after_finished: int = 86400
    #: SIGTERM -> SIGKILL grace for the pod, so training can checkpoint on preemption
    termination_grace_s: int = 30
    run_as_user: int = 1000
    run_as_group: int = 1000
    fs_group: int = 1000
    service_account: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    runtime_class: str = ""
    #: allowed image prefixes ("registry.example.com/", "nvcr.io/nvidia/"); empty allows any
    allowed_images: tuple[str, ...] = ()
    shm_size_mib: int = 1024
    #: resource name for time-sliced shares when the node cannot be asked
    shared_resource: str = GPU_SHARED


_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_FORBIDDEN_ENV = re.compile(r"^(NVIDIA_.*|CUDA_VISIBLE_DEVICES|QUARTERMASTER_.*|QM_.*)$")


def check_env(env: Iterable[tuple[str, str]]) -> None:
    """Refuse env names a user may not set (RELIABILITY.md §8.7).

    `NVIDIA_*` and `CUDA_VISIBLE_DEVICES` would let a container see GPUs it did
    not request; `QUARTERMASTER_*`/`QM_*` are set by the server.
    """
    for name, _ in env:
        if not _ENV_NAME.match(name):
            raise LaunchRefused(f"invalid environment variable name {name!r}")
        if _FORBIDDEN_ENV.match(name):
            raise LaunchRefused(f"environment variable {name} may not be set by a request")


def gpu_resource(
    spec: LaunchSpec, facts: Mapping[str, Any] | None, options: JobOptions
) -> tuple[str, int]:
    """Return (extended resource name, count) for the spec's profile on its node."""
    if not spec.grants:
        return "", 0
    resources = set((facts or {}).get("resources", ()))
    if spec.profile_kind == "whole":
        return GPU, len(spec.grants)
    if spec.profile_kind == "mig":
        profiles = {g.mig_profile for g in spec.grants}
        if len(profiles) != 1 or not next(iter(profiles)):
            raise LaunchRefused("a MIG launch needs exactly one MIG profile")
        if (facts or {}).get("mig_strategy") == "single":
            return GPU, len(spec.grants)
        return MIG_PREFIX + profiles.pop(), len(spec.grants)
    if spec.profile_kind == "shared":
        # A shared unit is an access right, not more compute: one per container.
        if len(spec.grants) != 1:
            raise LaunchRefused("a shared-GPU launch takes exactly one shared unit")
        if GPU_SHARED in resources or (not resources and options.shared_resource == GPU_SHARED):
            return GPU_SHARED, 1
        return GPU, 1
    raise LaunchRefused(f"unknown profile kind {spec.profile_kind!r}")


def job_labels(spec: LaunchSpec) -> dict[str, str]:
    return {
        L_NAME: "quartermaster-attempt",
        L_INSTANCE: spec.name,
        L_COMPONENT: label_value(spec.workload_class),
        L_PART_OF: "quartermaster",
        L_MANAGED_BY: MANAGED_BY,
        L_REQUEST: str(spec.request_id),
        L_ATTEMPT_ID: str(spec.attempt_id),
        L_ATTEMPT: str(spec.attempt_number),
        L_TEAM: label_value(spec.team),
        L_CLASS: label_value(spec.workload_class),
        L_POOL: label_value(spec.pool),
    }


def _security_context() -> client.V1SecurityContext:
    return client.V1SecurityContext(
        allow_privilege_escalation=False,
        capabilities=client.V1Capabilities(drop=["ALL"]),
        run_as_non_root=True,
        seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
    )


def _resources(
    cpu_milli: int, memory_mib: int, gpu: str, count: int
) -> client.V1ResourceRequirements:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cpu_milli:
        requests["cpu"] = f"{cpu_milli}m"
    if memory_mib:
        # Memory limit = request: an OOM kill is then the container's own doing.
        requests["memory"] = limits["memory"] = f"{memory_mib}Mi"
    if gpu:
        requests[gpu] = limits[gpu] = str(count)
    return client.V1ResourceRequirements(requests=requests or None, limits=limits or None)


def job_build(
    spec: LaunchSpec,
    options: JobOptions,
    facts: Mapping[str, Any] | None = None,
) -> client.V1Job:
    """Build the attempt's Job from server-side data only.

    Why a `batch/v1` Job: an attempt of a training or interactive request runs
    to completion once, and a Job gives exactly that with the failure handling
    this needs — `podFailurePolicy` (preemption does not count as a failure,
    listed exit codes fail at once), a small `backoffLimit`, a deadline and
    garbage collection after it finishes. Inference, which serves until
    stopped and may span replicas, will use a Deployment (or a LeaderWorkerSet
    for multi-node models) built the same way.
    """
    if not _DNS_LABEL.match(spec.name):
        raise LaunchRefused(
            f"workload name {spec.name!r} is not a DNS label of at most 63 characters"
        )
    if not _DNS_LABEL.match(spec.namespace):
        raise LaunchRefused(f"namespace {spec.namespace!r} is not a DNS label")
    if not spec.image or any(c.isspace() for c in spec.image):
        raise LaunchRefused("an image is required")
    if options.allowed_images and not spec.image.startswith(options.allowed_images):
        raise LaunchRefused(f"image {spec.image} is not from an allowed registry")
    if not spec.node:
        raise LaunchRefused("a launch needs the node the packer chose")
    check_env(spec.env)
    gpu, count = gpu_resource(spec, facts, options)
    labels = job_labels(spec)
    hostname = (facts or {}).get("hostname") or spec.node

    env = [client.V1EnvVar(name=k, value=v) for k, v in spec.env]
    env += [
        client.V1EnvVar(name="QUARTERMASTER_REQUEST_ID", value=str(spec.request_id)),
        client.V1EnvVar(name="QUARTERMASTER_ATTEMPT", value=str(spec.attempt_number)),
    ]
    shared_cap = max((g.gpu_memory_mib for g in spec.grants), default=0)
    if spec.profile_kind == "shared" and shared_cap:
        # Time-slicing does not isolate memory: tell frameworks the cap they agreed to.
        env.append(client.V1EnvVar(name="QUARTERMASTER_GPU_MEMORY_MIB", value=str(shared_cap)))
    if not gpu:
        # Without a GPU request the device plugin's envvar strategy would expose every GPU.
        env.append(client.V1EnvVar(name="NVIDIA_VISIBLE_DEVICES", value="void"))

    main = client.V1Container(
        name=MAIN_CONTAINER,
        image=spec.image,
        command=list(spec.command) or None,
        env=env,
        resources=_resources(spec.cpu_milli, spec.memory_mib, gpu, count),
        security_context=_security_context(),
        volume_mounts=[client.V1VolumeMount(name="dshm", mount_path="/dev/shm")],
    )
    init = _ready_container(spec, options, gpu, count)
    pod_spec = client.V1PodSpec(
        containers=[main],
        init_containers=[init] if init else None,
        restart_policy="Never",
        automount_service_account_token=False,
        service_account_name=options.service_account or None,
        enable_service_links=False,
        priority_class_name=spec.priority_class or None,
        runtime_class_name=options.runtime_class or None,
        termination_grace_period_seconds=options.termination_grace_s,
        image_pull_secrets=[
            client.V1LocalObjectReference(name=s) for s in options.image_pull_secrets
        ]
        or None,
        security_context=client.V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=options.run_as_user,
            run_as_group=options.run_as_group,
            fs_group=options.fs_group,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        ),
        # Required node affinity, never spec.nodeName: nodeName bypasses the
        # scheduler and the device plugin's admission (UnexpectedAdmissionError).
        affinity=client.V1Affinity(
            node_affinity=client.V1NodeAffinity(
                required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                    node_selector_terms=[
                        client.V1NodeSelectorTerm(
                            match_expressions=[
                                client.V1NodeSelectorRequirement(
                                    key=LABEL_HOSTNAME, operator="In", values=[hostname]
                                )
                            ]
                        )
                    ]
                )
            )
        ),
        tolerations=[_toleration(t) for t in spec.tolerations] or None,
        volumes=[
            client.V1Volume(
                name="dshm",
                empty_dir=client.V1EmptyDirVolumeSource(
                    medium="Memory", size_limit=f"{options.shm_size_mib}Mi"
                ),
            )
        ],
    )
    annotations = {
        A_NODE: spec.node,
        A_GRANTS: json.dumps(
            [
                {
                    "device": g.device,
                    "milli": g.milli,
                    "gpu_memory_mib": g.gpu_memory_mib,
                    "mig_profile": g.mig_profile,
                    "mig_start": g.mig_start,
                }
                for g in spec.grants
            ],
            separators=(",", ":"),
        ),
    }
    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(
            name=spec.name, namespace=spec.namespace, labels=labels, annotations=annotations
        ),
        spec=client.V1JobSpec(
            backoff_limit=options.backoff_limit,
            completions=1,
            parallelism=1,
            ttl_seconds_after_finished=options.ttl_seconds_after_finished,
            active_deadline_seconds=spec.max_runtime_s or None,
            # A replacement pod only once the old one is gone: never two pods on one device.
            pod_replacement_policy="Failed",
            pod_failure_policy=_pod_failure_policy(options, with_ready=init is not None),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels, annotations=annotations),
                spec=pod_spec,
            ),
        ),
    )


def _toleration(t: tuple[str, str, str]) -> client.V1Toleration:
    key, value, effect = t
    if value:
        return client.V1Toleration(key=key, operator="Equal", value=value, effect=effect or None)
    return client.V1Toleration(key=key, operator="Exists", effect=effect or None)


def _ready_container(
    spec: LaunchSpec, options: JobOptions, gpu: str, count: int
) -> client.V1Container | None:
    """The init container that waits until the node agent reports the devices free.

    It asks for the same GPU resources as the main container: the kubelet hands
    an init container's devices on to the app containers, so it sees (in
    NVIDIA_VISIBLE_DEVICES) exactly the devices the workload will get.
    """
    if not gpu or not options.portal_url:
        return None
    if not options.ready_image:
        raise LaunchRefused("JobOptions.ready_image is required when portal_url is set")
    url = f"{options.portal_url.rstrip('/')}/api/v1/agent/attempts/{spec.attempt_id}/ready"
    token = attempt_token(options.ready_token_key, spec.namespace, spec.name, spec.attempt_id)
    return client.V1Container(
        name=READY_CONTAINER,
        image=options.ready_image,
        command=["python3", "-c", READY_SCRIPT],
        env=[
            client.V1EnvVar(name="QM_READY_URL", value=url),
            client.V1EnvVar(name="QM_READY_TOKEN", value=token),
            client.V1EnvVar(name="QM_READY_TIMEOUT", value=str(options.ready_timeout_s)),
        ],
        resources=_resources(50, 64, gpu, count),
        security_context=_security_context(),
    )


def _pod_failure_policy(options: JobOptions, *, with_ready: bool) -> client.V1PodFailurePolicy:
    rules = [
        # Preemption, eviction, node loss: not the workload's fault, keeps backoffLimit.
        client.V1PodFailurePolicyRule(
            action="Ignore",
            on_pod_conditions=[
                client.V1PodFailurePolicyOnPodConditionsPattern(
                    type="DisruptionTarget", status="True"
                )
            ],
        )
    ]
    if with_ready:
        rules.append(
            client.V1PodFailurePolicyRule(
                action="FailJob",
                on_exit_codes=client.V1PodFailurePolicyOnExitCodesRequirement(
                    container_name=READY_CONTAINER,
                    operator="In",
                    values=[READY_EXIT_BUSY, READY_EXIT_REFUSED],
                ),
            )
        )
    codes = sorted({c for c in options.fail_exit_codes if 0 < c < 256})
    if codes:
        rules.append(
            client.V1PodFailurePolicyRule(
                action="FailJob",
                on_exit_codes=client.V1PodFailurePolicyOnExitCodesRequirement(
                    container_name=MAIN_CONTAINER, operator="In", values=codes
                ),
            )
        )
    return client.V1PodFailurePolicy(rules=rules)


def job_to_dict(job: Any) -> dict[str, Any]:
    """The Job as the API server would receive it (camelCase JSON)."""
    return client.ApiClient().sanitize_for_serialization(job)  # type: ignore[no-any-return,no-untyped-call]


def _retriable(exc: ApiException) -> bool:
    return bool(exc.status is None or exc.status == 429 or exc.status >= 500)


def job_create(
    batch: Any,
    job: Any,
    *,
    tries: int = 3,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """Create the Job; a `409` for a Job of the same attempt is success (adopted).

    A create that answered 5xx or timed out may have created the Job anyway,
    so it is retried (bounded), and a later `409` is read back and adopted when
    its request and attempt labels match; otherwise `JobConflict`.
    """
    ns, name = job.metadata.namespace, job.metadata.name
    for attempt in range(1, tries + 1):
        try:
            return batch.create_namespaced_job(ns, job)
        except ApiException as exc:
            if exc.status == 409:
                return _adopt(batch, job)
            if not _retriable(exc) or attempt == tries:
                raise
            log.warning("create Job %s/%s answered %s; retrying", ns, name, exc.status)
            sleep(min(0.5 * 2 ** (attempt - 1), 5.0))
    raise AssertionError("unreachable")  # pragma: no cover


def _adopt(batch: Any, job: Any) -> Any:
    ns, name = job.metadata.namespace, job.metadata.name
    existing = batch.read_namespaced_job(name, ns)
    have = existing.metadata.labels or {}
    want = job.metadata.labels
    for key in (L_MANAGED_BY, L_REQUEST, L_ATTEMPT_ID):
        if have.get(key) != want.get(key):
            raise JobConflict(
                f"Job {ns}/{name} exists with {key}={have.get(key)!r}, expected {want.get(key)!r}"
            )
    log.info("Job %s/%s exists already; adopted", ns, name)
    return existing


def job_delete(
    batch: Any,
    name: str,
    namespace: str,
    *,
    grace_seconds: int = 30,
    propagation: str = "Foreground",
) -> bool:
    """Delete the Job and its pods; return False when it was already gone.

    Foreground keeps the Job visible until its pods are gone, so the portal
    holds the devices until the workload really stopped (INV-8). The pods get
    SIGTERM and then their `terminationGracePeriodSeconds` (set from
    `JobOptions.termination_grace_s`) to checkpoint.
    """
    try:
        batch.delete_namespaced_job(
            name,
            namespace,
            body=client.V1DeleteOptions(
                grace_period_seconds=grace_seconds, propagation_policy=propagation
            ),
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def job_read(batch: Any, name: str, namespace: str) -> Any | None:
    try:
        return batch.read_namespaced_job(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def pods_for_workload(core: Any, name: str, namespace: str) -> list[Any]:
    selector = f"{L_INSTANCE}={name},{MANAGED_SELECTOR}"
    return list(core.list_namespaced_pod(namespace, label_selector=selector).items)


# --- Status ------------------------------------------------------------------------

_IMAGE_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
#: waiting reasons that do not heal by waiting; given the same timeout as image pulls
_CONFIG_WAITING = ("CreateContainerConfigError", "CreateContainerError")
_DISRUPTION_PREEMPTED = (
    "PreemptionByScheduler",
    "PreemptionByKubeScheduler",
    "EvictionByEvictionAPI",
    "TerminationByKubelet",
)
_DISRUPTION_NODE = ("DeletionByTaintManager", "DeletionByPodGC")
#: after a pod's own grace period, how long a Terminating pod may linger before its node counts as lost
TERMINATING_GRACE_S = 60


def _cond(obj: Any, type_: str) -> Any | None:
    for c in (obj.status.conditions or ()) if obj is not None and obj.status else ():
        if c.type == type_ and c.status == "True":
            return c
    return None


def _statuses(pod: Any) -> list[tuple[str, Any]]:
    st = pod.status
    return [("init", s) for s in (st.init_container_statuses or ())] + [
        ("main", s) for s in (st.container_statuses or ())
    ]


def _status(
    name: str,
    ns: str,
    outcome: Outcome,
    reason: str = "",
    message: str = "",
    exit_code: int | None = None,
) -> WorkloadStatus:
    return WorkloadStatus(
        name=name,
        namespace=ns,
        outcome=outcome,
        reason=reason,
        message=message,
        exit_code=exit_code,
    )


def classify(
    name: str,
    namespace: str,
    job: Any | None,
    pods: Sequence[Any],
    *,
    now: datetime | None = None,
    image_pull_timeout_s: int = 600,
) -> WorkloadStatus:
    """How an attempt stands, from its Job and pods. Checked in this order:

    1. no Job and no pod -> MISSING;
    2. Job `Complete` -> SUCCEEDED;
    3. a pod that ended for a reason that is not the workload's fault:
       disruption by preemption or eviction (`DisruptionTarget`, kubelet
       `Evicted`) -> PREEMPTED; by the taint manager or pod GC, or `NodeLost`
       -> NODE_LOST; the device plugin refused it (`UnexpectedAdmissionError`,
       `OutOf<resource>`) or the readiness check found the device busy ->
       DEVICE_ERROR;
    4. a container killed for memory -> OOM;
    5. Job `Failed` -> FAILED with the Job's reason (`DeadlineExceeded`,
       `BackoffLimitExceeded`, `PodFailurePolicy`) and the exit code;
    6. a container waiting on its image (or its config) past the timeout ->
       IMAGE_PULL (FAILED for config errors); `InvalidImageName` at once;
    7. a pod stuck Terminating past its grace period -> NODE_LOST;
       a pod Terminating within it -> RUNNING (its devices are still held);
    8. a running pod -> RUNNING; anything else -> PENDING.
    """
    now = now or _now()
    pods = sorted(pods, key=lambda p: (p.metadata.creation_timestamp or now, p.metadata.name))
    if job is None and not pods:
        return _status(name, namespace, Outcome.MISSING, "NotFound", "the Job does not exist")
    if job is not None and _cond(job, "Complete") is not None:
        return _status(name, namespace, Outcome.SUCCEEDED, "Completed", exit_code=0)
    for pod in reversed(pods):
        ended = _ended_not_by_workload(name, namespace, pod)
        if ended is not None:
            return _unless_still_terminating(ended, pod, now)
    for pod in reversed(pods):
        oom = _oom(name, namespace, pod)
        if oom is not None:
            return oom
    failed = _cond(job, "Failed")
    if failed is not None:
        return _status(
            name,
            namespace,
            Outcome.FAILED,
            failed.reason or "Failed",
            failed.message or "",
            exit_code=_last_exit_code(pods),
        )
    if not pods:
        return _status(name, namespace, Outcome.PENDING, "NoPod", "waiting for the Job's pod")
    pod = pods[-1]
    waiting = _waiting(name, namespace, pod, now, image_pull_timeout_s)
    if waiting is not None:
        return waiting
    if _terminating(pod):
        lost = _status(
            name,
            namespace,
            Outcome.NODE_LOST,
            "TerminatingTooLong",
            f"pod {pod.metadata.name} is stuck terminating; its node is unreachable",
        )
        return _unless_still_terminating(lost, pod, now)
    if pod.status.phase == "Running":
        return _status(name, namespace, Outcome.RUNNING, "Running")
    if pod.status.phase == "Failed" and job is None:
        return _status(
            name,
            namespace,
            Outcome.FAILED,
            pod.status.reason or "PodFailed",
            pod.status.message or "",
            exit_code=_last_exit_code(pods),
        )
    if pod.status.phase == "Succeeded" and job is None:
        return _status(name, namespace, Outcome.SUCCEEDED, "Completed", exit_code=0)
    return _status(
        name, namespace, Outcome.PENDING, pod.status.reason or pod.status.phase or "Pending"
    )


def _terminating(pod: Any) -> bool:
    return pod.metadata.deletion_timestamp is not None and pod.status.phase not in TERMINAL_PHASES


def _unless_still_terminating(ended: WorkloadStatus, pod: Any, now: datetime) -> WorkloadStatus:
    """Hold an ending as RUNNING while its pod is still Terminating (INV-8).

    The pod may still use the device until it is terminal; a pod Terminating
    longer than its grace period plus TERMINATING_GRACE_S sits on a node that
    cannot confirm it stopped, and is let go then (Kueue waits 60 s too).
    """
    if not _terminating(pod) or _age_s(pod.metadata.deletion_timestamp, now) > TERMINATING_GRACE_S:
        return ended
    return WorkloadStatus(
        name=ended.name,
        namespace=ended.namespace,
        outcome=Outcome.RUNNING,
        reason="Terminating",
        message=f"pod {pod.metadata.name} is stopping ({ended.outcome}: {ended.reason}); "
        "its devices stay held until it is gone",
    )


def _ended_not_by_workload(name: str, ns: str, pod: Any) -> WorkloadStatus | None:
    target = _cond(pod, "DisruptionTarget")
    if target is not None:
        outcome = Outcome.NODE_LOST if target.reason in _DISRUPTION_NODE else Outcome.PREEMPTED
        return _status(name, ns, outcome, target.reason or "DisruptionTarget", target.message or "")
    reason = pod.status.reason or ""
    if pod.status.phase == "Failed":
        if reason == "Evicted":
            return _status(name, ns, Outcome.PREEMPTED, "Evicted", pod.status.message or "")
        if reason == "NodeLost":
            return _status(name, ns, Outcome.NODE_LOST, "NodeLost", pod.status.message or "")
        if reason == "UnexpectedAdmissionError" or reason.startswith("OutOf"):
            return _status(name, ns, Outcome.DEVICE_ERROR, reason, pod.status.message or "")
    for kind, s in _statuses(pod):
        term = s.state.terminated if s.state else None
        if kind == "init" and s.name == READY_CONTAINER and term is not None:
            if term.exit_code == READY_EXIT_BUSY:
                return _status(
                    name,
                    ns,
                    Outcome.DEVICE_ERROR,
                    "DeviceBusy",
                    "the node agent did not report the devices free in time",
                    exit_code=term.exit_code,
                )
            if term.exit_code == READY_EXIT_REFUSED:
                return _status(
                    name,
                    ns,
                    Outcome.FAILED,
                    "ReadyCheckRefused",
                    "the portal refused the readiness check",
                    exit_code=term.exit_code,
                )
    return None


def _oom(name: str, ns: str, pod: Any) -> WorkloadStatus | None:
    for _, s in _statuses(pod):
        for state in (s.state, s.last_state):
            term = state.terminated if state else None
            if term is not None and term.reason == "OOMKilled":
                return _status(
                    name,
                    ns,
                    Outcome.OOM,
                    "OOMKilled",
                    f"container {s.name} ran out of memory; ask for more host memory",
                    exit_code=term.exit_code,
                )
    return None


def _waiting(name: str, ns: str, pod: Any, now: datetime, timeout_s: int) -> WorkloadStatus | None:
    age = _age_s(pod.metadata.creation_timestamp, now)
    for _, s in _statuses(pod):
        wait = s.state.waiting if s.state else None
        if wait is None or not wait.reason:
            continue
        if wait.reason == "InvalidImageName" or (wait.reason in _IMAGE_WAITING and age > timeout_s):
            return _status(
                name,
                ns,
                Outcome.IMAGE_PULL,
                wait.reason,
                f"image {s.image} could not be pulled: {wait.message or wait.reason}",
            )
        if wait.reason in _CONFIG_WAITING and age > timeout_s:
            return _status(name, ns, Outcome.FAILED, wait.reason, wait.message or "")
        if wait.reason in _IMAGE_WAITING or wait.reason in _CONFIG_WAITING:
            return _status(name, ns, Outcome.PENDING, wait.reason, wait.message or "")
    return None


def _last_exit_code(pods: Sequence[Any]) -> int | None:
    for pod in reversed(pods):
        for kind, s in reversed(_statuses(pod)):
            term = s.state.terminated if s.state else None
            if kind == "main" and term is not None:
                return int(term.exit_code)
    return None


def workload_status(
    core: Any,
    batch: Any,
    name: str,
    namespace: str,
    *,
    now: datetime | None = None,
    image_pull_timeout_s: int = 600,
) -> WorkloadStatus:
    """Read the Job and its pods now and classify them."""
    job = job_read(batch, name, namespace)
    pods = pods_for_workload(core, name, namespace)
    return classify(name, namespace, job, pods, now=now, image_pull_timeout_s=image_pull_timeout_s)


# --- Watch -------------------------------------------------------------------------


@dataclass
class _Stream:
    resource_version: str = ""
    relists: int = 0
    events: int = 0


@dataclass
class WorkloadWatcher:
    """A cache of Quartermaster's Jobs and pods in some namespaces, kept by watches.

    `relist()` lists and remembers the list's resourceVersion; `watch_once()`
    streams events from there. When the server answers `410 Gone` (the
    version was compacted away, kubernetes-client/python#728) the stream
    relists and carries on from the new version, so no event is lost for long;
    `resync_s` forces a full relist now and then anyway, to heal anything a
    watch missed. `run()` drives all of it from threads.
    """

    core: Any
    batch: Any
    namespaces: Sequence[str]
    watch_factory: Callable[[], Any] | None = None
    resync_s: float = 300.0
    timeout_s: int = 60
    clock: Callable[[], float] = time.monotonic
    jobs: dict[tuple[str, str], Any] = field(default_factory=dict)
    pods: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: final state of deleted pods that ended for a telling reason (preempted,
    #: evicted, node lost): the Job replaces such a pod, and without this the
    #: reason would leave with it. Kept `tombstone_s` seconds.
    gone: dict[tuple[str, str], tuple[float, Any]] = field(default_factory=dict)
    tombstone_s: float = 3600.0
    streams: dict[tuple[str, str], _Stream] = field(default_factory=dict)
    last_resync: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _watch(self) -> Any:
        if self.watch_factory is not None:
            return self.watch_factory()
        from kubernetes import watch

        return watch.Watch()  # type: ignore[no-untyped-call]

    def _lister(self, kind: str) -> Callable[..., Any]:
        lister: Callable[..., Any] = (
            self.batch.list_namespaced_job if kind == "jobs" else self.core.list_namespaced_pod
        )
        return lister

    def _store(self, kind: str) -> dict[tuple[str, str], Any]:
        return self.jobs if kind == "jobs" else self.pods

    def relist(self, namespace: str, kind: str) -> None:
        """Replace the cache for (namespace, kind) with a fresh list."""
        result = self._lister(kind)(namespace, label_selector=MANAGED_SELECTOR)
        store = self._store(kind)
        with self.lock:
            for key in [k for k in store if k[0] == namespace]:
                del store[key]
            for obj in result.items:
                store[(namespace, obj.metadata.name)] = obj
            stream = self.streams.setdefault((namespace, kind), _Stream())
            stream.resource_version = result.metadata.resource_version or ""
            stream.relists += 1

    def resync(self) -> None:
        horizon = self.clock() - self.tombstone_s
        with self.lock:
            for key in [k for k, (at, _) in self.gone.items() if at < horizon]:
                del self.gone[key]
        for ns in self.namespaces:
            for kind in ("jobs", "pods"):
                self.relist(ns, kind)
        self.last_resync = self.clock()

    def apply(self, namespace: str, kind: str, event: Mapping[str, Any]) -> None:
        """Apply one watch event to the cache."""
        obj = event["object"]
        etype = event["type"]
        stream = self.streams.setdefault((namespace, kind), _Stream())
        rv = getattr(obj.metadata, "resource_version", None) if hasattr(obj, "metadata") else None
        with self.lock:
            if etype in ("ADDED", "MODIFIED"):
                self._store(kind)[(namespace, obj.metadata.name)] = obj
            elif etype == "DELETED":
                self._store(kind).pop((namespace, obj.metadata.name), None)
                if kind == "pods" and (
                    _cond(obj, "DisruptionTarget") or obj.status.phase == "Failed"
                ):
                    final = obj.model_copy(deep=True)
                    # A deleted pod is gone: it no longer holds its devices.
                    if final.status.phase not in TERMINAL_PHASES:
                        final.status.phase = "Failed"
                    self.gone[(namespace, obj.metadata.name)] = (self.clock(), final)
            if rv:
                stream.resource_version = rv
            stream.events += 1

    def watch_once(self, namespace: str, kind: str) -> None:
        """Stream events until the server ends the watch; relist on 410 Gone."""
        stream = self.streams.get((namespace, kind))
        if stream is None or not stream.resource_version:
            self.relist(namespace, kind)
            stream = self.streams[(namespace, kind)]
        w = self._watch()
        try:
            for event in w.stream(
                self._lister(kind),
                namespace,
                label_selector=MANAGED_SELECTOR,
                resource_version=stream.resource_version,
                timeout_seconds=self.timeout_s,
                allow_watch_bookmarks=True,
            ):
                if event.get("type") == "BOOKMARK":
                    rv = (
                        event["object"].metadata.resource_version
                        if hasattr(event["object"], "metadata")
                        else event["raw_object"]["metadata"]["resourceVersion"]
                    )
                    stream.resource_version = rv
                    continue
                self.apply(namespace, kind, event)
        except ApiException as exc:
            if exc.status != 410:
                raise
            log.info(
                "watch %s/%s: 410 Gone at %s; relisting", namespace, kind, stream.resource_version
            )
            self.relist(namespace, kind)

    def maybe_resync(self) -> bool:
        if self.clock() - self.last_resync >= self.resync_s:
            self.resync()
            return True
        return False

    def status(
        self,
        name: str,
        namespace: str,
        *,
        now: datetime | None = None,
        image_pull_timeout_s: int = 600,
    ) -> WorkloadStatus:
        with self.lock:
            job = self.jobs.get((namespace, name))
            candidates = list(self.pods.items()) + [
                (k, p) for k, (_, p) in self.gone.items() if k not in self.pods
            ]
            pods = [
                p
                for (ns, _), p in candidates
                if ns == namespace and (p.metadata.labels or {}).get(L_INSTANCE) == name
            ]
        return classify(
            name, namespace, job, pods, now=now, image_pull_timeout_s=image_pull_timeout_s
        )

    def synced(self) -> bool:
        return all((ns, k) in self.streams for ns in self.namespaces for k in ("jobs", "pods"))

    def run(self, stop: threading.Event) -> list[threading.Thread]:
        """Start one watching thread per namespace and kind, and a resync thread."""
        self.resync()
        threads = []
        for ns in self.namespaces:
            for kind in ("jobs", "pods"):
                t = threading.Thread(
                    target=self._loop,
                    args=(ns, kind, stop),
                    daemon=True,
                    name=f"qm-watch-{ns}-{kind}",
                )
                t.start()
                threads.append(t)
        t = threading.Thread(target=self._resync_loop, args=(stop,), daemon=True, name="qm-resync")
        t.start()
        threads.append(t)
        return threads

    def _loop(self, ns: str, kind: str, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.watch_once(ns, kind)
            except Exception:  # keep watching; the resync heals the cache
                log.exception("watch %s/%s failed; retrying", ns, kind)
                stop.wait(5)

    def _resync_loop(self, stop: threading.Event) -> None:
        while not stop.wait(min(self.resync_s, 30)):
            try:
                self.maybe_resync()
            except Exception:
                log.exception("resync failed")


# --- Admission: are the devices really free? -----------------------------------------


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


#: memory a device holds with nothing running on it (driver and context reservations)
IDLE_MEMORY_MIB = 1024


def devices_free(
    report: Mapping[str, Any] | None,
    grants: Sequence[Any],
    *,
    now: datetime | None = None,
    stale_after_s: int | None = None,
    uuids: Sequence[str] = (),
    idle_memory_mib: int = IDLE_MEMORY_MIB,
) -> tuple[bool, str]:
    """Return (True, "") when the node agent's report shows the granted devices free.

    `grants` are `GrantSpec`s (device index, MIG profile and start, memory cap).
    With `uuids` (what the readiness init container saw in
    NVIDIA_VISIBLE_DEVICES) the devices are looked up by UUID, since the
    device plugin, not the packer, chose them. A device is not free when:

    1. there is no report, or it is older than `stale_after_s`;
    2. the device (or MIG instance) is missing, unhealthy, or had a critical Xid;
    3. whole GPU or MIG instance: a process holds memory on it, or more than
       `idle_memory_mib` is in use;
    4. shared slice: less free memory than the slice's cap.
    """
    if not report:
        return False, "no node agent report for this node"
    now = now or _now()
    if stale_after_s is not None:
        sent = _parse_time(report.get("sent_at"))
        if sent is None or (now - sent).total_seconds() > stale_after_s:
            return False, "the node agent report is stale"
    devices = list(report.get("devices") or ())
    if uuids:
        return _free_by_uuid(devices, grants, uuids, idle_memory_mib)
    by_index = {d.get("index"): d for d in devices}
    for g in grants:
        dev = by_index.get(g.device)
        if dev is None:
            return False, f"device {g.device} is not in the node agent report"
        ok, why = _device_ok(dev, f"device {g.device}")
        if not ok:
            return ok, why
        if getattr(g, "mig_profile", ""):
            inst = next(
                (
                    m
                    for m in dev.get("mig") or ()
                    if m.get("start") == g.mig_start and m.get("profile") == g.mig_profile
                ),
                None,
            )
            if inst is None:
                return (
                    False,
                    f"MIG {g.mig_profile} at slot {g.mig_start} does not exist on device {g.device}",
                )
            ok, why = _idle(inst, f"MIG {g.mig_profile} on device {g.device}", idle_memory_mib)
        elif getattr(g, "gpu_memory_mib", 0) and getattr(g, "milli", 1000) < 1000:
            ok, why = _room(dev, g.gpu_memory_mib, f"device {g.device}")
        else:
            ok, why = _idle(dev, f"device {g.device}", idle_memory_mib)
        if not ok:
            return ok, why
    return True, ""


def _free_by_uuid(
    devices: Sequence[Mapping[str, Any]],
    grants: Sequence[Any],
    uuids: Sequence[str],
    idle_memory_mib: int,
) -> tuple[bool, str]:
    parents = {d.get("uuid"): d for d in devices}
    migs = {m.get("uuid"): (d, m) for d in devices for m in d.get("mig") or ()}
    shared_cap = max(
        (getattr(g, "gpu_memory_mib", 0) for g in grants if getattr(g, "milli", 1000) < 1000),
        default=0,
    )
    for uuid in uuids:
        if uuid in migs:
            dev, inst = migs[uuid]
            ok, why = _device_ok(dev, f"device {dev.get('index')}")
            if ok:
                ok, why = _idle(inst, f"MIG {inst.get('profile')} ({uuid})", idle_memory_mib)
        elif uuid in parents:
            dev = parents[uuid]
            ok, why = _device_ok(dev, f"device {dev.get('index')}")
            if ok:
                ok, why = (
                    _room(dev, shared_cap, f"device {dev.get('index')}")
                    if shared_cap
                    else _idle(dev, f"device {dev.get('index')}", idle_memory_mib)
                )
        else:
            return False, f"device {uuid} is not in the node agent report"
        if not ok:
            return ok, why
    return True, ""


def _device_ok(dev: Mapping[str, Any], what: str) -> tuple[bool, str]:
    if not dev.get("healthy", False):
        return False, f"{what} is unhealthy{': ' + dev['error'] if dev.get('error') else ''}"
    critical = [x.get("xid") for x in dev.get("xids") or () if x.get("critical")]
    if critical:
        return False, f"{what} reported critical Xid {critical[-1]}"
    return True, ""


def _idle(dev: Mapping[str, Any], what: str, idle_memory_mib: int) -> tuple[bool, str]:
    procs = [
        p for p in dev.get("processes") or () if (p.get("used_memory_mib") or 0) > 0 or p.get("pid")
    ]
    if procs:
        p = procs[0]
        return (
            False,
            f"{what} is busy: pid {p.get('pid')} holds {p.get('used_memory_mib') or '?'} MiB",
        )
    used = int(dev.get("memory_used_mib") or 0)
    if used > idle_memory_mib:
        return False, f"{what} is busy: {used} MiB in use by no visible process"
    return True, ""


def _room(dev: Mapping[str, Any], need_mib: int, what: str) -> tuple[bool, str]:
    room = int(dev.get("memory_total_mib") or 0) - int(dev.get("memory_used_mib") or 0)
    if room < need_mib:
        return False, f"{what} has {room} MiB free, the slice needs {need_mib} MiB"
    return True, ""
