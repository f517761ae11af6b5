"""Launch and stop: an allowlisted `batch/v1` Job from a `LaunchSpec`, created (adopted on
`409`) and deleted with a grace period."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from portal.backends.base import (
    RENDEZVOUS_PORT,
    LaunchSpec,
    checkpoint_env,
    checkpoint_path,
    rendezvous_env,
)
from portal.k8s.names import (
    A_GRANTS,
    A_NODE,
    GPU,
    GPU_SHARED,
    HAMI_CORES,
    HAMI_MEMORY,
    L_ATTEMPT,
    L_ATTEMPT_ID,
    L_CLASS,
    L_COMPONENT,
    L_GANG,
    L_INSTANCE,
    L_MANAGED_BY,
    L_NAME,
    L_PART_OF,
    L_POOL,
    L_RANK,
    L_REQUEST,
    L_TEAM,
    LABEL_HOSTNAME,
    MAIN_CONTAINER,
    MANAGED_BY,
    MANAGED_SELECTOR,
    READY_CONTAINER,
    READY_EXIT_BUSY,
    READY_EXIT_REFUSED,
    JobConflict,
    LaunchRefused,
    label_value,
    mig_resource,
)
from portal.k8s.provisioning import consume_annotations
from portal.lib import contract
from portal.lib.readiness import attempt_token

log = logging.getLogger(__name__)


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
    url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"devices": devices})
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
    #: allowed registries, optionally with a repository prefix ("registry.example.com",
    #: "nvcr.io/nvidia/"), matched on parsed references (portal.lib.contract); empty allows any
    allowed_images: tuple[str, ...] = ()
    shm_size_mib: int = 1024
    #: resource name for time-sliced shares when the node cannot be asked
    shared_resource: str = GPU_SHARED
    #: checkpoint PVCs (docs/checkpoints.md): storage class ("" = the cluster default),
    #: size, access mode for single pods (a gang's pods on several nodes need ReadWriteMany)
    checkpoint_storage_class: str = ""
    checkpoint_size: str = "50Gi"
    checkpoint_access_mode: str = "ReadWriteOnce"
    #: where the PVC is mounted in the main container (QM_CHECKPOINT_DIR)
    checkpoint_mount_path: str = "/checkpoints"
    #: the portal's URL as pods reach it, for QM_CHECKPOINT_URL; "" = `portal_url`
    checkpoint_portal_url: str = ""


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def check_env(env: Iterable[tuple[str, str]]) -> None:
    """Refuse env names a user may not set: the submit contract again.

    `NVIDIA_*` and `CUDA_VISIBLE_DEVICES` would let a container see GPUs it did
    not request; `QUARTERMASTER_*`/`QM_*` and the rendezvous names are set by the server.
    """
    try:
        contract.check_env(env)
    except contract.ContractError as exc:
        raise LaunchRefused(exc.message) from None


def check_image(image: str, options: JobOptions) -> None:
    """The image parses as a reference and an allowlist entry admits it (the submit contract)."""
    try:
        contract.check_image(image, options.allowed_images)
    except contract.ContractError as exc:
        raise LaunchRefused(exc.message) from None


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
        return mig_resource(profiles.pop()), len(spec.grants)
    if spec.profile_kind == "shared":
        # A shared unit is an access right, not more compute: one per container.
        if len(spec.grants) != 1:
            raise LaunchRefused("a shared-GPU launch takes exactly one shared unit")
        if spec.sharing_engine == "hami":
            # HAMi's device plugin serves vGPUs as nvidia.com/gpu; the caps ride beside it
            return GPU, 1
        if GPU_SHARED in resources or (not resources and options.shared_resource == GPU_SHARED):
            return GPU_SHARED, 1
        return GPU, 1
    raise LaunchRefused(f"unknown profile kind {spec.profile_kind!r}")


#: env names the sharing engine sets and a user may not: they are the caps
_ENGINE_ENV = {
    "mps": ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    "hami": ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"),
}


def _share_percent(spec: LaunchSpec) -> int:
    """The slice's share of the GPU's compute, in percent (1-100)."""
    milli = max((g.milli for g in spec.grants), default=0)
    return min(100, max(1, milli // 10))


def _shared_cap(spec: LaunchSpec) -> int:
    return max((g.gpu_memory_mib for g in spec.grants), default=0)


def sharing_requests(spec: LaunchSpec) -> dict[str, str]:
    """Extended resources a shared slice asks for beyond its GPU unit: HAMi's caps.

    HAMi's scheduler and device plugin enforce what is requested (HAMi-core limits the
    container's allocations and kernel launches); the other engines need none.
    """
    if spec.profile_kind != "shared" or spec.sharing_engine != "hami":
        return {}
    cap = _shared_cap(spec)
    if cap <= 0:
        raise LaunchRefused("a HAMi slice needs a GPU memory cap")
    return {HAMI_MEMORY: str(cap), HAMI_CORES: str(_share_percent(spec))}


def sharing_env(spec: LaunchSpec) -> list[tuple[str, str]]:
    """Env a shared slice gets from its pool's engine.

    Time-slicing cannot enforce memory: the cap is only told (QUARTERMASTER_GPU_MEMORY_MIB).
    MPS enforces a client's pinned device memory and active-thread share from these CUDA
    variables (the device plugin's MPS daemon serves the container; device 0 is its GPU).
    """
    if spec.profile_kind != "shared":
        return []
    cap = _shared_cap(spec)
    env = [("QUARTERMASTER_GPU_MEMORY_MIB", str(cap))] if cap else []
    if spec.sharing_engine == "mps":
        if cap <= 0:
            raise LaunchRefused("an MPS slice needs a GPU memory cap")
        env += [
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={cap}M"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(_share_percent(spec))),
        ]
    return env


def job_labels(spec: LaunchSpec) -> dict[str, str]:
    gang = {L_GANG: spec.gang, L_RANK: str(spec.rank)} if spec.gang else {}
    return {
        **gang,
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
    cpu_milli: int,
    memory_mib: int,
    gpu: str,
    count: int,
    extra: Mapping[str, str] | None = None,
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
    for name, value in (extra or {}).items():
        # extended resources cannot be overcommitted: limit = request
        requests[name] = limits[name] = value
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
    garbage collection after it finishes. A serving workload, which serves
    until stopped, is a Deployment of replicas built from this pod
    (portal/k8s/serving.py).
    """
    if not _DNS_LABEL.match(spec.name):
        raise LaunchRefused(
            f"workload name {spec.name!r} is not a DNS label of at most 63 characters"
        )
    if not _DNS_LABEL.match(spec.namespace):
        raise LaunchRefused(f"namespace {spec.namespace!r} is not a DNS label")
    check_image(spec.image, options)
    if not spec.node:
        raise LaunchRefused("a launch needs the node the packer chose")
    check_env(spec.env)
    reserved = [k for k, _ in spec.env if k in _ENGINE_ENV.get(spec.sharing_engine, ())]
    if reserved and spec.profile_kind == "shared":
        raise LaunchRefused(f"{reserved[0]} is set by the pool's sharing engine")
    gpu, count = gpu_resource(spec, facts, options)
    extra = sharing_requests(spec)
    labels = job_labels(spec)
    hostname = (facts or {}).get("hostname") or spec.node

    env = [client.V1EnvVar(name=k, value=v) for k, v in spec.env]
    env += [client.V1EnvVar(name=k, value=v) for k, v in rendezvous_env(spec)]
    env += [
        client.V1EnvVar(name="QUARTERMASTER_REQUEST_ID", value=str(spec.request_id)),
        client.V1EnvVar(name="QUARTERMASTER_ATTEMPT", value=str(spec.attempt_number)),
    ]
    if spec.pods:
        raise LaunchRefused("a gang is launched one Job per pod: build each of spec.members()")
    env += [client.V1EnvVar(name=k, value=v) for k, v in sharing_env(spec)]
    if not gpu:
        # Without a GPU request the device plugin's envvar strategy would expose every GPU.
        env.append(client.V1EnvVar(name="NVIDIA_VISIBLE_DEVICES", value="void"))
    # Platform-set QM_* names, after the user's were checked (a request may not set them).
    env += [client.V1EnvVar(name=k, value=v) for k, v in _checkpoint_env(spec, options)]
    mounts = [client.V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    volumes = [
        client.V1Volume(
            name="dshm",
            empty_dir=client.V1EmptyDirVolumeSource(
                medium="Memory", size_limit=f"{options.shm_size_mib}Mi"
            ),
        )
    ]
    if spec.checkpoint_interval_s > 0:
        mounts.append(
            client.V1VolumeMount(name="checkpoints", mount_path=options.checkpoint_mount_path)
        )
        volumes.append(
            client.V1Volume(
                name="checkpoints",
                persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                    claim_name=spec.checkpoint_claim
                ),
            )
        )

    main = client.V1Container(
        name=MAIN_CONTAINER,
        image=spec.image,
        command=list(spec.command) or None,
        env=env,
        resources=_resources(spec.cpu_milli, spec.memory_mib, gpu, count, extra),
        security_context=_security_context(),
        volume_mounts=mounts,
    )
    init = _ready_container(spec, options, gpu, count, extra)
    pod_spec = client.V1PodSpec(
        containers=[main],
        init_containers=[init] if init else None,
        restart_policy="Never",
        # A gang's pods find rank 0 as <gang>-0.<gang> through the headless Service.
        hostname=spec.name if spec.gang else None,
        subdomain=spec.gang or None,
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
            ),
        ),
        tolerations=[_toleration(t) for t in spec.tolerations] or None,
        volumes=volumes,
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
                metadata=client.V1ObjectMeta(
                    labels=labels,
                    # The autoscaler reads pods: the capacity booked for them is theirs.
                    annotations={
                        **annotations,
                        **consume_annotations(spec.provisioning_request),
                    },
                ),
                spec=pod_spec,
            ),
        ),
    )


