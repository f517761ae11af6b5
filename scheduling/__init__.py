"""The scheduling core: pure Python, no Django, Celery or Kubernetes.

`schedule(snapshot, now_ms, policy)` takes frozen plain data and returns decisions:
the member rules (`scheduling.members`) first, then the pass (`scheduling.cycle`).
"""

from __future__ import annotations

from scheduling import cycle, members
from scheduling.types import Decision, Policy, Snapshot


def schedule(
    snapshot: Snapshot, now_ms: int | None = None, policy: Policy | None = None
) -> list[Decision]:
    """Return exactly one decision per pending request (plus PREEMPTs)."""
    snapshot, held = members.member_rules(snapshot)
    return cycle.schedule(snapshot, now_ms, policy) + held


__all__ = ["schedule"]
