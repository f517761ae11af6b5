"""LaunchSpecs for the `cluster` tests: what the portal builds from a stored request."""

from __future__ import annotations

import itertools
from typing import Any

from portal.backends.base import GrantSpec, LaunchSpec

_ids = itertools.count(1000)


def launch_spec(
    *,
    node: str,
    namespace: str = "team-a",
    image: str = "qm.test/ok",
    profile_kind: str = "whole",
    grants: int = 1,
    mig_profile: str = "",
    pool: str = "a100",
    tolerations: tuple[tuple[str, str, str], ...] = (),
    **kw: Any,
) -> LaunchSpec:
    """A training attempt on `node` with `grants` devices of the profile (unique name)."""
    n = next(_ids)
    if profile_kind == "mig":
        devices = tuple(
            GrantSpec(device=1, milli=142, mig_profile=mig_profile) for _ in range(grants)
        )
    elif profile_kind == "shared":
        devices = (GrantSpec(device=0, milli=250, gpu_memory_mib=5000),)
    else:
        devices = tuple(GrantSpec(device=i, milli=1000) for i in range(grants))
    base: dict[str, Any] = {
        "name": f"qm-{n}-1",
        "namespace": namespace,
        "request_id": n,
        "attempt_id": n,
        "attempt_number": 1,
        "team": namespace,
        "workload_class": "training",
        "priority_class": "quartermaster-training",
        "pool": pool,
        "node": node,
        "image": image,
        "command": ("python", "train.py"),
        "env": (("EPOCHS", "1"),),
        "profile_kind": profile_kind,
        "grants": devices,
        "cpu_milli": 4000,
        "memory_mib": 16384,
        "tolerations": tolerations,
    }
    base.update(kw)
    return LaunchSpec(**base)
