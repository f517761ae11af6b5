"""Autoscaled pools on a real apiserver: the portal's Kubernetes backend, as the chart's
ServiceAccount, asks for nodes with PodTemplates and ProvisioningRequests
(`autoscaling.x-k8s.io/v1`, CRD in tests/cluster/crds) in the namespace of the team the
nodes are for (where the pods that consume them run), the apiserver enforces the
ProvisioningRequest schema, and the conditions the cluster autoscaler writes through the status
subresource are what the portal reads. The in-memory twin is tests/k8s/test_provisioning.py.

No cluster autoscaler runs here: the tests write its status as it would, and add the node it
would add (a kwok node of the pool) to show the placeholder pod fits exactly that node."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from portal.backends.kubernetes import KubernetesBackend
from portal.k8s import provisioning
from portal.models import Pool
from tests.chart.chart import NAMESPACE
from tests.cluster import nodes as gpu_nodes_mod
from tests.cluster.conftest import TEAM_NS
from tests.cluster.kube import Cluster, can_i, node_ready, wait_for
from tests.cluster.specs import launch_spec

G, V, P = provisioning.GROUP, provisioning.VERSION, provisioning.PLURAL
#: the team namespace the asks are for (the autoscaler resolves a pod's consume annotation
#: in the pod's namespace)
TEAM = TEAM_NS[0]
BURST_TAINT = {"key": "quartermaster.io/burst", "value": "true", "effect": "NoSchedule"}


def _pool() -> Pool:
    """An autoscaled pool of the simulated A100 nodes' shape (128 CPUs, 1056 GiB)."""
    return Pool(
        name="a100-burst",
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_memory_mib=81920,
        node_selector={gpu_nodes_mod.POOL: "a100-burst"},
        taints=[dict(BURST_TAINT)],
        autoscaled=True,
        min_nodes=0,
        max_nodes=4,
        node_gpus=8,
        node_cpu_milli=128000,
        node_memory_mib=1056 * 1024,
    )


def _custom(cluster: Cluster) -> client.CustomObjectsApi:
    """An administrator's client: what reads back, and what writes as the autoscaler."""
    return client.CustomObjectsApi(cluster.api())


def _get(cluster: Cluster, name: str, ns: str = TEAM) -> dict[str, Any]:
    return dict(_custom(cluster).get_namespaced_custom_object(G, V, ns, P, name))


def _condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def _set_status(cluster: Cluster, name: str, *conditions: dict[str, Any]) -> None:
    """Replace the status as the autoscaler does (UpdateStatus on the status subresource)."""
    obj = _get(cluster, name)
    obj["status"] = {"conditions": list(conditions)}
    _custom(cluster).replace_namespaced_custom_object_status(G, V, TEAM, P, name, obj)


def test_the_chart_lets_the_portal_ask_for_nodes_in_team_namespaces_only(
    qm_api: client.ApiClient,
) -> None:
    """In each team namespace (asks for the team's requests) and the release namespace (an
    ask naming no request, for min_nodes); nowhere else."""
    for ns in (*TEAM_NS, NAMESPACE):
        for verb in ("create", "get", "list", "delete"):
            assert can_i(qm_api, verb, P, ns, group=G), (verb, ns)
        for verb in ("create", "get", "delete"):
            assert can_i(qm_api, verb, "podtemplates", ns), (verb, ns)
        # the status is the autoscaler's to write
        assert not can_i(qm_api, "update", P, ns, group=G), ns
        assert not can_i(qm_api, "update", "podtemplates", ns), ns
    for ns in ("default", "kube-system"):
        assert not can_i(qm_api, "create", P, ns, group=G), ns
        assert not can_i(qm_api, "create", "podtemplates", ns), ns


