"""The chart's opt-in for rollouts: patching Node objects (docs/lifecycle.md)."""

from __future__ import annotations

import copy

from tests.chart.chart import CASES, one, render

FULL = "qm-quartermaster"


def _node_rules(values: dict) -> list[dict]:
    return one(render(values), "ClusterRole", f"{FULL}-node-reader")["rules"]


def test_nodes_are_patched_only_when_rollouts_are_enabled() -> None:
    assert all("patch" not in r["verbs"] for r in _node_rules(CASES["everything"]))
    values = copy.deepcopy(CASES["everything"])
    values.setdefault("rbac", {})["manageNodes"] = True
    patch = [r for r in _node_rules(values) if "patch" in r["verbs"]]
    assert patch == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
        # Driver rollouts write the GPU Operator's NVIDIADriver per wave, or its ClusterPolicy.
        {
            "apiGroups": ["nvidia.com"],
            "resources": ["nvidiadrivers"],
            "verbs": ["get", "create", "patch"],
        },
        {"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"], "verbs": ["list", "patch"]},
    ]


def test_burn_ins_get_a_namespace_and_a_role_of_their_own_when_enabled() -> None:
    from tests.chart.chart import kinds

    assert not [
        r
        for r in kinds(render(CASES["everything"]), "Role")
        if "validation" in r["metadata"]["name"]
    ]
    values = copy.deepcopy(CASES["everything"])
    values["validation"] = {"enabled": True, "namespace": "qm-burn-in"}
    docs = render(values)
    [ns] = [n for n in kinds(docs, "Namespace") if n["metadata"]["name"] == "qm-burn-in"]
    labels = ns["metadata"]["labels"]
    # dcgmi diag levels 2-4 need SYS_ADMIN, beyond "baseline": enforced privileged, anything
    # beyond baseline audited and warned of.
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/audit"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "baseline"
    values["validation"]["podSecurity"] = "baseline"
    [ns] = [n for n in kinds(render(values), "Namespace") if n["metadata"]["name"] == "qm-burn-in"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    role = one(docs, "Role", f"{FULL}-validation")
    assert role["metadata"]["namespace"] == "qm-burn-in"
    assert {tuple(r["resources"]): r["verbs"] for r in role["rules"]} == {
        ("jobs",): ["create", "get", "list", "watch", "delete"],
        ("pods",): ["get", "list", "watch"],
        ("pods/log",): ["get"],
    }
    config = one(docs, "ConfigMap", f"{FULL}-config")["data"]
    assert config["VALIDATION_NAMESPACE"] == "qm-burn-in"
    # Images that ship what the burn-in runs: nccl-tests, and NVIDIA's DCGM for `dcgmi diag`.
    assert "nccl-tests" in config["VALIDATION_IMAGE"]
    assert config["VALIDATION_DCGM_IMAGE"].startswith("nvcr.io/nvidia/cloud-native/dcgm:")
    assert config["GPU_OPERATOR_DRIVER_API"] == "auto"


def test_device_plugin_rollouts_read_the_operators_pods_in_its_namespace_only() -> None:
    from tests.chart.chart import kinds

    assert not [
        r for r in kinds(render(CASES["everything"]), "Role") if "operand" in r["metadata"]["name"]
    ]
    values = copy.deepcopy(CASES["everything"])
    values.setdefault("rbac", {})["manageNodes"] = True
    values.setdefault("config", {})["gpuOperatorNamespace"] = "nvidia-gpu-operator"
    docs = render(values)
    role = one(docs, "Role", f"{FULL}-gpu-operator-operand-reader")
    assert role["metadata"]["namespace"] == "nvidia-gpu-operator"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    binding = one(docs, "RoleBinding", f"{FULL}-gpu-operator-operand-reader")
    assert binding["metadata"]["namespace"] == "nvidia-gpu-operator"
    assert binding["roleRef"]["name"] == f"{FULL}-gpu-operator-operand-reader"
    config = one(docs, "ConfigMap", f"{FULL}-config")["data"]
    assert config["GPU_OPERATOR_NAMESPACE"] == "nvidia-gpu-operator"
    default = one(render(CASES["everything"]), "ConfigMap", f"{FULL}-config")["data"]
    assert default["GPU_OPERATOR_NAMESPACE"] == "gpu-operator"
