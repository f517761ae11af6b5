"""Nodes for autoscaled pools through the cluster autoscaler's ProvisioningRequest API.

One `NodeProvision` (portal/services/autoscale.py) becomes PodTemplates and ProvisioningRequests
(`autoscaling.x-k8s.io/v1`) in the namespace of the team whose requests it names (the
autoscaler resolves a pod's consume annotation in the pod's own namespace; an ask that
names no request, for a pool's `min_nodes`, goes to the portal's namespace):

- a gang asks atomically: one ProvisioningRequest of class
  `best-effort-atomic-scale-up.autoscaling.x-k8s.io` for all its nodes (all or none);
- other asks want each node on its own: one such request of one node per node, so
  that a partial scale-up still starts what it can;
- `check-capacity.autoscaling.x-k8s.io` (`CHECK_CAPACITY`) only books nodes that
  already exist, without a scale-up: the portal's inventory already knows those, so it
  is accepted by `provisioning_request` but asks never use it.

Each placeholder pod asks for a whole node of the pool: all its GPUs, its CPU and memory
(less a little for the node's own pods), selected and tolerated as the pool's workloads
are, so the autoscaler picks the node group that serves the pool. The requests are
named after the NodeProvision (deterministic: a retried create is a harmless 409).
The attempts the nodes were asked for name their request in their pods' `CONSUME`
annotation (`consume_annotations`, portal/services/provisioning.py).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

GROUP = "autoscaling.x-k8s.io"
VERSION = "v1"
PLURAL = "provisioningrequests"
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
#: the share of a node's CPU and memory a placeholder asks for: the rest is for daemons
NODE_SHARE = 0.9
PROVISIONED = "provisioned"
FAILED = "failed"
REQUESTED = "requested"
#: the pod annotation naming the ProvisioningRequest (in the pod's own namespace) whose
#: booked capacity the pod consumes, as the v1 API defines it; the autoscaler does not
#: scale up for such a pod
CONSUME = f"{GROUP}/consume-provisioning-request"
#: the key autoscaler releases before the v1 one read (newer ones still read it)
CONSUME_DEPRECATED = "cluster-autoscaler.kubernetes.io/consume-provisioning-request"


def part_names(name: str, nodes: int, atomic: bool) -> list[tuple[str, int]]:
    """The ProvisioningRequests of one ask: (name, nodes) each."""
    if atomic or nodes == 1:
        return [(name, nodes)]
    return [(f"{name}-{i + 1}", 1) for i in range(nodes)]


def consume_annotations(name: str) -> dict[str, str]:
    """What a workload pod carries to consume ProvisioningRequest `name` (none: nothing)."""
    return {CONSUME: name, CONSUME_DEPRECATED: name} if name else {}


def pod_template(name: str, namespace: str, pool: Any) -> dict[str, Any]:
    """A PodTemplate whose pod needs one whole node of `pool`."""
    resources = {
        "nvidia.com/gpu": str(pool.node_gpus),
        "cpu": f"{int(pool.node_cpu_milli * NODE_SHARE)}m",
        "memory": f"{int(pool.node_memory_mib * NODE_SHARE)}Mi",
    }
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(pool)},
        "template": {
            "metadata": {"labels": _labels(pool)},
            "spec": {
                "nodeSelector": dict(pool.node_selector)
                or {"nvidia.com/gpu.product": pool.gpu_model},
                "tolerations": [
                    {
                        "key": t["key"],
                        "operator": "Equal",
                        "value": t.get("value", ""),
                        "effect": t.get("effect", "NoSchedule"),
                    }
                    for t in pool.taints
                ],
                "containers": [
                    {
                        "name": "placeholder",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {
                            "requests": resources,
                            "limits": {"nvidia.com/gpu": resources["nvidia.com/gpu"]},
                        },
                    }
                ],
            },
        },
    }


def provisioning_request(
    name: str, namespace: str, pool: Any, nodes: int, cls: str = ATOMIC
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(pool)},
        "spec": {
            "provisioningClassName": cls,
            "podSets": [{"podTemplateRef": {"name": name}, "count": nodes}],
        },
    }


def _labels(pool: Any) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "quartermaster",
        "quartermaster.io/pool": pool.name,
    }


def state_of(obj: dict[str, Any] | None) -> tuple[str, str]:
    """What a ProvisioningRequest's conditions say: provisioned, failed or requested."""
    conditions = {
        c.get("type"): c for c in ((obj or {}).get("status") or {}).get("conditions") or []
    }
    failed = conditions.get("Failed")
    if failed and failed.get("status") == "True":
        return FAILED, str(failed.get("message") or failed.get("reason") or "failed")
    done = conditions.get("Provisioned")
    if done and done.get("status") == "True":
        return PROVISIONED, str(done.get("message") or "provisioned")
    return REQUESTED, ""


def create(
    core: Any, custom: Any, namespace: str, name: str, pool: Any, nodes: int, atomic: bool
) -> list[str]:
    """Create the PodTemplates and ProvisioningRequests of one ask; returns their names."""
    made = []
    for part, count in part_names(name, nodes, atomic):
        for call, args in (
            (core.create_namespaced_pod_template, (namespace, pod_template(part, namespace, pool))),
            (
                custom.create_namespaced_custom_object,
                (
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    provisioning_request(part, namespace, pool, count),
                ),
            ),
        ):
            try:
                call(*args)
            except ApiException as exc:
                # Created by an earlier try of the same ask: names are deterministic.
                if exc.status != 409:
                    raise
        made.append(part)
    return made


def status(custom: Any, namespace: str, name: str, nodes: int, atomic: bool) -> tuple[str, str]:
    """One ask's state: failed if any part failed, provisioned once all are."""
    states = []
    for part, _ in part_names(name, nodes, atomic):
        try:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, part)
        except ApiException as exc:
            if exc.status != 404:
                raise
            obj = None
        states.append(state_of(obj))
    for state, message in states:
        if state == FAILED:
            return FAILED, message
    if all(state == PROVISIONED for state, _ in states):
        return PROVISIONED, f"{nodes} node{'' if nodes == 1 else 's'} provisioned"
    return REQUESTED, ""
