"""Pool lifecycle, the pure part: node software from labels, drift, rollout waves, verdicts.

No database here: the rollout service (`portal.rollouts`), the pages and the management
commands call these with plain values. docs/lifecycle.md describes the whole feature.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# -- node software ---------------------------------------------------------------------

#: GPU Feature Discovery labels; the deprecated `cuda.driver.*` and
#: `cuda.runtime.*` spellings are read where the new ones are missing (older GFD).
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
DRIVER_PARTS = (
    ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver.major"),
    ("nvidia.com/cuda.driver-version.minor", "nvidia.com/cuda.driver.minor"),
    ("nvidia.com/cuda.driver-version.revision", "nvidia.com/cuda.driver.rev"),
)
CUDA_FULL = "nvidia.com/cuda.runtime-version.full"
CUDA_PARTS = (
    ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime.major"),
    ("nvidia.com/cuda.runtime-version.minor", "nvidia.com/cuda.runtime.minor"),
)
#: GFD does not label the device plugin's or the GPU Operator's version: a site that wants
#: them shown labels its nodes with these (the Operator's `nodeLabels`, or by hand). Absent
#: labels are shown as "not labelled", never guessed.
DEVICE_PLUGIN_VERSION = "quartermaster.io/device-plugin-version"
GPU_OPERATOR_VERSION = "quartermaster.io/gpu-operator-version"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
DEVICE_PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
#: the GPU Operator's upgrade controller state label; `upgrade-required` asks it to upgrade
DRIVER_UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
#: its values, in the order the upgrade controller moves a node through them
UPGRADE_STATES = (
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "drain-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
    "upgrade-failed",
)
UPGRADE_DONE, UPGRADE_FAILED = "upgrade-done", "upgrade-failed"
#: the label a driver rollout puts on a wave's nodes; that wave's NVIDIADriver selects by it
DRIVER_WAVE = "quartermaster.io/driver-wave"
#: the GPU Operator APIs a driver rollout may write (GPU_OPERATOR_DRIVER_API, resolved)
OPERATOR_APIS = ("nvidiadriver", "clusterpolicy")
#: rollout kinds written through the GPU Operator's API where the site runs one (a device
#: plugin's version is always the ClusterPolicy's: NVIDIADriver has no plugin field)
OPERATOR_KINDS = ("driver", "device-plugin")
#: the version a rollout asked a node for (annotation-like; kept as a label so selectors see it)
ROLLOUT_TARGET = "quartermaster.io/rollout-target"

#: what the software inventory shows, in this order
SOFTWARE_FIELDS = ("driver", "cuda", "device_plugin", "gpu_operator", "mig_config")
SOFTWARE_TITLES = {
    "driver": "driver",
    "cuda": "CUDA",
    "device_plugin": "device plugin",
    "gpu_operator": "GPU Operator",
    "mig_config": "MIG config",
}


def _joined(labels: Mapping[str, str], parts: Sequence[tuple[str, str]]) -> str:
    values = [labels.get(new) or labels.get(old) or "" for new, old in parts]
    # A version is its leading labelled parts: 550.107 without a revision is still a version.
    out: list[str] = []
    for v in values:
        if not v:
            break
        out.append(v)
    return ".".join(out)


def node_software(labels: Mapping[str, str]) -> dict[str, str]:
    """The software versions a node's labels state ("" where not labelled)."""
    return {
        "driver": labels.get(DRIVER_FULL) or _joined(labels, DRIVER_PARTS),
        "cuda": labels.get(CUDA_FULL) or _joined(labels, CUDA_PARTS),
        "device_plugin": labels.get(DEVICE_PLUGIN_VERSION, ""),
        "gpu_operator": labels.get(GPU_OPERATOR_VERSION, ""),
        "mig_config": labels.get(MIG_CONFIG, ""),
    }


def software_drift(per_node: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, list[str]]]:
    """Fields on which a pool's nodes disagree: field -> version -> nodes ("" = unlabelled).

    A field no node labels is no drift; one that some nodes label and others do not is.
    """
    drift: dict[str, dict[str, list[str]]] = {}
    for f in SOFTWARE_FIELDS:
        by_value: dict[str, list[str]] = {}
        for node, sw in sorted(per_node.items()):
            by_value.setdefault(sw.get(f, ""), []).append(node)
        if len(by_value) > 1:
            drift[f] = by_value
    return drift


