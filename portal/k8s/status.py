"""Status: a Job and its pods into an `Outcome`: the failure signals a pod and its Job give."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from portal.backends.base import SUSPENDED_BY_OTHERS, Outcome, WorkloadStatus
from portal.k8s.jobs import job_read, pods_for_workload
from portal.k8s.names import (
    READY_CONTAINER,
    READY_EXIT_BUSY,
    READY_EXIT_REFUSED,
    TERMINAL_PHASES,
    age_s,
    now_utc,
)

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


def condition(obj: Any, type_: str) -> Any | None:
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
       a suspended Job with no live pod -> PENDING, `SuspendedByOthers` (the portal
       never suspends its Jobs: Kueue or another controller does);
    6. a container waiting on its image (or its config) past the timeout ->
       IMAGE_PULL (FAILED for config errors); `InvalidImageName` at once;
    7. a pod stuck Terminating past its grace period -> NODE_LOST;
       a pod Terminating within it -> RUNNING (its devices are still held);
    8. a running pod -> RUNNING; anything else -> PENDING.
    """
    now = now or now_utc()
    pods = sorted(pods, key=lambda p: (p.metadata.creation_timestamp or now, p.metadata.name))
    if job is None and not pods:
        return _status(name, namespace, Outcome.MISSING, "NotFound", "the Job does not exist")
    if job is not None and condition(job, "Complete") is not None:
        return _status(name, namespace, Outcome.SUCCEEDED, "Completed", exit_code=0)
    for pod in reversed(pods):
        ended = _ended_not_by_workload(name, namespace, pod)
        if ended is not None:
            return _unless_still_terminating(ended, pod, now)
    for pod in reversed(pods):
        oom = _oom(name, namespace, pod)
        if oom is not None:
            return oom
    failed = condition(job, "Failed")
    if failed is not None:
        return _status(
            name,
            namespace,
            Outcome.FAILED,
            failed.reason or "Failed",
            failed.message or "",
            exit_code=_last_exit_code(pods),
        )
    if not [p for p in pods if p.status.phase not in TERMINAL_PHASES] and _suspended(job):
        return _status(name, namespace, Outcome.PENDING, SUSPENDED_BY_OTHERS, _suspended_by(job))
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


def _suspended(job: Any | None) -> bool:
    """The portal creates its Jobs unsuspended and never suspends one."""
    return job is not None and bool(getattr(job.spec, "suspend", False))


def _suspended_by(job: Any) -> str:
    labels = job.metadata.labels or {}
    annotations = job.metadata.annotations or {}
    kueue = any(k.startswith("kueue.x-k8s.io/") for k in (*labels, *annotations))
    cond = condition(job, "Suspended")
    who = (
        "Kueue"
        if kueue or (cond is not None and "kueue" in (cond.message or "").lower())
        else "another controller (Kueue?)"
    )
    return (
        f"the Job was suspended by {who}, not by Quartermaster: it will not start until "
        'that controller resumes it (docs/kubernetes.md, "Running beside Kueue")'
    )


def _terminating(pod: Any) -> bool:
    return pod.metadata.deletion_timestamp is not None and pod.status.phase not in TERMINAL_PHASES


def _unless_still_terminating(ended: WorkloadStatus, pod: Any, now: datetime) -> WorkloadStatus:
    """Hold an ending as RUNNING while its pod is still Terminating (INV-8).

    The pod may still use the device until it is terminal; a pod Terminating
    longer than its grace period plus TERMINATING_GRACE_S sits on a node that
    cannot confirm it stopped, and is let go then (Kueue waits 60 s too).
    """
    if not _terminating(pod) or age_s(pod.metadata.deletion_timestamp, now) > TERMINATING_GRACE_S:
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
    target = condition(pod, "DisruptionTarget")
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
    age = age_s(pod.metadata.creation_timestamp, now)
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