def _checkpoint_env(spec: LaunchSpec, options: JobOptions) -> tuple[tuple[str, str], ...]:
    """QM_CHECKPOINT_* for the main container; the report URL only where pods reach the portal."""
    base = (options.checkpoint_portal_url or options.portal_url).rstrip("/")
    token = ""
    if base and options.ready_token_key:
        # The attempt's own token (the readiness check's): every pod of a gang shares it.
        token = attempt_token(
            options.ready_token_key, spec.namespace, spec.gang or spec.name, spec.attempt_id
        )
    url = base + checkpoint_path(spec.attempt_id) if base else ""
    return checkpoint_env(spec, options.checkpoint_mount_path, url=url, token=token)


def checkpoint_pvc_build(spec: LaunchSpec, options: JobOptions) -> client.V1PersistentVolumeClaim:
    """The request's checkpoint volume: one per request, kept across its attempts.

    Owned by nothing (a Job's owner reference would delete it with the first
    attempt); the portal deletes it once the request has ended for good.
    """
    if not _DNS_LABEL.match(spec.namespace):
        raise LaunchRefused(f"namespace {spec.namespace!r} is not a DNS label")
    gang = len(spec.pods) > 1 or spec.world_size > 1
    mode = "ReadWriteMany" if gang else options.checkpoint_access_mode
    labels = {
        L_NAME: "quartermaster-checkpoints",
        L_INSTANCE: spec.checkpoint_claim,
        L_PART_OF: "quartermaster",
        L_MANAGED_BY: MANAGED_BY,
        L_REQUEST: str(spec.request_id),
        L_TEAM: label_value(spec.team),
    }
    return client.V1PersistentVolumeClaim(
        api_version="v1",
        kind="PersistentVolumeClaim",
        metadata=client.V1ObjectMeta(
            name=spec.checkpoint_claim, namespace=spec.namespace, labels=labels
        ),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=[mode],
            storage_class_name=options.checkpoint_storage_class or None,
            resources=client.V1VolumeResourceRequirements(
                requests={"storage": options.checkpoint_size}
            ),
        ),
    )


