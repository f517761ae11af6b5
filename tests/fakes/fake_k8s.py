"""An in-memory Kubernetes API for the adapter's tests.

`FakeCluster` holds Nodes, Jobs and Pods as the real client's model objects
(`kubernetes.client.V1Node`, `V1Job`, `V1Pod`) with resource versions and an
event log. `FakeCoreV1Api` / `FakeBatchV1Api` answer the handful of calls
portal/k8s/ makes, with the real signatures' argument names, and raise the
real `ApiException` (404, 409, 410, 500, 403). `FakeWatch` replays the event
log like `kubernetes.watch.Watch().stream` and answers `410 Gone` for a
compacted resource version.

Fault injection: `cluster.fail(method, status)` makes the
next call of a method raise; `create_then_fail=True` creates the object first
(a create whose answer was lost). Scripted transitions (`start_pod`,
`run_pod`, `terminate`, `wait_container`, `disrupt`, `fail_pod`,
`complete_job`, `fail_job`, `node_not_ready` …) move objects the way the
kubelet, scheduler and Job controller would.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def api_error(status: int, reason: str = "") -> ApiException:
    body = json.dumps({"kind": "Status", "code": status, "reason": reason or str(status)})
    exc = ApiException(status=status, reason=reason or str(status))
    exc.body = body
    return exc


def _match_labels(labels: dict[str, str] | None, selector: str | None) -> bool:
    labels = labels or {}
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif labels.get(term) is None:
            return False
    return True


def _pod_field(pod: client.V1Pod, key: str) -> str:
    if key == "status.phase":
        return pod.status.phase or ""
    if key == "spec.nodeName":
        return pod.spec.node_name or ""
    if key == "metadata.name":
        return pod.metadata.name
    raise ValueError(f"field selector {key} not supported by the fake")


def _match_fields(pod: client.V1Pod, selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if _pod_field(pod, k) == v:
                return False
        else:
            k, v = term.split("=", 1)
            if _pod_field(pod, k.rstrip("=")) != v:
                return False
    return True


def gpu_node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    capacity: dict[str, str] | None = None,
    taints: list[tuple[str, str, str]] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
) -> client.V1Node:
    """A Node as the API server returns it."""
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", **(allocatable or {})}
    return client.V1Node(
        api_version="v1",
        kind="Node",
        metadata=client.V1ObjectMeta(
            name=name,
            labels={
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true",
                **(labels or {}),
            },
            creation_timestamp=T0,
        ),
        spec=client.V1NodeSpec(
            unschedulable=unschedulable or None,
            taints=[client.V1Taint(key=k, value=v or None, effect=e) for k, v, e in taints or ()]
            or None,
        ),
        status=client.V1NodeStatus(
            allocatable=alloc,
            capacity={**alloc, **(capacity or {})},
            conditions=[
                client.V1NodeCondition(
                    type="Ready",
                    status="True" if ready else "Unknown",
                    reason="KubeletReady" if ready else "NodeStatusUnknown",
                )
            ],
        ),
    )


def foreign_pod(
    name: str,
    node: str,
    requests: dict[str, str],
    *,
    namespace: str = "other",
    phase: str = "Running",
) -> client.V1Pod:
    """A pod Quartermaster did not create (it holds capacity the inventory must subtract)."""
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, labels={"app": name}, creation_timestamp=T0
        ),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[
                client.V1Container(
                    name="c",
                    image="busybox",
                    resources=client.V1ResourceRequirements(requests=requests, limits=requests),
                )
            ],
        ),
        status=client.V1PodStatus(phase=phase),
    )


@dataclass
class Fault:
    status: int
    times: int = 1
    create_then_fail: bool = False


@dataclass
class FakeCluster:
    now: datetime = T0
    nodes: dict[str, client.V1Node] = field(default_factory=dict)
    jobs: dict[tuple[str, str], client.V1Job] = field(default_factory=dict)
    pods: dict[tuple[str, str], client.V1Pod] = field(default_factory=dict)
    services: dict[tuple[str, str], client.V1Service] = field(default_factory=dict)
    pvcs: dict[tuple[str, str], client.V1PersistentVolumeClaim] = field(default_factory=dict)
    #: (resource version, kind, namespace, type, object)
    events: list[tuple[int, str, str, str, Any]] = field(default_factory=list)
    #: watches from a resource version at or below this answer 410 Gone
    compacted_rv: int = 0
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    #: every API call, as (method, args)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: namespaces the service account may read pods in; None = cluster-wide
    pod_read_namespaces: set[str] | None = None
    #: what each pod's main container printed: {(namespace, pod): text}
    pod_logs: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Kubernetes Event objects (core/v1), as the list API answers them
    object_events: list[client.CoreV1Event] = field(default_factory=list)
    #: Jobs deleted with Foreground keep their pods Terminating until `finish_deletions()`
    slow_deletions: bool = False
    _rv: itertools.count = field(default_factory=lambda: itertools.count(1))
    _suffix: itertools.count = field(default_factory=lambda: itertools.count(1))
    rv: int = 0

    # -- bookkeeping ----------------------------------------------------------

    def _bump(self, obj: Any) -> int:
        self.rv = next(self._rv)
        obj.metadata.resource_version = str(self.rv)
        return self.rv

    def _emit(self, kind: str, ns: str, etype: str, obj: Any) -> None:
        rv = self._bump(obj) if etype != "DELETED" else self._bump(obj)
        self.events.append((rv, kind, ns, etype, obj.model_copy(deep=True)))

    def fail(
        self, method: str, status: int, *, times: int = 1, create_then_fail: bool = False
    ) -> None:
        self.faults.setdefault(method, []).append(Fault(status, times, create_then_fail))

    def _fault(self, method: str) -> Fault | None:
        queue = self.faults.get(method) or []
        if not queue:
            return None
        fault = queue[0]
        fault.times -= 1
        if fault.times <= 0:
            queue.pop(0)
        return fault

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def compact(self) -> None:
        """Forget every event so far: old resource versions now answer 410 Gone."""
        self.compacted_rv = self.rv

    # -- nodes ----------------------------------------------------------------

    def add_node(self, node: client.V1Node) -> None:
        self._emit("nodes", "", "ADDED", node)
        self.nodes[node.metadata.name] = node

    def delete_node(self, name: str) -> None:
        self._emit("nodes", "", "DELETED", self.nodes.pop(name))

    def node_not_ready(self, name: str) -> None:
        node = self.nodes[name]
        node.status.conditions = [
            client.V1NodeCondition(type="Ready", status="Unknown", reason="NodeStatusUnknown")
        ]
        node.spec.taints = (node.spec.taints or []) + [
            client.V1Taint(key="node.kubernetes.io/unreachable", effect="NoExecute")
        ]
        self._emit("nodes", "", "MODIFIED", node)

    def set_node_labels(self, name: str, **labels: str) -> None:
        self.nodes[name].metadata.labels.update(labels)
        self._emit("nodes", "", "MODIFIED", self.nodes[name])

    def add_pod(self, pod: client.V1Pod) -> None:
        self._emit("pods", pod.metadata.namespace, "ADDED", pod)
        self.pods[(pod.metadata.namespace, pod.metadata.name)] = pod

    def record_event(
        self, kind: str, name: str, namespace: str, reason: str, message: str, etype: str = "Normal"
    ) -> None:
        """An Event about an object, as the kubelet or the Job controller would post it."""
        self.object_events.append(
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(
                    name=f"{name}.{len(self.object_events):x}", namespace=namespace
                ),
                involved_object=client.V1ObjectReference(kind=kind, name=name, namespace=namespace),
                reason=reason,
                message=message,
                type=etype,
                last_timestamp=self.now,
            )
        )

    # -- the Job controller and kubelet, scripted --------------------------------

    def job(self, namespace: str, name: str) -> client.V1Job:
        return self.jobs[(namespace, name)]

    def pods_of(self, namespace: str, job: str) -> list[client.V1Pod]:
        return sorted(
            (
                p
                for (ns, _), p in self.pods.items()
                if ns == namespace
                and (p.metadata.labels or {}).get("batch.kubernetes.io/job-name") == job
            ),
            key=lambda p: p.metadata.creation_timestamp,
        )

    def start_pod(self, namespace: str, job: str, *, node: str | None = None) -> client.V1Pod:
        """The Job controller creates a pod and the scheduler binds it (Pending)."""
        j = self.jobs[(namespace, job)]
        template = j.spec.template.model_copy(deep=True)
        name = f"{job}-{next(self._suffix):05d}"
        terms = (
            template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        )
        hostname = terms.node_selector_terms[0].match_expressions[0].values[0]
        node_name = node or next(
            (
                n
                for n, o in self.nodes.items()
                if o.metadata.labels.get("kubernetes.io/hostname") == hostname
            ),
            hostname,
        )
        pod = client.V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels={
                    **(template.metadata.labels or {}),
                    "batch.kubernetes.io/job-name": job,
                    "job-name": job,
                },
                annotations=template.metadata.annotations,
                creation_timestamp=self.now,
                owner_references=[
                    client.V1OwnerReference(
                        api_version="batch/v1",
                        kind="Job",
                        name=job,
                        uid=j.metadata.uid,
                        controller=True,
                    )
                ],
            ),
            spec=template.spec,
            status=client.V1PodStatus(phase="Pending"),
        )
        pod.spec.node_name = node_name
        self.add_pod(pod)
        j.status.active = (j.status.active or 0) + 1
        self._emit("jobs", namespace, "MODIFIED", j)
        return pod

    def _update_pod(self, pod: client.V1Pod) -> None:
        self._emit("pods", pod.metadata.namespace, "MODIFIED", pod)

    def run_pod(self, pod: client.V1Pod) -> None:
        pod.status.phase = "Running"
        pod.status.container_statuses = [
            client.V1ContainerStatus(
                name="main",
                image=pod.spec.containers[0].image,
                image_id="",
                ready=True,
                restart_count=0,
                state=client.V1ContainerState(
                    running=client.V1ContainerStateRunning(started_at=self.now)
                ),
            )
        ]
        self._update_pod(pod)

    def wait_container(self, pod: client.V1Pod, reason: str, message: str = "") -> None:
        pod.status.container_statuses = [
            client.V1ContainerStatus(
                name="main",
                image=pod.spec.containers[0].image,
                image_id="",
                ready=False,
                restart_count=0,
                state=client.V1ContainerState(
                    waiting=client.V1ContainerStateWaiting(reason=reason, message=message)
                ),
            )
        ]
        self._update_pod(pod)

    def terminate(
        self, pod: client.V1Pod, exit_code: int, reason: str = "Error", *, container: str = "main"
    ) -> None:
        """A container ends; the pod fails (restartPolicy Never) unless it exited 0."""
        state = client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(
                exit_code=exit_code, reason=reason, finished_at=self.now
            )
        )
        status = client.V1ContainerStatus(
            name=container, image="img", image_id="", ready=False, restart_count=0, state=state
        )
        if container == "main":
            pod.status.container_statuses = [status]
        else:
            pod.status.init_container_statuses = [status]
        pod.status.phase = "Succeeded" if exit_code == 0 and container == "main" else "Failed"
        if exit_code != 0 or container == "main":
            self._update_pod(pod)

    def fail_pod(self, pod: client.V1Pod, reason: str, message: str = "") -> None:
        """The kubelet rejects or evicts the pod (phase Failed with a pod-level reason)."""
        pod.status.phase = "Failed"
        pod.status.reason = reason
        pod.status.message = message
        self._update_pod(pod)

    def disrupt(self, pod: client.V1Pod, reason: str, *, delete: bool = True) -> None:
        """Add DisruptionTarget (preemption, eviction, taint manager) and delete the pod gracefully."""
        pod.status.conditions = (pod.status.conditions or []) + [
            client.V1PodCondition(
                type="DisruptionTarget",
                status="True",
                reason=reason,
                message=f"{reason}: test",
                last_transition_time=self.now,
            )
        ]
        if delete:
            grace = pod.spec.termination_grace_period_seconds or 30
            pod.metadata.deletion_timestamp = self.now + timedelta(seconds=grace)
            pod.metadata.deletion_grace_period_seconds = grace
        self._update_pod(pod)

    def finish_pod_deletion(self, pod: client.V1Pod) -> None:
        """The kubelet confirms the pod stopped: it turns Failed and the object goes away."""
        key = (pod.metadata.namespace, pod.metadata.name)
        pod.status.phase = "Failed"
        self._update_pod(pod)
        del self.pods[key]
        self._emit("pods", key[0], "DELETED", pod)
        job = self.jobs.get(
            (key[0], (pod.metadata.labels or {}).get("batch.kubernetes.io/job-name", ""))
        )
        if job is not None:
            job.status.active = max(0, (job.status.active or 0) - 1)
            self._emit("jobs", key[0], "MODIFIED", job)

    def _job_condition(
        self, namespace: str, name: str, type_: str, reason: str, message: str = ""
    ) -> None:
        job = self.jobs[(namespace, name)]
        job.status.conditions = (job.status.conditions or []) + [
            client.V1JobCondition(
                type=type_,
                status="True",
                reason=reason,
                message=message,
                last_transition_time=self.now,
            )
        ]
        job.status.active = 0
        self._emit("jobs", namespace, "MODIFIED", job)

    def complete_job(self, namespace: str, name: str) -> None:
        for pod in self.pods_of(namespace, name):
            if pod.status.phase not in ("Succeeded", "Failed"):
                self.terminate(pod, 0, "Completed")
        self.jobs[(namespace, name)].status.succeeded = 1
        self._job_condition(namespace, name, "Complete", "Completed")

    def fail_job(self, namespace: str, name: str, reason: str, message: str = "") -> None:
        self._job_condition(namespace, name, "Failed", reason, message)

    def reconcile_job(self, namespace: str, name: str) -> str:
        """One pass of the Job controller, enough of it to check a generated Job's policy.

        Failed pods matching an `Ignore` rule (DisruptionTarget) do not count;
        a failed pod matching a `FailJob` rule fails the Job (PodFailurePolicy);
        more failures than `backoffLimit` fail it (BackoffLimitExceeded);
        otherwise a missing pod is replaced once the old one is gone
        (podReplacementPolicy Failed). Returns what it did.
        """
        job = self.jobs[(namespace, name)]
        if any(c.type in ("Complete", "Failed") for c in job.status.conditions or ()):
            return "finished"
        pods = self.pods_of(namespace, name)
        counted = 0
        for pod in pods:
            if pod.status.phase != "Failed":
                continue
            action = _policy_action(job, pod)
            if action == "FailJob":
                self.fail_job(
                    namespace,
                    name,
                    "PodFailurePolicy",
                    f"Container of pod {namespace}/{pod.metadata.name} matched a FailJob rule",
                )
                return "failed"
            if action != "Ignore":
                counted += 1
        if counted > (job.spec.backoff_limit if job.spec.backoff_limit is not None else 6):
            self.fail_job(
                namespace,
                name,
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
            return "failed"
        if any(p.status.phase in ("Pending", "Running") for p in pods):
            return "active"
        self.start_pod(namespace, name)
        return "replaced"

    def finish_deletions(self) -> None:
        for pod in [p for p in self.pods.values() if p.metadata.deletion_timestamp is not None]:
            self.finish_pod_deletion(pod)

    # -- API entry points --------------------------------------------------------

    def call(self, method: str, **kwargs: Any) -> Fault | None:
        self.calls.append((method, kwargs))
        fault = self._fault(method)
        if fault is not None and not fault.create_then_fail:
            raise api_error(fault.status)
        return fault

    def calls_of(self, method: str) -> list[dict[str, Any]]:
        return [kw for m, kw in self.calls if m == method]


def _list_meta(cluster: FakeCluster) -> client.V1ListMeta:
    return client.V1ListMeta(resource_version=str(cluster.rv))


class FakeCoreV1Api:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def list_node(self, label_selector: str | None = None, **kw: Any) -> client.V1NodeList:
        self.cluster.call("list_node", label_selector=label_selector)
        items = [
            n.model_copy(deep=True)
            for n in self.cluster.nodes.values()
            if _match_labels(n.metadata.labels, label_selector)
        ]
        return client.V1NodeList(items=items, metadata=_list_meta(self.cluster))

    def read_node(self, name: str, **kw: Any) -> client.V1Node:
        self.cluster.call("read_node", name=name)
        if name not in self.cluster.nodes:
            raise api_error(404, "NotFound")
        return self.cluster.nodes[name].model_copy(deep=True)

    def create_namespaced_service(
        self, namespace: str, body: client.V1Service, **kw: Any
    ) -> client.V1Service:
        self.cluster.call("create_namespaced_service", namespace=namespace, body=body)
        key = (namespace, body.metadata.name)
        if key in self.cluster.services:
            raise api_error(409, "AlreadyExists")
        svc = body.model_copy(deep=True)
        svc.metadata.namespace = namespace
        svc.metadata.uid = f"uid-svc-{namespace}-{body.metadata.name}"
        self.cluster.services[key] = svc
        return svc.model_copy(deep=True)

    def read_namespaced_service(self, name: str, namespace: str, **kw: Any) -> client.V1Service:
        self.cluster.call("read_namespaced_service", name=name, namespace=namespace)
        if (namespace, name) not in self.cluster.services:
            raise api_error(404, "NotFound")
        return self.cluster.services[(namespace, name)].model_copy(deep=True)

    def delete_namespaced_service(self, name: str, namespace: str, **kw: Any) -> client.V1Status:
        self.cluster.call("delete_namespaced_service", name=name, namespace=namespace)
        if self.cluster.services.pop((namespace, name), None) is None:
            raise api_error(404, "NotFound")
        return client.V1Status(status="Success")

    def create_namespaced_persistent_volume_claim(
        self, namespace: str, body: client.V1PersistentVolumeClaim, **kw: Any
    ) -> client.V1PersistentVolumeClaim:
        self.cluster.call(
            "create_namespaced_persistent_volume_claim", namespace=namespace, body=body
        )
        key = (namespace, body.metadata.name)
        if key in self.cluster.pvcs:
            raise api_error(409, "AlreadyExists")
        pvc = body.model_copy(deep=True)
        pvc.metadata.namespace = namespace
        pvc.metadata.uid = f"uid-pvc-{namespace}-{body.metadata.name}"
        self.cluster.pvcs[key] = pvc
        return pvc.model_copy(deep=True)

    def read_namespaced_persistent_volume_claim(
        self, name: str, namespace: str, **kw: Any
    ) -> client.V1PersistentVolumeClaim:
        self.cluster.call("read_namespaced_persistent_volume_claim", name=name, namespace=namespace)
        if (namespace, name) not in self.cluster.pvcs:
            raise api_error(404, "NotFound")
        return self.cluster.pvcs[(namespace, name)].model_copy(deep=True)

    def delete_namespaced_persistent_volume_claim(
        self, name: str, namespace: str, **kw: Any
    ) -> client.V1Status:
        self.cluster.call(
            "delete_namespaced_persistent_volume_claim", name=name, namespace=namespace
        )
        if self.cluster.pvcs.pop((namespace, name), None) is None:
            raise api_error(404, "NotFound")
        return client.V1Status(status="Success")

    def _pods(
        self, namespace: str | None, label_selector: str | None, field_selector: str | None
    ) -> client.V1PodList:
        items = [
            p.model_copy(deep=True)
            for (ns, _), p in sorted(self.cluster.pods.items())
            if (namespace is None or ns == namespace)
            and _match_labels(p.metadata.labels, label_selector)
            and _match_fields(p, field_selector)
        ]
        return client.V1PodList(items=items, metadata=_list_meta(self.cluster))

    def list_pod_for_all_namespaces(
        self, label_selector: str | None = None, field_selector: str | None = None, **kw: Any
    ) -> client.V1PodList:
        self.cluster.call(
            "list_pod_for_all_namespaces",
            label_selector=label_selector,
            field_selector=field_selector,
        )
        if self.cluster.pod_read_namespaces is not None:
            raise api_error(403, "Forbidden")
        return self._pods(None, label_selector, field_selector)

    def list_namespaced_pod(
        self,
        namespace: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        **kw: Any,
    ) -> client.V1PodList:
        self.cluster.call(
            "list_namespaced_pod",
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
        )
        allowed = self.cluster.pod_read_namespaces
        if allowed is not None and namespace not in allowed:
            raise api_error(403, "Forbidden")
        return self._pods(namespace, label_selector, field_selector)

    def read_namespaced_pod_log(
        self, name: str, namespace: str, tail_lines: int | None = None, **kw: Any
    ) -> str:
        self.cluster.call(
            "read_namespaced_pod_log", name=name, namespace=namespace, tail_lines=tail_lines, **kw
        )
        if (namespace, name) not in self.cluster.pods:
            raise api_error(404, "NotFound")
        pod = self.cluster.pods[(namespace, name)]
        if pod.status.phase == "Pending":
            raise api_error(400, "BadRequest")
        lines = self.cluster.pod_logs.get((namespace, name), "").splitlines(keepends=True)
        return "".join(lines[-tail_lines:] if tail_lines else lines)

    def list_namespaced_event(
        self, namespace: str, field_selector: str | None = None, **kw: Any
    ) -> client.CoreV1EventList:
        self.cluster.call(
            "list_namespaced_event", namespace=namespace, field_selector=field_selector
        )
        want = dict(p.split("=", 1) for p in (field_selector or "").split(",") if p)
        items = [
            e
            for e in self.cluster.object_events
            if e.metadata.namespace == namespace
            and all(
                getattr(e.involved_object, k.removeprefix("involvedObject.")) == v
                for k, v in want.items()
            )
        ]
        return client.CoreV1EventList(items=items, metadata=_list_meta(self.cluster))


class FakeBatchV1Api:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def create_namespaced_job(self, namespace: str, body: client.V1Job, **kw: Any) -> client.V1Job:
        fault = self.cluster.call("create_namespaced_job", namespace=namespace, body=body)
        key = (namespace, body.metadata.name)
        if body.metadata.namespace not in (None, namespace):
            raise api_error(400, "BadRequest")
        if key in self.cluster.jobs:
            raise api_error(409, "AlreadyExists")
        if body.spec.template.spec.node_name:
            raise AssertionError("generated Jobs must never set nodeName")
        job = body.model_copy(deep=True)
        job.metadata.namespace = namespace
        job.metadata.uid = f"uid-{namespace}-{body.metadata.name}"
        job.metadata.creation_timestamp = self.cluster.now
        job.status = client.V1JobStatus(active=0)
        self.cluster.jobs[key] = job
        self.cluster._emit("jobs", namespace, "ADDED", job)
        if fault is not None:  # created, but the answer was lost
            raise api_error(fault.status)
        return job.model_copy(deep=True)

    def read_namespaced_job(self, name: str, namespace: str, **kw: Any) -> client.V1Job:
        self.cluster.call("read_namespaced_job", name=name, namespace=namespace)
        if (namespace, name) not in self.cluster.jobs:
            raise api_error(404, "NotFound")
        return self.cluster.jobs[(namespace, name)].model_copy(deep=True)

    def list_namespaced_job(
        self, namespace: str, label_selector: str | None = None, **kw: Any
    ) -> client.V1JobList:
        self.cluster.call("list_namespaced_job", namespace=namespace, label_selector=label_selector)
        items = [
            j.model_copy(deep=True)
            for (ns, _), j in sorted(self.cluster.jobs.items())
            if ns == namespace and _match_labels(j.metadata.labels, label_selector)
        ]
        return client.V1JobList(items=items, metadata=_list_meta(self.cluster))

    def delete_namespaced_job(
        self,
        name: str,
        namespace: str,
        body: client.V1DeleteOptions | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        **kw: Any,
    ) -> client.V1Status:
        self.cluster.call(
            "delete_namespaced_job",
            name=name,
            namespace=namespace,
            body=body,
            grace_period_seconds=grace_period_seconds,
            propagation_policy=propagation_policy,
        )
        key = (namespace, name)
        if key not in self.cluster.jobs:
            raise api_error(404, "NotFound")
        propagation = (
            propagation_policy or (body.propagation_policy if body else None) or "Background"
        )
        pods = self.cluster.pods_of(namespace, name)
        if self.cluster.slow_deletions and propagation == "Foreground" and pods:
            for pod in pods:
                grace = pod.spec.termination_grace_period_seconds or 30
                pod.metadata.deletion_timestamp = self.cluster.now + timedelta(seconds=grace)
                pod.metadata.deletion_grace_period_seconds = grace
                self.cluster._update_pod(pod)
            job = self.cluster.jobs[key]
            job.metadata.deletion_timestamp = self.cluster.now
            self.cluster._emit("jobs", namespace, "MODIFIED", job)
            return client.V1Status(status="Success")
        for pod in pods:
            self.cluster.finish_pod_deletion(pod)
        job = self.cluster.jobs.pop(key)
        self.cluster._emit("jobs", namespace, "DELETED", job)
        return client.V1Status(status="Success")


class FakeWatch:
    """`kubernetes.watch.Watch` over the fake's event log.

    Streams the events after `resource_version` for the namespace (none: every
    namespace, and Nodes) and selectors, then ends (as a server-side timeout
    would). An object that no longer matches the field selector arrives as
    DELETED, as the apiserver sends it. A version at or
    below the cluster's compaction point raises `ApiException(410)`, as the
    real Watch does once its own retry fails. `gone_after` injects a 410 after
    that many events of this stream.
    """

    def __init__(self, cluster: FakeCluster, gone_after: int | None = None) -> None:
        self.cluster = cluster
        self.gone_after = gone_after
        self.streams: list[dict[str, Any]] = []

    def stream(
        self,
        func: Any,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        **kw: Any,
    ) -> Iterator[dict[str, Any]]:
        name = func.__name__
        kind = "jobs" if "job" in name else "nodes" if name == "list_node" else "pods"
        since = int(resource_version or 0)
        self.streams.append({"kind": kind, "namespace": namespace, "resource_version": since})
        if since and since <= self.cluster.compacted_rv:
            raise api_error(410, "Gone")
        sent = 0
        for rv, k, ns, etype, obj in list(self.cluster.events):
            if rv <= since or k != kind or (namespace is not None and ns != namespace):
                continue
            if not _match_labels(obj.metadata.labels, label_selector):
                continue
            if field_selector and not _match_fields(obj, field_selector):
                etype = "DELETED"
            if self.gone_after is not None and sent >= self.gone_after:
                raise api_error(410, "Gone")
            sent += 1
            yield {"type": etype, "object": obj.model_copy(deep=True), "raw_object": {}}

    def stop(self) -> None:
        pass


def apis(cluster: FakeCluster) -> tuple[FakeCoreV1Api, FakeBatchV1Api]:
    return FakeCoreV1Api(cluster), FakeBatchV1Api(cluster)


def _policy_action(job: client.V1Job, pod: client.V1Pod) -> str:
    """The first podFailurePolicy rule a failed pod matches ("" for none)."""
    policy = job.spec.pod_failure_policy
    for rule in policy.rules if policy else ():
        for pattern in rule.on_pod_conditions or ():
            if any(
                c.type == pattern.type and c.status == (pattern.status or "True")
                for c in pod.status.conditions or ()
            ):
                return rule.action
        req = rule.on_exit_codes
        if req is None:
            continue
        statuses = (pod.status.init_container_statuses or []) + (
            pod.status.container_statuses or []
        )
        for s in statuses:
            term = s.state.terminated if s.state else None
            if term is None or term.exit_code == 0:
                continue
            if req.container_name and s.name != req.container_name:
                continue
            hit = term.exit_code in req.values
            if hit == (req.operator == "In"):
                return rule.action
    return ""
