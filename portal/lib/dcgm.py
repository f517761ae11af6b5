"""dcgm-exporter's series as it labels them, and the PromQL the portal builds over them.

dcgm-exporter (docs/kubernetes.md, "GPU metrics") labels every series with the device
(`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`, the driver version
label field) and, with its Kubernetes pod mapping, the pod holding it (`pod`,
`namespace`, `container`); a MIG instance adds `GPU_I_PROFILE` and `GPU_I_ID`. It never
emits a label of ours: a request's series are its pods', by namespace and pod name.
`DCGM_FI_DEV_GPU_UTIL` is absent on MIG instances, where `DCGM_FI_PROF_GR_ENGINE_ACTIVE`
(0..1) stands in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEVICE_LABELS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
)
POD_LABELS = ("container", "namespace", "pod")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
#: every label a dcgm-exporter series may carry; no query may select another
LABELS = frozenset(DEVICE_LABELS + POD_LABELS + MIG_LABELS)

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"

_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^{}]*)\}")
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^()]*)\)")


def quote(value: str) -> str:
    """`value` as a PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def regex_literal(value: str) -> str:
    """`value` matched literally inside a PromQL regex (RE2), before quoting."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", value)


def pods_selector(namespace: str, workloads: Iterable[str]) -> str:
    """The series of the pods of `workloads` (Job, Deployment or gang member names) in
    `namespace`: their pods are `<name>-<suffix>` (a Deployment's `<name>-<hash>-<suffix>`)."""
    names = sorted({regex_literal(w) for w in workloads if w})
    pattern = f"({'|'.join(names)})-.+" if names else "$^"
    return f"namespace={quote(namespace)},pod=~{quote(pattern)}"


def utilization(sel: str) -> str:
    """GPU utilization in % per device or MIG instance: `GPU_UTIL` where dcgm-exporter reports
    it, the graphics engine's active ratio × 100 where it does not (MIG instances). `or`
    keeps the left side for a device that has both (their labels are the same)."""
    return f"({GPU_UTIL}{{{sel}}} or 100 * {GR_ENGINE_ACTIVE}{{{sel}}})"


def utilization_over(fn: str, sel: str, window_s: int) -> str:
    """`utilization` through a range function (`avg_over_time`, `max_over_time`) over every
    raw sample of the last `window_s`."""
    return (
        f"({fn}({GPU_UTIL}{{{sel}}}[{window_s}s])"
        f" or 100 * {fn}({GR_ENGINE_ACTIVE}{{{sel}}}[{window_s}s]))"
    )


def selected_labels(expr: str) -> set[tuple[str, str]]:
    """(series name, label) for every label a PromQL expression matches on a DCGM series or
    groups DCGM series by; raises ValueError for a selector it cannot read."""
    out: set[tuple[str, str]] = set()
    names: set[str] = set()
    for m in _SELECTOR.finditer(expr):
        name, body = m.group(1) or "", m.group(2)
        pos = 0
        while body[pos:].strip():
            mm = _MATCHER.match(body, pos)
            if mm is None:
                raise ValueError(f"cannot read the selector {{{body}}} in {expr!r}")
            if mm.group(1) == "__name__":
                name = mm.group(3)
            else:
                out.add((name, mm.group(1)))
            pos = mm.end()
        names.add(name)
    if "DCGM_" in expr and all(n.startswith("DCGM_") for n in names):
        # a query over DCGM series only: what it groups or matches by are DCGM labels too
        for g in _GROUPING.finditer(expr):
            out |= {("DCGM_", lab.strip()) for lab in g.group(1).split(",") if lab.strip()}
    return {(n, lab) for n, lab in out if n.startswith("DCGM_") or not n}


def foreign_labels(expr: str) -> set[str]:
    """The labels `expr` selects on DCGM series that dcgm-exporter never emits."""
    return {lab for _, lab in selected_labels(expr)} - LABELS
