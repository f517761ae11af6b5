"""The node agent: reads every GPU through NVML and reports to the portal.

Runs as a DaemonSet on GPU nodes (charts/quartermaster, `node-agent`), either
as `python -m portal.node_agent` (no Django, no database credentials on GPU
nodes: what the chart runs) or as `manage.py node_agent` (the same options).

Each report (JSON, POSTed to `<portal>/api/v1/agent/report/` with
`Authorization: Bearer <NODE_AGENT_TOKEN>`):

    {"node": "gpu-a", "agent_version": "0.1.0", "sent_at": "2026-01-01T12:00:00Z",
     "driver_version": "550.107.02",
     "devices": [{"index": 0, "uuid": "GPU-…", "model": "NVIDIA A100-SXM4-80GB",
                  "memory_total_mib": 81920, "memory_used_mib": 512, "utilization_pct": 0,
                  "healthy": true, "error": "", "mig_mode": false,
                  "xids": [{"xid": 79, "critical": true, "at": "…"}],
                  "processes": [{"pid": 4242, "used_memory_mib": 2048}],
                  "mig": [{"profile": "3g.40gb", "start": 4, "size": 4, "uuid": "MIG-…",
                           "memory_total_mib": 40192, "memory_used_mib": 0, "processes": []}]}]}

`pynvml` (from the `nvidia-ml-py` package) is imported here only, inside
`load_nvml()`, so everything else runs on machines without NVIDIA drivers;
tests put a fake module in `sys.modules["pynvml"]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("quartermaster.node_agent")

AGENT_VERSION = "0.1.0"
MIB = 1024 * 1024

#: Xids the NVIDIA device plugin treats as application errors and ignores
#: (k8s-device-plugin internal/rm/health.go); every other
#: Xid (48 DBE, 63/64 row remapping, 74 NVLink, 79 fell off the bus, 92, 94,
#: 95 ECC, 119/120 GSP, …) is critical: the device is unhealthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def is_critical_xid(xid: int) -> bool:
    return xid not in APPLICATION_XIDS


def load_nvml() -> Any:
    """Import pynvml (nvidia-ml-py) and initialise NVML."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _now_iso(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+me\.all|\+me|-me|\+gfx)?)")


