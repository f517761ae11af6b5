"""Serving replicas of the simulated cluster: one synthetic model server process each.

`portal.backends.serving_sim` is the server. The simulated backend starts one per replica at
launch (its port and pid go in the workload row's spec), stops it with the workload,
restarts a replica whose process is gone (as a Deployment would; the web and worker
processes of the portal may have restarted), and on a revision change restarts the
replicas one by one with the new revision: each warms up again before it is ready.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import zlib
from typing import Any

from django.conf import settings

from portal.backends.base import LaunchSpec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie child is gone for our purposes: reap it.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == 0


def serving_fields(member: LaunchSpec) -> dict[str, Any] | None:
    """The `serving` part of a replica's spec, before its process starts."""
    s = member.serving
    if s is None:
        return None
    return {
        "runtime": s.runtime,
        "model": s.model,
        "revision": s.revision,
        "labels": {
            "team": member.team,
            # the request, stable across its attempts (the selector of its queries)
            "workload": f"qm-{member.request_id}",
            "pool": member.pool,
            "class": member.workload_class,
            "model_name": s.model,
            "node": member.node,
            "memory_mib": str(_memory_mib(member)),
            # what dcgm-exporter labels the replica's GPU series with (a Job's pod name)
            "namespace": member.namespace,
            "pod": f"{member.name}-{_suffix(member.name)}",
            **_mig_labels(member),
        },
        "port": 0,
        "pid": 0,
    }


def _suffix(name: str) -> str:
    """The five characters Kubernetes appends to a Job's pod name, stable per workload."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    n = zlib.crc32(name.encode())
    return "".join(alphabet[(n >> (5 * i)) % len(alphabet)] for i in range(5))


def _mig_labels(member: LaunchSpec) -> dict[str, str]:
    mig = [g for g in member.grants if g.mig_profile]
    if not mig:
        return {}
    profile = mig[0].mig_profile.rsplit("/", 1)[-1].removeprefix("mig-")
    return {"mig_profile": profile, "mig_instance": str(max(0, mig[0].mig_start))}


def _memory_mib(member: LaunchSpec) -> int:
    """GPU memory the replica may use: its slices' caps, its MIG instances' memory, or a
    whole 80 GB device per grant."""
    total = 0
    for g in member.grants:
        if g.mig_profile:
            size = g.mig_profile.split(".")[-1].removesuffix("gb")
            total += int(size) * 1024 if size.isdigit() else 10 * 1024
        else:
            total += g.gpu_memory_mib or 80 * 1024
    return total or 80 * 1024


def start(serving: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Start the replica's server; returns `serving` with its port and pid."""
    if not settings.SIMULATED_SERVING_PROCESSES:
        return serving
    port = free_port()
    labels = {**serving["labels"], "model_revision": serving["revision"]}
    cmd = [
        sys.executable,
        "-m",
        "portal.backends.serving_sim",
        "--port",
        str(port),
        "--runtime",
        serving["runtime"],
        "--warmup-s",
        str(settings.SIMULATED_SERVING_WARMUP_S),
        "--rps",
        str(settings.SIMULATED_SERVING_RPS),
        "--seed",
        str(seed),
        *(a for k, v in sorted(labels.items()) for a in ("--label", f"{k}={v}")),
    ]
    proc = subprocess.Popen(  # noqa: S603 - our own module, arguments from stored rows
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return {**serving, "port": port, "pid": proc.pid}


def stop(serving: dict[str, Any] | None) -> None:
    pid = int((serving or {}).get("pid") or 0)
    if pid > 0 and alive(pid):
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, os.WNOHANG)
        except (OSError, ChildProcessError):
            pass


def url(serving: dict[str, Any], path: str = "/metrics") -> str:
    return f"http://127.0.0.1:{serving['port']}{path}"