def majority(by_value: Mapping[str, list[str]]) -> str:
    """The version most nodes run (ties: the highest-sorting), to name the odd ones out."""
    return max(by_value, key=lambda v: (len(by_value[v]), v))


# -- rollouts --------------------------------------------------------------------------

KINDS = ("driver", "gpu-operator", "device-plugin", "mig-layout")


@dataclass(frozen=True)
class Change:
    """What a rollout writes on each node, and the label that says it took."""

    #: labels to set (None removes)
    labels: dict[str, str | None]
    #: the label whose value shows the change took, and that value ("" = nothing to wait for)
    converged_label: str
    converged_value: str


def driver_wave_name(rollout: int, wave: int) -> str:
    """The NVIDIADriver of one wave of a driver rollout, and `DRIVER_WAVE` on its nodes."""
    return f"qm-rollout-{rollout}-wave-{wave}"


def driver_upgrade(labels: Mapping[str, str], target: str) -> tuple[str, str]:
    """Where the GPU Operator's upgrade of a node to `target` stands: ("done" | "failed" |
    "waiting", why). Done needs both `upgrade-done` and GFD's driver version at the target:
    a node still `upgrade-done` from its last upgrade has not begun this one."""
    state = labels.get(DRIVER_UPGRADE_STATE, "")
    version = labels.get(DRIVER_FULL) or _joined(labels, DRIVER_PARTS)
    if state == UPGRADE_FAILED:
        return "failed", f"the GPU Operator reports {DRIVER_UPGRADE_STATE}={UPGRADE_FAILED}"
    if state == UPGRADE_DONE and version == target:
        return "done", ""
    shown = state or "(no upgrade state yet)"
    return "waiting", f"GPU Operator: {shown}; driver {version or 'not labelled'}, want {target}"


def change_for(kind: str, target: str, api: str = "labels", wave: str = "") -> Change:
    """The node labels a rollout of `kind` to `target` writes (docs/lifecycle.md).

    - driver: the GPU Operator's upgrade controller is asked to upgrade the node
      (`nvidia.com/gpu-driver-upgrade-state=upgrade-required`); done when GFD labels the
      new `nvidia.com/cuda.driver-version.full`;
    - mig-layout: mig-manager's `nvidia.com/mig.config=<mig-parted config>`; done when
      `nvidia.com/mig.config.state=success`;
    - device-plugin: `nvidia.com/device-plugin.config=<config name>`; done once set; through
      the GPU Operator's API (either), the target is the plugin version set on the
      ClusterPolicy, done when the node's `DEVICE_PLUGIN_VERSION` label reads it;
    - gpu-operator: the operator version label the operands' node selector matches.

    A driver rollout through the GPU Operator's API (`api` nvidiadriver or clusterpolicy)
    writes the version there, not the upgrade-state label (the Operator owns it); on the node
    only the wave label its NVIDIADriver selects and the target. See `driver_upgrade`.
    """
    if kind == "driver" and api in OPERATOR_APIS:
        labels: dict[str, str | None] = {ROLLOUT_TARGET: _label_value(target)}
        if api == "nvidiadriver":
            labels[DRIVER_WAVE] = wave
        return Change(labels, DRIVER_UPGRADE_STATE, UPGRADE_DONE)
    if kind == "driver":
        return Change(
            {DRIVER_UPGRADE_STATE: "upgrade-required", ROLLOUT_TARGET: _label_value(target)},
            DRIVER_FULL,
            target,
        )
    if kind == "mig-layout":
        return Change({MIG_CONFIG: target}, MIG_CONFIG_STATE, "success")
    if kind == "device-plugin" and api in OPERATOR_APIS:
        # The version is the ClusterPolicy's (`spec.devicePlugin.version`); the node says it
        # runs it through the plugin version label.
        return Change(
            {ROLLOUT_TARGET: _label_value(target)}, DEVICE_PLUGIN_VERSION, _label_value(target)
        )
    if kind == "device-plugin":
        return Change({DEVICE_PLUGIN_CONFIG: target}, DEVICE_PLUGIN_CONFIG, target)
    if kind == "gpu-operator":
        return Change({GPU_OPERATOR_VERSION: target}, GPU_OPERATOR_VERSION, target)
    raise ValueError(f"unknown rollout kind {kind!r}")


def _label_value(value: str) -> str:
    # A label value is at most 63 characters of [-A-Za-z0-9_.].
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in value)[:63]