def test_a_gang_asks_atomically_and_other_asks_one_node_each(
    backend: KubernetesBackend, cluster: Cluster
) -> None:
    pool = _pool()
    backend.provisioning_request_create("qm-a100-burst-gang", pool, 3, True, TEAM)
    backend.provisioning_request_create("qm-a100-burst-one", pool, 1, False, TEAM)
    backend.provisioning_request_create("qm-a100-burst-two", pool, 2, False, TEAM)
    # a redelivered task creates again: the apiserver's 409s are adopted
    backend.provisioning_request_create("qm-a100-burst-two", pool, 2, False, TEAM)

    listed = _custom(cluster).list_namespaced_custom_object(
        G, V, TEAM, P, label_selector="quartermaster.io/pool=a100-burst"
    )
    specs = {o["metadata"]["name"]: o["spec"] for o in listed["items"]}
    assert specs == {
        name: {
            "provisioningClassName": provisioning.ATOMIC,
            "podSets": [{"podTemplateRef": {"name": name}, "count": count}],
        }
        for name, count in (
            ("qm-a100-burst-gang", 3),
            ("qm-a100-burst-one", 1),
            ("qm-a100-burst-two-1", 1),
            ("qm-a100-burst-two-2", 1),
        )
    }

    # none of them in the release namespace, nor in the other team's
    for ns in (NAMESPACE, TEAM_NS[1]):
        assert not _custom(cluster).list_namespaced_custom_object(
            G, V, ns, P, label_selector="quartermaster.io/pool=a100-burst"
        )["items"], ns
    core = cluster.core()
    for name in specs:
        template = core.read_namespaced_pod_template(name, TEAM)
        assert template.metadata.labels["quartermaster.io/pool"] == "a100-burst"
        pod = template.template.spec
        assert pod.node_selector == {gpu_nodes_mod.POOL: "a100-burst"}
        assert [(t.key, t.operator, t.value, t.effect) for t in pod.tolerations] == [
            ("quartermaster.io/burst", "Equal", "true", "NoSchedule")
        ]
        [container] = pod.containers
        assert container.resources.requests == {
            "nvidia.com/gpu": "8",
            "cpu": "115200m",
            "memory": "973209Mi",
        }
        assert container.resources.limits == {"nvidia.com/gpu": "8"}


def test_the_apiserver_enforces_the_provisioning_request_schema(
    backend: KubernetesBackend, cluster: Cluster
) -> None:
    custom = _custom(cluster)
    good = provisioning.provisioning_request("qm-schema", TEAM, _pool(), 2)

    def rejected(body: dict[str, Any], *, update: bool = False) -> str:
        with pytest.raises(ApiException) as exc:
            if update:
                custom.replace_namespaced_custom_object(G, V, TEAM, P, "qm-schema", body)
            else:
                custom.create_namespaced_custom_object(G, V, TEAM, P, body)
        assert exc.value.status == 422, exc.value.body
        return str(exc.value.body)

    zero = copy.deepcopy(good)
    zero["spec"]["podSets"][0]["count"] = 0
    assert "spec.podSets[0].count" in rejected(zero)
    empty = copy.deepcopy(good)
    empty["spec"]["podSets"] = []
    assert "spec.podSets" in rejected(empty)
    too_many = copy.deepcopy(good)
    too_many["spec"]["podSets"] = [
        {"podTemplateRef": {"name": f"t{i}"}, "count": 1} for i in range(33)
    ]
    assert "spec.podSets" in rejected(too_many)
    no_class = copy.deepcopy(good)
    del no_class["spec"]["provisioningClassName"]
    assert "spec.provisioningClassName" in rejected(no_class)
    bad_ref = copy.deepcopy(good)
    bad_ref["spec"]["podSets"][0]["podTemplateRef"]["name"] = "Not_A_Name"
    assert "spec.podSets[0].podTemplateRef.name" in rejected(bad_ref)

    custom.create_namespaced_custom_object(G, V, TEAM, P, good)
    changed = _get(cluster, "qm-schema")
    changed["spec"]["provisioningClassName"] = provisioning.CHECK_CAPACITY
    assert "Value is immutable" in rejected(changed, update=True)
    grown = _get(cluster, "qm-schema")
    grown["spec"]["podSets"][0]["count"] = 3
    assert "Value is immutable" in rejected(grown, update=True)

    # A status written with the spec is dropped (status subresource) ...
    sneaky = _get(cluster, "qm-schema")
    sneaky["status"] = {"conditions": [_condition("Provisioned", "True", "Provisioned")]}
    custom.replace_namespaced_custom_object(G, V, TEAM, P, "qm-schema", sneaky)
    assert not _get(cluster, "qm-schema").get("status", {}).get("conditions")
    # ... and a condition that is not a metav1.Condition is refused on the subresource.
    with pytest.raises(ApiException) as exc:
        _set_status(cluster, "qm-schema", {"type": "Provisioned", "status": "Yes"})
    assert exc.value.status == 422
    assert "status.conditions[0].status" in str(exc.value.body)


