"""Autoscaled pools on Kubernetes: ProvisioningRequests built, created and read back."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from portal.backends.kubernetes import KubernetesBackend
from portal.k8s import provisioning
from portal.models import Pool


class Recorder:
    """The two API groups a provisioning ask writes, in memory (names unique, 409 twice)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    def _put(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        key = (kind, namespace, body["metadata"]["name"])
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[key] = body
        return body

    def create_namespaced_pod_template(self, namespace: str, body: dict[str, Any]) -> Any:
        return self._put("PodTemplate", namespace, body)

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> Any:
        assert (group, version, plural) == ("autoscaling.x-k8s.io", "v1", "provisioningrequests")
        return self._put("ProvisioningRequest", namespace, body)

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any:
        try:
            return self.objects[("ProvisioningRequest", namespace, name)]
        except KeyError:
            raise ApiException(status=404, reason="NotFound") from None

    def condition(self, name: str, kind: str, message: str = "", namespace: str = "qm") -> None:
        obj = self.objects[("ProvisioningRequest", namespace, name)]
        obj["status"] = {"conditions": [{"type": kind, "status": "True", "message": message}]}


def _pool() -> Pool:
    return Pool(
        name="a100-train",
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_memory_mib=81920,
        node_selector={"quartermaster.io/pool": "a100-train"},
        taints=[{"key": "quartermaster.io/gpu", "value": "true", "effect": "NoSchedule"}],
        autoscaled=True,
        max_nodes=8,
        node_gpus=8,
        node_cpu_milli=100000,
        node_memory_mib=1000000,
    )


@pytest.fixture
def api() -> tuple[Recorder, KubernetesBackend]:
    rec = Recorder()
    return rec, KubernetesBackend(core=rec, batch=object(), custom=rec, provisioning_namespace="qm")


def test_a_gang_asks_for_all_its_nodes_in_one_atomic_provisioning_request(
    api: tuple[Recorder, KubernetesBackend],
) -> None:
    rec, backend = api
    backend.provisioning_request_create("qm-a100-train-1", _pool(), 3, True)
    pr = rec.objects[("ProvisioningRequest", "qm", "qm-a100-train-1")]
    assert pr["apiVersion"] == "autoscaling.x-k8s.io/v1"
    assert pr["spec"] == {
        "provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "podSets": [{"podTemplateRef": {"name": "qm-a100-train-1"}, "count": 3}],
    }
    template = rec.objects[("PodTemplate", "qm", "qm-a100-train-1")]["template"]["spec"]
    assert template["nodeSelector"] == {"quartermaster.io/pool": "a100-train"}
    assert template["tolerations"][0]["key"] == "quartermaster.io/gpu"
    requests = template["containers"][0]["resources"]["requests"]
    assert requests == {"nvidia.com/gpu": "8", "cpu": "90000m", "memory": "900000Mi"}


def test_other_asks_want_each_node_on_its_own_and_a_retry_is_harmless(
    api: tuple[Recorder, KubernetesBackend],
) -> None:
    rec, backend = api
    backend.provisioning_request_create("qm-x", _pool(), 2, False)
    backend.provisioning_request_create("qm-x", _pool(), 2, False)  # redelivered: 409s adopted
    names = sorted(n for kind, _, n in rec.objects if kind == "ProvisioningRequest")
    assert names == ["qm-x-1", "qm-x-2"]
    assert all(
        o["spec"]["podSets"][0]["count"] == 1
        for (kind, _, _), o in rec.objects.items()
        if kind == "ProvisioningRequest"
    )


def test_the_status_is_provisioned_once_every_part_is_and_failed_if_one_fails(
    api: tuple[Recorder, KubernetesBackend],
) -> None:
    rec, backend = api
    pool = _pool()
    backend.provisioning_request_create("qm-x", pool, 2, False)
    assert backend.provisioning_request_status("qm-x", pool, 2, False)[0] == "requested"
    rec.condition("qm-x-1", "Provisioned")
    assert backend.provisioning_request_status("qm-x", pool, 2, False)[0] == "requested"
    rec.condition("qm-x-2", "Provisioned")
    assert backend.provisioning_request_status("qm-x", pool, 2, False)[0] == "provisioned"
    backend.provisioning_request_create("qm-y", pool, 2, True)
    rec.condition("qm-y", "Failed", "out of stock in every zone")
    assert backend.provisioning_request_status("qm-y", pool, 2, True) == (
        "failed",
        "out of stock in every zone",
    )
    # Deleted behind the portal's back: still waiting, never an error.
    assert backend.provisioning_request_status("qm-gone", pool, 1, True)[0] == "requested"


def test_the_check_capacity_class_can_be_named() -> None:
    pr = provisioning.provisioning_request("n", "qm", _pool(), 1, provisioning.CHECK_CAPACITY)
    assert pr["spec"]["provisioningClassName"] == "check-capacity.autoscaling.x-k8s.io"


def test_an_ask_for_a_teams_requests_lives_in_the_teams_namespace(
    api: tuple[Recorder, KubernetesBackend],
) -> None:
    """The autoscaler resolves a pod's consume annotation in the pod's namespace: the
    ProvisioningRequests and their PodTemplates are made, and read, where the team's pods
    run; an ask naming no request (a pool's `min_nodes`) stays in the portal's."""
    rec, backend = api
    pool = _pool()
    backend.provisioning_request_create("qm-v", pool, 2, False, "vision")
    backend.provisioning_request_create("qm-g", pool, 2, True, "nlp")
    backend.provisioning_request_create("qm-floor", pool, 1, False)
    assert sorted((kind, ns, n) for kind, ns, n in rec.objects) == [
        ("PodTemplate", "nlp", "qm-g"),
        ("PodTemplate", "qm", "qm-floor"),
        ("PodTemplate", "vision", "qm-v-1"),
        ("PodTemplate", "vision", "qm-v-2"),
        ("ProvisioningRequest", "nlp", "qm-g"),
        ("ProvisioningRequest", "qm", "qm-floor"),
        ("ProvisioningRequest", "vision", "qm-v-1"),
        ("ProvisioningRequest", "vision", "qm-v-2"),
    ]
    for (_, ns, _), obj in rec.objects.items():
        assert obj["metadata"]["namespace"] == ns
    rec.condition("qm-g", "Provisioned", namespace="nlp")
    assert backend.provisioning_request_status("qm-g", pool, 2, True, "nlp")[0] == "provisioned"
    # Read where it lives: the same name elsewhere is not it.
    assert backend.provisioning_request_status("qm-g", pool, 2, True, "vision")[0] == "requested"
    assert backend.provisioning_request_status("qm-g", pool, 2, True)[0] == "requested"
    rec.condition("qm-floor", "Failed", "no quota")
    assert backend.provisioning_request_status("qm-floor", pool, 1, False) == ("failed", "no quota")