def plan_waves(nodes: Sequence[str], *, canary: int, wave_percent: int) -> list[list[str]]:
    """Wave 0 is the canary (the first `canary` nodes); then waves of `wave_percent` % of the
    pool's nodes (at least one node each), in name order."""
    nodes = sorted(nodes)
    if not nodes:
        return []
    canary = max(0, min(canary, len(nodes)))
    waves = [nodes[:canary]] if canary else []
    rest = nodes[canary:]
    size = max(1, math.ceil(len(nodes) * wave_percent / 100))
    waves += [rest[i : i + size] for i in range(0, len(rest), size)]
    return waves


def rollback_criteria(kind: str, max_failed_nodes: int, target: str, previous: str) -> str:
    """When to roll back, in words, as the rollout page and docs/lifecycle.md state it."""
    back = f"back to {previous}" if previous else "back to each node's previous value"
    return (
        f"The rollout halts itself once more than {max_failed_nodes} node(s) fail validation "
        f"or the change does not take within the apply timeout. Roll {kind} {back} when the "
        f"canary wave fails, when a failure repeats on a second node, or when a node that "
        f"passed shows a critical Xid within a day; failed nodes stay cordoned with the reason."
    )


# -- validation ------------------------------------------------------------------------

#: the burn-in checks, in the order a node runs them
CHECKS = ("device_visibility", "nccl_allreduce", "dcgm_diag", "warmup")

DEFAULT_THRESHOLDS: dict[str, float] = {
    #: NCCL all-reduce bus bandwidth, GB/s, at least
    "nccl_busbw_gbps": 100.0,
    #: model warm-up, seconds, at most (checked only where the burn-in reports one)
    "warmup_max_s": 120.0,
    #: `dcgmi diag -r` level the burn-in runs (1 quick, 2 medium, 3 long, 4 extended)
    "dcgm_diag_level": 1.0,
}


def verdict(
    results: Mapping[str, Any], thresholds: Mapping[str, float], expected_devices: int
) -> tuple[bool, str]:
    """Pass or fail a node's burn-in results, with the first reason it failed."""
    try:
        return _verdict(results, thresholds, expected_devices)
    except (TypeError, ValueError, OverflowError):
        # Figures reported by a pod are not trusted to be numbers.
        return False, "the results could not be read as numbers"


def _verdict(
    results: Mapping[str, Any], thresholds: Mapping[str, float], expected_devices: int
) -> tuple[bool, str]:
    seen = int(results.get("devices_visible", 0))
    if seen < expected_devices:
        return False, f"device visibility: {seen} of {expected_devices} GPUs visible"
    busbw = float(results.get("nccl_busbw_gbps", 0.0))
    floor = float(thresholds.get("nccl_busbw_gbps", DEFAULT_THRESHOLDS["nccl_busbw_gbps"]))
    if busbw < floor:
        return False, f"NCCL all-reduce: {busbw:g} GB/s bus bandwidth, below {floor:g}"
    diag = str(results.get("dcgm_diag", "fail"))
    if diag != "pass":
        level = int(thresholds.get("dcgm_diag_level", 1))
        return False, f"DCGM diagnostics level {level}: {diag}"
    if "warmup_s" not in results:
        # The default images (dcgm, nccl-tests) carry no framework to warm up.
        return True, ""
    warm = float(results.get("warmup_s", math.inf))
    ceiling = float(thresholds.get("warmup_max_s", DEFAULT_THRESHOLDS["warmup_max_s"]))
    if warm > ceiling:
        return False, f"model warm-up took {warm:g} s, over {ceiling:g}"
    return True, ""


def thresholds_check(raw: Any, defaults: Mapping[str, float] | None = None) -> dict[str, float]:
    """Validate user-given thresholds: known keys, non-negative numbers (a DCGM level 1 to 4),
    over `defaults` (the site's). ValueError says which."""
    base = dict(defaults or DEFAULT_THRESHOLDS)
    if raw in (None, ""):
        return base
    if not isinstance(raw, Mapping):
        raise ValueError('Give thresholds as an object, e.g. {"nccl_busbw_gbps": 150}.')
    out = base
    for k, v in raw.items():
        if k not in DEFAULT_THRESHOLDS:
            raise ValueError(f"Unknown threshold {k!r}; known: {', '.join(DEFAULT_THRESHOLDS)}.")
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise ValueError(f"Threshold {k} must be a number of at least 0.")
        if k == "dcgm_diag_level" and v not in (1, 2, 3, 4):
            raise ValueError("Threshold dcgm_diag_level must be 1, 2, 3 or 4.")
        out[k] = float(v)
    return out
