"""The GPU Operator's driver API (docs/lifecycle.md, "Driver rollouts through the GPU Operator").

A driver rollout does not install anything itself: it tells the GPU Operator which version a
wave's nodes run, and the Operator's upgrade controller cordons, drains, replaces the driver
and reports per node in `nvidia.com/gpu-driver-upgrade-state`. Two ways, as the Operator has:

- `NVIDIADriver` (nvidia.com/v1alpha1, cluster-scoped; needs `ClusterPolicy.spec.driver.
  useNvidiaDriverCRD: true`): one resource per wave, whose `spec.nodeSelector` is a label the
  portal puts on that wave's nodes, so that each wave moves on its own;
- `ClusterPolicy.spec.driver.version` (nvidia.com/v1): one version for the whole cluster; the
  Operator's `upgradePolicy` paces the nodes, the portal follows their state labels.

A device-plugin rollout sets `ClusterPolicy.spec.devicePlugin.version` under either (the
NVIDIADriver has no plugin field).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from portal.lib import lifecycle

GROUP = "nvidia.com"
DRIVER_VERSION = "v1alpha1"
DRIVER_PLURAL = "nvidiadrivers"
POLICY_VERSION = "v1"
POLICY_PLURAL = "clusterpolicies"
#: the label a driver rollout puts on a wave's nodes; its NVIDIADriver selects by it
WAVE_LABEL = lifecycle.DRIVER_WAVE
#: the `app` label of the Operator's device-plugin DaemonSet's pods, and the plugin's image
PLUGIN_APP = "nvidia-device-plugin-daemonset"
PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin"
#: GPU_OPERATOR_DRIVER_API values; "auto" is NVIDIADriver where its CRD is served, else labels
DRIVER_APIS = ("auto", "nvidiadriver", "clusterpolicy", "labels")


def nvidiadriver_build(
    name: str, version: str, *, repository: str = "", image: str = "nvcr.io/nvidia/driver"
) -> dict[str, Any]:
    """An NVIDIADriver selecting the nodes labelled `WAVE_LABEL=name` (never the default one:
    the Operator refuses a default NVIDIADriver with a nodeSelector)."""
    spec: dict[str, Any] = {
        "driverType": "gpu",
        "default": False,
        "version": version,
        "image": image,
        "nodeSelector": {WAVE_LABEL: name},
    }
    if repository:
        spec["repository"] = repository
    return {
        "apiVersion": f"{GROUP}/{DRIVER_VERSION}",
        "kind": "NVIDIADriver",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "quartermaster"},
        },
        "spec": spec,
    }


def nvidiadriver_apply(custom: Any, body: dict[str, Any]) -> None:
    """Create the NVIDIADriver, or merge-patch its spec where it exists (a retried write)."""
    name = body["metadata"]["name"]
    try:
        custom.create_cluster_custom_object(GROUP, DRIVER_VERSION, DRIVER_PLURAL, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        custom.patch_cluster_custom_object(
            GROUP, DRIVER_VERSION, DRIVER_PLURAL, name, {"spec": body["spec"]}
        )


def cluster_policy_version(custom: Any, component: str, version: str) -> str:
    """Set `spec.<component>.version` (`driver`, `devicePlugin`) on the cluster's ClusterPolicy
    (there is one); its name. LookupError when there is none."""
    found = custom.list_cluster_custom_object(GROUP, POLICY_VERSION, POLICY_PLURAL)
    items = found.get("items") or []
    if not items:
        raise LookupError("no ClusterPolicy in the cluster")
    name = str(items[0]["metadata"]["name"])
    custom.patch_cluster_custom_object(
        GROUP, POLICY_VERSION, POLICY_PLURAL, name, {"spec": {component: {"version": version}}}
    )
    return name


def _tag(image: str) -> str:
    name = image.split("@", 1)[0]
    return name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""


def device_plugin_version(core: Any, namespace: str, node: str) -> str:
    """The version the device plugin on `node` runs: the image tag of its Operator-managed
    pod once that pod is Ready and not being deleted; "" while none is (mid-restart)."""
    pods = core.list_namespaced_pod(
        namespace, label_selector=f"app={PLUGIN_APP}", field_selector=f"spec.nodeName={node}"
    ).items
    for pod in pods:
        if pod.metadata.deletion_timestamp is not None:
            continue
        ready = any(
            c.type == "Ready" and c.status == "True"
            for c in (pod.status.conditions if pod.status else None) or ()
        )
        if ready and pod.spec.containers:
            # A UBI build's tag carries a suffix ("v0.17.1-ubi9"): the version is before it.
            return _tag(pod.spec.containers[0].image or "")
    return ""


def served(custom: Any, version: str, plural: str) -> bool:
    """Whether the API server serves `plural` in nvidia.com/`version` (discovery; 404: no)."""
    try:
        found = custom.get_api_resources(GROUP, version)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == plural for r in (found.resources if found is not None else None) or ())
