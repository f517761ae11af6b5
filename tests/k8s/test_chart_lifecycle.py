"""The chart's opt-in for rollouts: patching Node objects (docs/lifecycle.md)."""

from __future__ import annotations

import copy

from tests.k8s.chart import CASES, one, render

FULL = "qm-quartermaster"


def _node_rules(values: dict) -> list[dict]:
    return one(render(values), "ClusterRole", f"{FULL}-node-reader")["rules"]


def test_nodes_are_patched_only_when_rollouts_are_enabled() -> None:
    assert all("patch" not in r["verbs"] for r in _node_rules(CASES["everything"]))
    values = copy.deepcopy(CASES["everything"])
    values.setdefault("rbac", {})["manageNodes"] = True
    patch = [r for r in _node_rules(values) if "patch" in r["verbs"]]
    assert patch == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