class NodeAgent:
    """Reads the devices and keeps Xid events between reports.

    Xid events are collected from an NVML event set; they stay buffered until
    a report carrying them was accepted by the portal, so a failed POST loses
    nothing. A device whose NVML calls fail is reported unhealthy with the
    error, and the other devices are reported as usual.
    """

    def __init__(
        self, nvml: Any, node: str, *, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.nvml = nvml
        self.node = node
        self.clock = clock or (lambda: datetime.now(UTC))
        self.pending_xids: dict[int, list[dict[str, Any]]] = {}
        self.event_set: Any = None
        self._register_events()

    # -- events ----------------------------------------------------------------------

    def _register_events(self) -> None:
        nv = self.nvml
        try:
            self.event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("no NVML event set: %s; Xids will not be reported", exc)
            return
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                nv.nvmlDeviceRegisterEvents(
                    handle, nv.nvmlEventTypeXidCriticalError, self.event_set
                )
            except nv.NVMLError as exc:
                log.warning("device %d: cannot register for Xid events: %s", i, exc)

    def wait_for_events(self, timeout_s: float) -> bool:
        """Collect Xid events for up to `timeout_s`; True if a critical one arrived."""
        nv = self.nvml
        if self.event_set is None:
            time.sleep(max(0.0, timeout_s))
            return False
        critical = False
        timeout_ms = int(max(0.0, timeout_s) * 1000)
        while True:
            try:
                data = nv.nvmlEventSetWait_v2(self.event_set, timeout_ms)
            except nv.NVMLError_Timeout:
                return critical
            except nv.NVMLError as exc:
                log.warning("waiting for NVML events failed: %s", exc)
                time.sleep(max(0.0, timeout_s))
                return critical
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                critical |= self._record_xid(data)
            timeout_ms = 0  # drain what is queued, then report

    def _record_xid(self, data: Any) -> bool:
        nv = self.nvml
        try:
            index = int(nv.nvmlDeviceGetIndex(data.device))
        except nv.NVMLError:
            index = -1
        xid = int(data.eventData)
        entry = {"xid": xid, "critical": is_critical_xid(xid), "at": _now_iso(self.clock())}
        gi = getattr(data, "gpuInstanceId", None)
        if gi is not None and gi != 0xFFFFFFFF:
            entry["gpu_instance_id"] = int(gi)
        self.pending_xids.setdefault(index, []).append(entry)
        log.warning(
            "device %d: Xid %d (%s)", index, xid, "critical" if entry["critical"] else "application"
        )
        return bool(entry["critical"])

    # -- reading -------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        nv = self.nvml
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = ""
        devices = [self.read_device(i) for i in range(nv.nvmlDeviceGetCount())]
        for index, xids in self.pending_xids.items():
            if index < 0:
                continue
            for d in devices:
                if d["index"] == index:
                    d["xids"] = list(xids)
                    if any(x["critical"] for x in xids):
                        d["healthy"] = False
        return {
            "node": self.node,
            "agent_version": AGENT_VERSION,
            "sent_at": _now_iso(self.clock()),
            "driver_version": driver,
            "devices": devices,
        }

    def delivered(self) -> None:
        """The portal accepted the last report: forget the Xids it carried."""
        self.pending_xids.clear()

    def read_device(self, index: int) -> dict[str, Any]:
        nv = self.nvml
        dev: dict[str, Any] = {
            "index": index,
            "uuid": "",
            "model": "",
            "memory_total_mib": 0,
            "memory_used_mib": 0,
            "utilization_pct": None,
            "healthy": True,
            "error": "",
            "mig_mode": False,
            "xids": [],
            "processes": [],
            "mig": [],
        }
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            dev["uuid"] = _text(nv.nvmlDeviceGetUUID(h))
            dev["model"] = _text(nv.nvmlDeviceGetName(h))
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            dev["memory_total_mib"] = int(mem.total) // MIB
            dev["memory_used_mib"] = int(mem.used) // MIB
            dev["mig_mode"] = self._mig_enabled(h)
            if dev["mig_mode"]:
                dev["mig"] = self._mig_instances(h, dev["memory_total_mib"])
            else:
                dev["utilization_pct"] = self._utilization(h)
                dev["processes"] = self._processes(h)
            if self._row_remap_failed(h):
                dev["healthy"] = False
                dev["error"] = "row remapping failed"
        except nv.NVMLError as exc:
            dev["healthy"] = False
            dev["error"] = f"NVML: {exc}"
            log.warning("device %d: %s", index, exc)
        return dev

    def _mig_enabled(self, h: Any) -> bool:
        nv = self.nvml
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(h)
        except nv.NVMLError_NotSupported:
            return False
        return bool(current == nv.NVML_DEVICE_MIG_ENABLE)

    def _utilization(self, h: Any) -> int | None:
        nv = self.nvml
        try:
            return int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
        except nv.NVMLError_NotSupported:
            return None

    def _processes(self, h: Any) -> list[dict[str, Any]]:
        nv = self.nvml
        seen: dict[int, dict[str, Any]] = {}
        for getter in (
            nv.nvmlDeviceGetComputeRunningProcesses,
            nv.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                procs = getter(h)
            except nv.NVMLError_NotSupported:
                continue
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                entry = seen.setdefault(int(p.pid), {"pid": int(p.pid), "used_memory_mib": 0})
                if used is not None:
                    entry["used_memory_mib"] = max(entry["used_memory_mib"], int(used) // MIB)
        return sorted(seen.values(), key=lambda p: p["pid"])

    def _row_remap_failed(self, h: Any) -> bool:
        nv = self.nvml
        try:
            _corr, _uncorr, _pending, failure = nv.nvmlDeviceGetRemappedRows(h)
        except nv.NVMLError:
            return False
        return bool(failure)

    def _mig_instances(self, h: Any, device_memory_mib: int) -> list[dict[str, Any]]:
        nv = self.nvml
        out: list[dict[str, Any]] = []
        for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except nv.NVMLError_NotFound:
                continue
            name = _text(nv.nvmlDeviceGetName(mh))
            match = _PROFILE.search(name)
            mem = nv.nvmlDeviceGetMemoryInfo(mh)
            start, size = self._placement(h, mh)
            out.append(
                {
                    "profile": match.group(1) if match else name,
                    "start": start,
                    "size": size,
                    "uuid": _text(nv.nvmlDeviceGetUUID(mh)),
                    "memory_total_mib": int(mem.total) // MIB,
                    "memory_used_mib": int(mem.used) // MIB,
                    "processes": self._processes(mh),
                }
            )
        return sorted(out, key=lambda m: (m["start"], m["uuid"]))

    def _placement(self, h: Any, mh: Any) -> tuple[int, int]:
        """(start, size) of the MIG instance's GPU instance; (-1, 0) where NVML will not say."""
        nv = self.nvml
        try:
            gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(mh))
            info = nv.nvmlGpuInstanceGetInfo(gi)
            return int(info.placement.start), int(info.placement.size)
        except nv.NVMLError as exc:
            # Reading GPU instances may need privileges the agent lacks.
            log.debug("MIG placement not readable: %s", exc)
            return -1, 0


# -- sending ------------------------------------------------------------------------


def post_report(
    portal: str,
    token: str,
    report: dict[str, Any],
    *,
    timeout_s: float = 10.0,
    opener: Callable[..., Any] = urllib.request.urlopen,
) -> int:
    """POST the report; return the HTTP status (0 when the portal could not be reached)."""
    url = portal.rstrip("/") + "/api/v1/agent/report/"
    body = json.dumps(report).encode()
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
            "User-Agent": f"quartermaster-node-agent/{AGENT_VERSION}",
        },
    )
    try:
        with opener(req, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        log.warning("portal answered %s to the report", exc.code)
        return int(exc.code)
    except (urllib.error.URLError, OSError) as exc:
        log.warning("portal unreachable: %s", exc)
        return 0


def token_from_env() -> str:
    """NODE_AGENT_TOKEN, or the contents of the file NODE_AGENT_TOKEN_FILE."""
    path = os.environ.get("NODE_AGENT_TOKEN_FILE")
    if path:
        return Path(path).read_text().strip()
    return os.environ.get("NODE_AGENT_TOKEN", "")


def run(
    *,
    portal: str,
    node: str,
    token: str,
    interval_s: float = 30.0,
    once: bool = False,
    print_only: bool = False,
    nvml: Any = None,
    out: Any = None,
    post: Callable[..., int] = post_report,
    max_reports: int | None = None,
    heartbeat: str = "",
) -> int:
    """Report every `interval_s` seconds (at once after a critical Xid). Returns an exit code.

    With `heartbeat`, the file's mtime is set after every round, reported or not: the chart's
    liveness probe restarts an agent whose loop stopped, not one whose portal is down.
    """
    out = out or sys.stdout
    if not print_only and not token:
        log.error("NODE_AGENT_TOKEN (or NODE_AGENT_TOKEN_FILE) is required to report")
        return 2
    if not print_only and not portal:
        log.error("--portal is required to report")
        return 2
    nvml = nvml if nvml is not None else load_nvml()
    agent = NodeAgent(nvml, node)
    sent = 0
    failures = 0
    try:
        while True:
            report = agent.report()
            if print_only:
                out.write(json.dumps(report, indent=2) + "\n")
                agent.delivered()
            else:
                status = post(portal, token, report)
                if 200 <= status < 300:
                    agent.delivered()
                    failures = 0
                else:
                    failures += 1
            sent += 1
            if heartbeat:
                _touch(heartbeat)
            if once:
                return 0 if print_only or failures == 0 else 1
            if max_reports is not None and sent >= max_reports:
                return 0
            # back off while the portal is down, but never beyond 5 intervals
            agent.wait_for_events(interval_s * min(5, 1 + failures))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _touch(path: str) -> None:
    try:
        with open(path, "a"):
            pass
        os.utime(path)
    except OSError:
        log.warning("cannot touch the heartbeat file %s", path, exc_info=True)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="node_agent", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--portal",
        default=os.environ.get("PORTAL_URL", ""),
        help="portal base URL, e.g. http://quartermaster-web:8000 (env PORTAL_URL)",
    )
    parser.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's Kubernetes name (env NODE_NAME, from the downward API)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=float(os.environ.get("AGENT_INTERVAL_SECONDS", "30")),
        help="seconds between reports",
    )
    parser.add_argument(
        "--heartbeat",
        default=os.environ.get("NODE_AGENT_HEARTBEAT_FILE", ""),
        help="touch this file after every round (liveness; env NODE_AGENT_HEARTBEAT_FILE)",
    )
    parser.add_argument("--once", action="store_true", help="send one report and exit")
    parser.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the report instead of sending it",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    args = build_parser().parse_args(argv)
    node = args.node or os.uname().nodename
    return run(
        portal=args.portal,
        node=node,
        token=token_from_env(),
        interval_s=args.interval,
        once=args.once,
        print_only=args.print_only,
        heartbeat=args.heartbeat,
    )


if __name__ == "__main__":
    sys.exit(main())
