"""Member rules: who may hold what in a team, applied before the queue is ordered.

1. A request whose submitter is no longer a member of its team is rejected
   (`not-a-member`); the portal cancels it.
2. A request that would take its submitter past their cap in the team waits
   (`member-cap`), oldest first; requests kept count as held, since the pass may
   admit all of them, so a cap is never exceeded.

A snapshot without `members` (None) has no member rules, and a request without a
`user` is not subject to them.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from scheduling.types import Decision, DecisionKind, PendingRequest, Snapshot

NOT_A_MEMBER = "cancelled: the submitter is no longer a member of the team"


def member_rules(snapshot: Snapshot) -> tuple[Snapshot, list[Decision]]:
    """Return the snapshot with the requests the pass may schedule, and decisions for the rest."""
    if snapshot.members is None:
        return snapshot, []
    members = {(m.team, m.user): m for m in snapshot.members}
    holding: dict[tuple[str, str], int] = defaultdict(int)
    for r in snapshot.running:
        if r.user:
            holding[(r.team, r.user)] += r.shape.gpus_milli
    keep: list[PendingRequest] = []
    held: list[Decision] = []
    for p in snapshot.pending:
        if not p.user:
            keep.append(p)
            continue
        key = (p.team, p.user)
        member = members.get(key)
        if member is None:
            held.append(Decision(DecisionKind.REJECT, p.id, "not-a-member", NOT_A_MEMBER))
            continue
        need = p.shape.gpus_milli
        cap = member.cap_milli
        if cap is not None and holding[key] + need > cap:
            message = (
                f"waiting: your cap in team {p.team} is {cap / 1000:g} GPUs "
                f"and you hold {holding[key] / 1000:g}; this request needs {need / 1000:g} more"
            )
            held.append(
                Decision(
                    DecisionKind.WAIT,
                    p.id,
                    "member-cap",
                    message,
                    facts={"cap_milli": cap, "holding_milli": holding[key]},
                )
            )
            continue
        holding[key] += need
        keep.append(p)
    if not held:
        return snapshot, []
    return dataclasses.replace(snapshot, pending=tuple(keep)), held