def test_the_portal_reads_the_conditions_the_autoscaler_writes(
    backend: KubernetesBackend, cluster: Cluster
) -> None:
    pool = _pool()
    backend.provisioning_request_create("qm-cond-pair", pool, 2, False, TEAM)
    assert backend.provisioning_request_status("qm-cond-pair", pool, 2, False, TEAM) == (
        "requested",
        "",
    )
    accepted = _condition("Accepted", "True", "Accepted", "accepted by the cluster autoscaler")
    _set_status(
        cluster,
        "qm-cond-pair-1",
        accepted,
        _condition("Provisioned", "True", "Provisioned", "capacity is provisioned"),
    )
    _set_status(
        cluster,
        "qm-cond-pair-2",
        accepted,
        _condition("Provisioned", "False", "CapacityIsNotFound", "waiting for a scale-up"),
    )
    assert backend.provisioning_request_status("qm-cond-pair", pool, 2, False, TEAM) == (
        "requested",
        "",
    )
    _set_status(
        cluster,
        "qm-cond-pair-2",
        accepted,
        _condition("Provisioned", "True", "Provisioned", "capacity is provisioned"),
    )
    assert backend.provisioning_request_status("qm-cond-pair", pool, 2, False, TEAM) == (
        "provisioned",
        "2 nodes provisioned",
    )
    # read where it was made: not in the release namespace
    assert backend.provisioning_request_status("qm-cond-pair", pool, 2, False) == ("requested", "")

    backend.provisioning_request_create("qm-cond-gang", pool, 4, True, TEAM)
    _set_status(cluster, "qm-cond-gang", accepted)
    assert backend.provisioning_request_status("qm-cond-gang", pool, 4, True, TEAM) == (
        "requested",
        "",
    )
    _set_status(
        cluster,
        "qm-cond-gang",
        accepted,
        _condition("Provisioned", "False", "CapacityIsNotFound", "no capacity yet"),
        _condition("Failed", "True", "FailedToCreateNodes", "out of stock in every zone"),
    )
    assert backend.provisioning_request_status("qm-cond-gang", pool, 4, True, TEAM) == (
        "failed",
        "out of stock in every zone",
    )
    # deleted behind the portal's back: still waiting, never an error
    _custom(cluster).delete_namespaced_custom_object(G, V, TEAM, P, "qm-cond-gang")
    assert backend.provisioning_request_status("qm-cond-gang", pool, 4, True, TEAM) == (
        "requested",
        "",
    )


