"""Readiness: may an attempt's pod start on the devices it was given?

The per-attempt bearer token the readiness init container presents, and the check
the portal answers it with from the node agent's latest report. Plain functions
(only `ready_token_key` reads a setting); nothing here imports the Kubernetes client
or the web layer, so the backends and the agent API can both use it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings


def ready_token_key() -> str:
    """The server key under which per-attempt readiness tokens are signed."""
    return hashlib.sha256(f"quartermaster.k8s.ready:{settings.SECRET_KEY}".encode()).hexdigest()


def attempt_token(key: str | bytes, namespace: str, name: str, attempt_id: int) -> str:
    """The per-attempt bearer token the readiness init container presents.

    An HMAC of the attempt's identity under a server key, so the portal can
    check it without storing it: recompute and `hmac.compare_digest`.
    """
    raw = key.encode() if isinstance(key, str) else key
    msg = f"quartermaster.attempt-ready:{namespace}/{name}/{attempt_id}".encode()
    return hmac.new(raw, msg, hashlib.sha256).hexdigest()


# --- Admission: are the devices really free? -----------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


#: memory a device holds with nothing running on it (driver and context reservations)
IDLE_MEMORY_MIB = 1024


def devices_free(
    report: Mapping[str, Any] | None,
    grants: Sequence[Any],
    *,
    now: datetime | None = None,
    stale_after_s: int | None = None,
    uuids: Sequence[str] = (),
    idle_memory_mib: int = IDLE_MEMORY_MIB,
) -> tuple[bool, str]:
    """Return (True, "") when the node agent's report shows the granted devices free.

    `grants` are `GrantSpec`s (device index, MIG profile and start, memory cap).
    With `uuids` (what the readiness init container saw in
    NVIDIA_VISIBLE_DEVICES) the devices are looked up by UUID, since the
    device plugin, not the packer, chose them. A device is not free when:

    1. there is no report, or it is older than `stale_after_s`;
    2. the device (or MIG instance) is missing, unhealthy, or had a critical Xid;
    3. whole GPU or MIG instance: a process holds memory on it, or more than
       `idle_memory_mib` is in use;
    4. shared slice: less free memory than the slice's cap.
    """
    if not report:
        return False, "no node agent report for this node"
    now = now or _now()
    if stale_after_s is not None:
        sent = _parse_time(report.get("sent_at"))
        if sent is None or (now - sent).total_seconds() > stale_after_s:
            return False, "the node agent report is stale"
    devices = list(report.get("devices") or ())
    if uuids:
        return _free_by_uuid(devices, grants, uuids, idle_memory_mib)
    by_index = {d.get("index"): d for d in devices}
    for g in grants:
        dev = by_index.get(g.device)
        if dev is None:
            return False, f"device {g.device} is not in the node agent report"
        ok, why = _device_ok(dev, f"device {g.device}")
        if not ok:
            return ok, why
        if getattr(g, "mig_profile", ""):
            inst = next(
                (
                    m
                    for m in dev.get("mig") or ()
                    if m.get("start") == g.mig_start and m.get("profile") == g.mig_profile
                ),
                None,
            )
            if inst is None:
                return (
                    False,
                    f"MIG {g.mig_profile} at slot {g.mig_start} does not exist on device {g.device}",
                )
            ok, why = _idle(inst, f"MIG {g.mig_profile} on device {g.device}", idle_memory_mib)
        elif getattr(g, "gpu_memory_mib", 0) and getattr(g, "milli", 1000) < 1000:
            ok, why = _room(dev, g.gpu_memory_mib, f"device {g.device}")
        else:
            ok, why = _idle(dev, f"device {g.device}", idle_memory_mib)
        if not ok:
            return ok, why
    return True, ""


def _free_by_uuid(
    devices: Sequence[Mapping[str, Any]],
    grants: Sequence[Any],
    uuids: Sequence[str],
    idle_memory_mib: int,
) -> tuple[bool, str]:
    parents = {d.get("uuid"): d for d in devices}
    migs = {m.get("uuid"): (d, m) for d in devices for m in d.get("mig") or ()}
    shared_cap = max(
        (getattr(g, "gpu_memory_mib", 0) for g in grants if getattr(g, "milli", 1000) < 1000),
        default=0,
    )
    for uuid in uuids:
        if uuid in migs:
            dev, inst = migs[uuid]
            ok, why = _device_ok(dev, f"device {dev.get('index')}")
            if ok:
                ok, why = _idle(inst, f"MIG {inst.get('profile')} ({uuid})", idle_memory_mib)
        elif uuid in parents:
            dev = parents[uuid]
            ok, why = _device_ok(dev, f"device {dev.get('index')}")
            if ok:
                ok, why = (
                    _room(dev, shared_cap, f"device {dev.get('index')}")
                    if shared_cap
                    else _idle(dev, f"device {dev.get('index')}", idle_memory_mib)
                )
        else:
            return False, f"device {uuid} is not in the node agent report"
        if not ok:
            return ok, why
    return True, ""


def _device_ok(dev: Mapping[str, Any], what: str) -> tuple[bool, str]:
    if not dev.get("healthy", False):
        return False, f"{what} is unhealthy{': ' + dev['error'] if dev.get('error') else ''}"
    critical = [x.get("xid") for x in dev.get("xids") or () if x.get("critical")]
    if critical:
        return False, f"{what} reported critical Xid {critical[-1]}"
    return True, ""


def _idle(dev: Mapping[str, Any], what: str, idle_memory_mib: int) -> tuple[bool, str]:
    procs = [
        p for p in dev.get("processes") or () if (p.get("used_memory_mib") or 0) > 0 or p.get("pid")
    ]
    if procs:
        p = procs[0]
        return (
            False,
            f"{what} is busy: pid {p.get('pid')} holds {p.get('used_memory_mib') or '?'} MiB",
        )
    used = int(dev.get("memory_used_mib") or 0)
    if used > idle_memory_mib:
        return False, f"{what} is busy: {used} MiB in use by no visible process"
    return True, ""


def _room(dev: Mapping[str, Any], need_mib: int, what: str) -> tuple[bool, str]:
    room = int(dev.get("memory_total_mib") or 0) - int(dev.get("memory_used_mib") or 0)
    if room < need_mib:
        return False, f"{what} has {room} MiB free, the slice needs {need_mib} MiB"
    return True, ""
