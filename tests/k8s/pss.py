"""A Pod Security Standards `restricted` check over a pod spec (camelCase dict).

The rules of https://kubernetes.io/docs/concepts/security/pod-security-standards
that a generated spec can break, one line each; tests
assert the list of violations is empty.
"""

from __future__ import annotations

from typing import Any

ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"{key} is set")
    if pod.get("nodeName"):
        out.append("nodeName is set (bypasses the scheduler)")
    for vol in pod.get("volumes") or ():
        kinds = set(vol) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {vol['name']} uses {sorted(kinds - ALLOWED_VOLUMES)}")
    psc = pod.get("securityContext") or {}
    for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities {caps['add']}")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            out.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile is {seccomp!r}")
        for port in c.get("ports") or ():
            if port.get("hostPort"):
                out.append(f"{name}: hostPort")
    return out