def pvc_create(core: Any, pvc: Any) -> Any:
    """Create the checkpoint PVC if missing; one of the same request is adopted."""
    ns, name = pvc.metadata.namespace, pvc.metadata.name
    try:
        return core.create_namespaced_persistent_volume_claim(ns, pvc)
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = core.read_namespaced_persistent_volume_claim(name, ns)
    have, want = existing.metadata.labels or {}, pvc.metadata.labels
    for key in (L_MANAGED_BY, L_REQUEST):
        if have.get(key) != want.get(key):
            raise JobConflict(
                f"PersistentVolumeClaim {ns}/{name} exists with {key}={have.get(key)!r}"
            )
    return existing


def pvc_delete(core: Any, name: str, namespace: str) -> bool:
    """Delete a checkpoint PVC; False when it was gone. A pod still using it keeps it
    until that pod is gone (the kubernetes.io/pvc-protection finalizer)."""
    try:
        core.delete_namespaced_persistent_volume_claim(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def gang_service_build(spec: LaunchSpec) -> client.V1Service:
    """The headless Service of a gang: it owns the gang's Jobs and names its pods in DNS.

    `publishNotReadyAddresses`, because rank 0 must be resolvable while the pods
    start, before any is Ready.
    """
    if not _DNS_LABEL.match(spec.name):
        raise LaunchRefused(f"gang name {spec.name!r} is not a DNS label")
    labels = {k: v for k, v in job_labels(spec).items() if k not in (L_RANK,)}
    labels[L_GANG] = spec.name
    return client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(name=spec.name, namespace=spec.namespace, labels=labels),
        spec=client.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={L_GANG: spec.name},
            ports=[
                client.V1ServicePort(
                    name="rendezvous", port=RENDEZVOUS_PORT, target_port=RENDEZVOUS_PORT
                )
            ],
        ),
    )


