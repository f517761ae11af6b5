"""The scheduling core: pure Python, no Django, Celery or Kubernetes.

`schedule(snapshot, now_ms, policy)` takes frozen plain data and returns decisions:
the member rules (`scheduling.members`) first, then the pass (`scheduling.cycle`).
"""

from __future__ import annotations

from scheduling import cycle, members
from scheduling.packer import ClusterState
from scheduling.types import Decision, Policy, Snapshot


def schedule(
    snapshot: Snapshot,
    now_ms: int | None = None,
    policy: Policy | None = None,
    state: ClusterState | None = None,
) -> list[Decision]:
    """Return exactly one decision per pending request (plus PREEMPTs). `state`: the
    packer's state kept by a caller that ticks again and again (`cycle.schedule`,
    `scheduling.keeper`)."""
    snapshot, held = members.member_rules(snapshot)
    return cycle.schedule(snapshot, now_ms, policy, state) + held


__all__ = ["schedule"]
