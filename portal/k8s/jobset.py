"""Gangs as one JobSet (`jobset.x-k8s.io/v1alpha2`) where its CRD is installed: detection,
the manifest, create/adopt, delete, and the gang's status from the JobSet, its Jobs and pods.

Why a JobSet where it exists: one object per gang (one replicated Job of `pods` Jobs and
the headless Service the JobSet controller makes), which cluster tooling (Kueue, the
JobSet controller's restarts and success policy) understands as one workload. Without
the CRD a gang is N Jobs owned by a headless Service (portal/k8s/jobs.py `gang_build`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from portal.backends.base import GANG_ENDINGS, LaunchSpec, Outcome, WorkloadStatus, gang_status
from portal.k8s.jobs import (
    JobOptions,
    gpu_resource,
    job_build,
    job_read,
    job_to_dict,
    pods_for_workload,
)
from portal.k8s.names import (
    A_GRANTS,
    A_NODE,
    L_ATTEMPT_ID,
    L_GANG,
    L_INSTANCE,
    L_MANAGED_BY,
    L_RANK,
    L_REQUEST,
    LABEL_HOSTNAME,
    READY_CONTAINER,
    JobConflict,
)
from portal.k8s.status import classify

log = logging.getLogger(__name__)

GROUP = "jobset.x-k8s.io"
VERSION = "v1alpha2"
PLURAL = "jobsets"
#: the one replicated Job of a gang's JobSet: its Jobs are `<jobset>-pod-<rank>`
REPLICATED_JOB = "pod"
#: what the JobSet controller puts on each child Job and its pods: the Job's index (the rank)
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"

#: K8S_GANG_API values
GANG_APIS = ("auto", "jobs", "jobset")


def jobset_installed(custom: Any) -> bool:
    """Whether the API server serves `jobsets` in jobset.x-k8s.io/v1alpha2 (discovery, through
    the CustomObjectsApi's `get_api_resources`).

    Discovery needs no RBAC beyond being signed in (system:discovery), unlike reading
    the CustomResourceDefinition; 404 is "not installed", anything else raises.
    """
    try:
        found = custom.get_api_resources(GROUP, VERSION)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == PLURAL for r in (found.resources if found is not None else None) or ())


def job_name(jobset: str, rank: int) -> str:
    """The child Job the JobSet controller makes for `rank`: <jobset>-<replicatedJob>-<index>."""
    return f"{jobset}-{REPLICATED_JOB}-{rank}"


def master_addr(spec: LaunchSpec) -> str:
    """Rank 0's DNS name under the JobSet's headless Service (named after the JobSet)."""
    return f"{job_name(spec.name, 0)}-0.{spec.name}.{spec.namespace}.svc"


def jobset_fits(
    spec: LaunchSpec,
    options: JobOptions,
    facts_for: Callable[[str], Mapping[str, Any] | None] = lambda node: None,
) -> bool:
    """Whether one pod template serves every pod of the gang.

    A JobSet's replicated Job has one pod template, so it cannot pin rank N to the
    packer's node N. It pins the gang to the packer's nodes instead, one pod per
    node (required anti-affinity), which books the same devices when every pod asks
    for the same resources on a different node. A gang that is not like that (two
    pods on one node, or pods of different sizes) stays N Jobs.
    """
    if len(spec.pods) <= 1:
        return False
    nodes = [p.node for p in spec.pods]
    if len(set(nodes)) != len(nodes):
        return False
    members = spec.members()
    shapes = {
        (
            gpu_resource(m, facts_for(m.node), options),
            tuple(sorted((g.milli, g.gpu_memory_mib, g.mig_profile) for g in m.grants)),
        )
        for m in members
    }
    return len(shapes) == 1


def jobset_build(
    spec: LaunchSpec,
    options: JobOptions,
    facts_for: Callable[[str], Mapping[str, Any] | None] = lambda node: None,
) -> dict[str, Any]:
    """The gang's JobSet: one replicated Job of `len(spec.pods)` Jobs of one pod each.

    The pod template is rank 0's Job template (portal/k8s/jobs.py, so every check and
    the restricted pod security apply), changed where a JobSet differs:

    - RANK and PET_NODE_RANK come from the pod's job-index annotation (downward API);
      MASTER_ADDR is rank 0's name under the JobSet's headless Service;
    - no hostname/subdomain: the JobSet controller sets them (`enableDNSHostnames`);
    - the node affinity admits the packer's nodes, and a required anti-affinity keeps
      one pod of the gang per node (see `jobset_fits`);
    - the readiness check asks about the node the pod landed on (`?node=`).
    """
    if not jobset_fits(spec, options, facts_for):
        raise ValueError("this gang does not fit one pod template: launch it as Jobs")
    members = spec.members()
    job = job_to_dict(job_build(members[0], options, facts_for(members[0].node)))
    template = job["spec"]["template"]
    pod = template["spec"]
    pod.pop("hostname", None)
    pod.pop("subdomain", None)
    hostnames = [(facts_for(m.node) or {}).get("hostname") or m.node for m in members]
    pod["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": LABEL_HOSTNAME, "operator": "In", "values": hostnames}
                        ]
                    }
                ]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {L_GANG: spec.name}},
                    "topologyKey": LABEL_HOSTNAME,
                }
            ]
        },
    }
    index = {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX}']"}}
    master = master_addr(spec)
    for c in pod["containers"]:
        for e in c.get("env") or ():
            if e["name"] in ("RANK", "PET_NODE_RANK"):
                e.pop("value", None)
                e["valueFrom"] = index
            elif e["name"] in ("MASTER_ADDR", "PET_MASTER_ADDR"):
                e["value"] = master
    for c in pod.get("initContainers") or ():
        if c["name"] != READY_CONTAINER:
            continue
        env = c["env"]
        for e in env:
            if e["name"] == "QM_READY_URL":
                # $(QM_NODE_NAME) is expanded by the kubelet from the variable before it.
                e["value"] = e["value"].split("?", 1)[0] + "?node=$(QM_NODE_NAME)"
        env.insert(
            0, {"name": "QM_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        )

    labels = {k: v for k, v in job["metadata"]["labels"].items() if k != L_RANK}
    labels[L_GANG] = labels[L_INSTANCE] = spec.name
    template["metadata"]["labels"] = dict(labels)
    annotations = {
        A_NODE: ",".join(m.node for m in members),
        A_GRANTS: json.dumps(
            [
                [
                    {
                        "device": g.device,
                        "milli": g.milli,
                        "gpu_memory_mib": g.gpu_memory_mib,
                        "mig_profile": g.mig_profile,
                        "mig_start": g.mig_start,
                    }
                    for g in m.grants
                ]
                for m in members
            ],
            separators=(",", ":"),
        ),
    }
    template["metadata"]["annotations"].update(annotations)
    job_spec = job["spec"]
    # The JobSet's TTL collects it and its Jobs together; a Job collected on its own
    # would leave the JobSet to count it missing.
    job_spec.pop("ttlSecondsAfterFinished", None)
    job_spec["completions"] = job_spec["parallelism"] = 1
    # Indexed: the Job controller names the pod <job>-<index> (here <job>-0), under the
    # subdomain the JobSet controller sets: rank 0's MASTER_ADDR.
    job_spec["completionMode"] = "Indexed"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            # The portal decides about another attempt: a failed Job fails the JobSet.
            "failurePolicy": {"maxRestarts": 0},
            "successPolicy": {"operator": "All"},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": len(members),
                    "template": {"metadata": {"labels": labels}, "spec": job_spec},
                }
            ],
        },
    }


def jobset_create(custom: Any, jobset: dict[str, Any]) -> Any:
    """Create the JobSet; an existing one of the same attempt is adopted (a `409`)."""
    meta = jobset["metadata"]
    ns, name = meta["namespace"], meta["name"]
    try:
        return custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, jobset)
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    have = (existing.get("metadata") or {}).get("labels") or {}
    for key in (L_MANAGED_BY, L_REQUEST, L_ATTEMPT_ID):
        if have.get(key) != meta["labels"].get(key):
            raise JobConflict(f"JobSet {ns}/{name} exists with {key}={have.get(key)!r}")
    log.info("JobSet %s/%s exists already; adopted", ns, name)
    return existing


def jobset_read(custom: Any, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def jobset_delete(custom: Any, name: str, namespace: str, *, grace_seconds: int = 30) -> bool:
    """Delete the JobSet, its Jobs and pods; False when it was gone. Foreground: the JobSet
    stays until its pods are gone, so the portal holds the devices until then (INV-8)."""
    try:
        custom.delete_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            grace_period_seconds=grace_seconds,
            propagation_policy="Foreground",
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def rank_selector(rank: int) -> str:
    """The label selector of one rank's pods within a JobSet's (the controller's label)."""
    return f"{JOB_INDEX}={rank}"


def rank_pods(core: Any, name: str, namespace: str, rank: int) -> list[Any]:
    return pods_for_workload(core, name, namespace, rank_selector(rank))


def _condition(jobset: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (jobset.get("status") or {}).get("conditions") or ():
        if c.get("type") == type_ and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def rank_status_read(
    core: Any,
    batch: Any,
    name: str,
    namespace: str,
    rank: int,
    *,
    now: datetime | None = None,
    image_pull_timeout_s: int = 600,
) -> WorkloadStatus:
    """One rank of a JobSet as a Job of its own is classified, read now (GETs)."""
    return classify(
        job_name(name, rank),
        namespace,
        job_read(batch, job_name(name, rank), namespace),
        rank_pods(core, name, namespace, rank),
        now=now,
        image_pull_timeout_s=image_pull_timeout_s,
    )


def jobset_status(
    jobset: Mapping[str, Any], pods: int, rank_status: Callable[[int], WorkloadStatus]
) -> WorkloadStatus:
    """The gang's outcome from its JobSet and each rank's (`rank_status`: its Job and pods,
    from the watch's cache or read now).

    Each rank is classified as a Job of its own is (portal/k8s/status.py), so a pod
    preempted, OOM-killed or stuck pulling its image ends the gang as it does on the
    Jobs path (`gang_status`). The JobSet's own conditions decide where the ranks do
    not: `Completed` is success, `Failed` a failure with its message. A rank whose Job
    the controller has not made yet is pending, not missing: the JobSet exists (unless it
    is being deleted: then the rank is gone, and counts no active pod).
    """
    meta = jobset.get("metadata") or {}
    name, ns = meta["name"], meta["namespace"]
    members: list[WorkloadStatus] = []
    # Being deleted (foreground): a rank whose Job is gone has ended, not yet to start.
    deleting = bool(meta.get("deletionTimestamp"))
    for rank in range(pods):
        st = rank_status(rank)
        if st.outcome is Outcome.MISSING and not deleting:
            st = WorkloadStatus(st.name, ns, Outcome.PENDING, "JobSetStarting")
        members.append(st)
    gang = gang_status(name, ns, members)
    if (
        _condition(jobset, "Completed")
        or (jobset.get("status") or {}).get("terminalState") == "Completed"
    ):
        return WorkloadStatus(name, ns, Outcome.SUCCEEDED, "Completed", exit_code=0)
    failed = _condition(jobset, "Failed")
    if failed and gang.outcome not in GANG_ENDINGS:
        return WorkloadStatus(
            name,
            ns,
            Outcome.FAILED,
            str(failed.get("reason") or "JobSetFailed"),
            str(failed.get("message") or ""),
            active_pods=gang.active_pods,
        )
    return gang