def test_the_placeholder_fits_the_node_the_autoscaler_adds_for_the_pool(
    backend: KubernetesBackend, cluster: Cluster
) -> None:
    """The autoscaler decides which node group to grow by simulating the PodTemplate's pod:
    here that pod stays unschedulable on the existing GPU nodes and is bound to, and runs on,
    the node of the pool that appears. An ask naming no request (a pool's min_nodes) lives
    in the release namespace."""
    pool = _pool()
    backend.provisioning_request_create("qm-fit", pool, 1, True)
    core = cluster.core()
    template = core.read_namespaced_pod_template("qm-fit", NAMESPACE).template
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="qm-fit-0", labels=template.metadata.labels),
        spec=template.spec,
    )
    pod.spec.termination_grace_period_seconds = 0
    core.create_namespaced_pod(NAMESPACE, pod)
    node = gpu_nodes_mod.a100("a100-burst-0", pool="a100-burst", taints=[dict(BURST_TAINT)])
    try:
        wait_for(
            "the placeholder unschedulable on the existing nodes",
            lambda: any(
                c.type == "PodScheduled" and c.reason == "Unschedulable"
                for c in core.read_namespaced_pod("qm-fit-0", NAMESPACE).status.conditions or ()
            ),
            60,
        )
        core.create_node(node)
        wait_for("the new node Ready", lambda: node_ready(core.read_node("a100-burst-0")), 60)
        running = wait_for(
            "the placeholder running on the new node",
            lambda: (
                (p := core.read_namespaced_pod("qm-fit-0", NAMESPACE)).status.phase == "Running"
                and p
            ),
            60,
        )
        assert running.spec.node_name == "a100-burst-0"
    finally:
        # the other cluster tests count the GPU nodes: leave none behind
        core.delete_namespaced_pod("qm-fit-0", NAMESPACE, grace_period_seconds=0)
        try:
            core.delete_node("a100-burst-0")
        except ApiException as exc:
            if exc.status != 404:
                raise
        wait_for(
            "the placeholder gone",
            lambda: (
                not any(
                    p.metadata.name == "qm-fit-0" for p in core.list_namespaced_pod(NAMESPACE).items
                )
            ),
            60,
        )


def test_an_attempt_on_the_nodes_asked_for_consumes_the_provisioning_request(
    backend: KubernetesBackend, cluster: Cluster
) -> None:
    """The Job's pod template names the ProvisioningRequest, and so does the pod the Job
    controller makes from it (admitted like any attempt): the autoscaler, which looks the
    name up in the pod's namespace, finds it there and books its capacity for the pod. An
    ordinary attempt's pod names none."""
    backend.provisioning_request_create("qm-a100-burst-two", _pool(), 2, False, TEAM)
    consuming = launch_spec(node="a100-0", provisioning_request="qm-a100-burst-two-2")
    assert consuming.namespace == TEAM
    ordinary = launch_spec(node="a100-0")
    backend.launch(consuming)
    backend.launch(ordinary)
    batch, core = cluster.batch(), cluster.core()
    job = batch.read_namespaced_job(consuming.name, consuming.namespace)
    template = job.spec.template.metadata.annotations
    assert template[provisioning.CONSUME] == "qm-a100-burst-two-2"
    assert template[provisioning.CONSUME_DEPRECATED] == "qm-a100-burst-two-2"
    assert provisioning.CONSUME not in (job.metadata.annotations or {})

    def pod(spec: Any) -> client.V1Pod | None:
        pods = core.list_namespaced_pod(
            spec.namespace, label_selector=f"app.kubernetes.io/instance={spec.name}"
        ).items
        return pods[0] if pods else None

    made = wait_for("the consuming attempt's pod", lambda: pod(consuming), 60)
    named = made.metadata.annotations[provisioning.CONSUME]
    assert named == "qm-a100-burst-two-2"
    # the autoscaler's lookup: the name in the pod's own namespace
    booked = _get(cluster, named, ns=made.metadata.namespace)
    assert booked["spec"]["podSets"] == [{"podTemplateRef": {"name": named}, "count": 1}]
    plain = wait_for("the ordinary attempt's pod", lambda: pod(ordinary), 60)
    assert not any("provisioning-request" in k for k in plain.metadata.annotations or {})
