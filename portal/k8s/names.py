"""Names Quartermaster uses on Kubernetes objects (NVIDIA's labels and resource names verbatim), its errors and small parsers."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from kubernetes.utils import parse_quantity

from portal.backends.base import LaunchRefused as _LaunchRefused

_T = TypeVar("_T")

GPU = "nvidia.com/gpu"
GPU_SHARED = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
#: HAMi's extended resources (its default names): device memory in MiB, percent of the SMs
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"

LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_SHARING = "nvidia.com/gpu.sharing-strategy"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_MIG_STATE = "nvidia.com/mig.config.state"
LABEL_GPU_PRESENT = "nvidia.com/gpu.present"
LABEL_WORKLOAD_CONFIG = "nvidia.com/gpu.workload.config"
LABEL_HOSTNAME = "kubernetes.io/hostname"
#: fallback pool label when no pool selectors are configured
LABEL_POOL = "quartermaster.io/pool"
LABEL_INTERCONNECT = "quartermaster.io/interconnect"

# Labels on every Job and pod Quartermaster creates.
MANAGED_BY = "quartermaster"
L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_PART_OF = "app.kubernetes.io/part-of"
L_MANAGED_BY = "app.kubernetes.io/managed-by"
L_REQUEST = "quartermaster.io/request-id"
L_ATTEMPT_ID = "quartermaster.io/attempt-id"
L_ATTEMPT = "quartermaster.io/attempt"
L_TEAM = "quartermaster.io/team"
L_CLASS = "quartermaster.io/class"
L_POOL = "quartermaster.io/pool"
#: on every Job and pod of a gang: the attempt's name (the headless Service selects on it)
L_GANG = "quartermaster.io/gang"
L_RANK = "quartermaster.io/rank"
A_NODE = "quartermaster.io/node"
A_GRANTS = "quartermaster.io/grants"
MANAGED_SELECTOR = f"{L_MANAGED_BY}={MANAGED_BY}"
#: the pods that hold capacity (non-terminal), for the inventory's list and watch
ACTIVE_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"

MAIN_CONTAINER = "main"
READY_CONTAINER = "wait-for-device"
#: exit codes of the readiness init container (see READY_SCRIPT)
READY_EXIT_BUSY = 75
READY_EXIT_REFUSED = 76

TERMINAL_PHASES = ("Succeeded", "Failed")

# --- Errors ------------------------------------------------------------------------


# The backend-neutral refusal; re-exported here because the adapter raises it.
LaunchRefused = _LaunchRefused


class JobConflict(RuntimeError):
    """A Job with the deterministic name exists but belongs to another attempt."""


# --- Small helpers -----------------------------------------------------------------


def to_int(value: Any, default: int = 0) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def quantity(value: Any) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "16Gi", "8"); garbage counts as zero."""
    try:
        return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError):
        return Decimal(0)


_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def label_value(value: object) -> str:
    """Return `value` made into a valid label value (≤ 63 chars, alphanumeric ends)."""
    text = _LABEL_VALUE_BAD.sub("-", str(value))[:63]
    return text.strip("-_.")


def now_utc() -> datetime:
    return datetime.now(UTC)


def age_s(ts: datetime | None, now: datetime) -> float:
    if ts is None:
        return 0.0
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (now - ts).total_seconds()


def mig_resource(profile: str) -> str:
    """The extended resource of a MIG profile under the `mixed` strategy.

    The device plugin replaces `+` with `.`, since a resource name cannot hold a `+`:
    profile `1g.10gb+me` is advertised as `nvidia.com/mig-1g.10gb.me` (the device plugin's mixed MIG strategy).
    """
    return MIG_PREFIX + profile.replace("+", ".")


_MIG_NAME = re.compile(r"^(\d+g\.\d+gb(?:-me)?)(?:\.(.+))?$")


def mig_profile_of(resource: str) -> str | None:
    """The MIG profile of a `mixed` resource name, or None when it is not one Quartermaster
    packs: `nvidia.com/mig-1g.10gb.me` -> `1g.10gb+me`; a time-shared instance
    (`nvidia.com/mig-1g.10gb.shared`, renameByDefault) -> None."""
    if not resource.startswith(MIG_PREFIX) or resource.endswith(".shared"):
        return None
    match = _MIG_NAME.match(resource.removeprefix(MIG_PREFIX))
    if match is None:
        return None
    core, extra = match.groups()
    return f"{core}+{extra}" if extra else core


def built(value: _T | None) -> _T:
    """A field of an object the portal built itself, so always set: the Kubernetes client
    types every field of its models as optional."""
    assert value is not None
    return value
