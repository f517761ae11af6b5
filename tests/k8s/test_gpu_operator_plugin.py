"""The device plugin's version on a node, read from the GPU Operator's DaemonSet pods."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from portal.k8s.gpu_operator import PLUGIN_APP, device_plugin_version


def _pod(image: str, ready: bool = True, deleting: bool = False) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(deletion_timestamp="now" if deleting else None),
        status=SimpleNamespace(
            conditions=[SimpleNamespace(type="Ready", status="True" if ready else "False")]
        ),
        spec=SimpleNamespace(containers=[SimpleNamespace(image=image)]),
    )


class _Core:
    def __init__(self, *pods: Any) -> None:
        self.pods = list(pods)
        self.asked: list[tuple[str, str, str]] = []

    def list_namespaced_pod(self, ns: str, label_selector: str, field_selector: str) -> Any:
        self.asked.append((ns, label_selector, field_selector))
        return SimpleNamespace(items=self.pods)


def test_the_plugin_version_is_the_ready_pods_image_tag_on_that_node() -> None:
    core = _Core(_pod("nvcr.io/nvidia/k8s-device-plugin:v0.17.1"))
    assert device_plugin_version(core, "gpu-operator", "a100-01") == "v0.17.1"
    assert core.asked == [("gpu-operator", f"app={PLUGIN_APP}", "spec.nodeName=a100-01")]
    digest = "registry:5000/k8s-device-plugin:v0.17.1-ubi9@sha256:abc"
    assert device_plugin_version(_Core(_pod(digest)), "ns", "n") == "v0.17.1-ubi9"
    # Restarting: an old pod going away, the new one not Ready yet.
    old = _pod("nvcr.io/nvidia/k8s-device-plugin:v0.16.2", deleting=True)
    new = _pod("nvcr.io/nvidia/k8s-device-plugin:v0.17.1", ready=False)
    assert device_plugin_version(_Core(old, new), "ns", "n") == ""
    assert device_plugin_version(_Core(), "ns", "n") == ""