def gang_build(
    spec: LaunchSpec,
    options: JobOptions,
    facts_for: Callable[[str], Mapping[str, Any] | None] = lambda node: None,
) -> tuple[client.V1Service, list[client.V1Job]]:
    """A gang as Kubernetes objects: one headless Service and one Job per pod.

    Why one Job per pod rather than an Indexed Job: each pod must land on the
    node the packer chose for it, with its own devices there, and an Indexed
    Job has one pod template for every index. Every Job is built (and checked)
    before anything is created, so a refused spec creates nothing.
    """
    members = spec.members()
    jobs = [job_build(m, options, facts_for(m.node)) for m in members]
    return gang_service_build(spec), jobs


def owner_reference(owner: Any) -> client.V1OwnerReference:
    """Make `owner` (the gang's Service) own a Job: deleting the Service collects the Jobs."""
    return client.V1OwnerReference(
        api_version="v1",
        kind="Service",
        name=owner.metadata.name,
        uid=owner.metadata.uid,
        block_owner_deletion=True,
    )


def service_create(core: Any, service: Any) -> Any:
    """Create the gang's Service; an existing one of the same attempt is adopted."""
    ns, name = service.metadata.namespace, service.metadata.name
    try:
        return core.create_namespaced_service(ns, service)
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = core.read_namespaced_service(name, ns)
    have, want = existing.metadata.labels or {}, service.metadata.labels
    for key in (L_MANAGED_BY, L_REQUEST, L_ATTEMPT_ID):
        if have.get(key) != want.get(key):
            raise JobConflict(f"Service {ns}/{name} exists with {key}={have.get(key)!r}")
    return existing


def service_delete(core: Any, name: str, namespace: str) -> bool:
    try:
        core.delete_namespaced_service(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _toleration(t: tuple[str, str, str]) -> client.V1Toleration:
    key, value, effect = t
    if value:
        return client.V1Toleration(key=key, operator="Equal", value=value, effect=effect or None)
    return client.V1Toleration(key=key, operator="Exists", effect=effect or None)


def _ready_container(
    spec: LaunchSpec,
    options: JobOptions,
    gpu: str,
    count: int,
    extra: Mapping[str, str] | None = None,
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
    if spec.gang:
        # Each pod of a gang asks about its own node's devices.
        url += f"?rank={spec.rank}"
    # One token per attempt: every pod of a gang presents the attempt's.
    attempt_name = spec.gang or spec.name
    token = attempt_token(options.ready_token_key, spec.namespace, attempt_name, spec.attempt_id)
    return client.V1Container(
        name=READY_CONTAINER,
        image=options.ready_image,
        command=["python3", "-c", READY_SCRIPT],
        env=[
            client.V1EnvVar(name="QM_READY_URL", value=url),
            client.V1EnvVar(name="QM_READY_TOKEN", value=token),
            client.V1EnvVar(name="QM_READY_TIMEOUT", value=str(options.ready_timeout_s)),
        ],
        resources=_resources(50, 64, gpu, count, extra),
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


def pods_for_workload(core: Any, name: str, namespace: str, extra: str = "") -> list[Any]:
    selector = f"{L_INSTANCE}={name},{MANAGED_SELECTOR}" + (f",{extra}" if extra else "")
    return list(core.list_namespaced_pod(namespace, label_selector=selector).items)
