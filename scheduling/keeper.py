"""The packer's state kept from tick to tick for a caller that reads each snapshot anew.

A tick starts from its nodes with every running attempt taken (`cycle.cluster_state`):
at 50,000 GPUs and 67,000 running attempts that is a quarter of a quiet tick's work,
and from one tick to the next little of it changes. `StateKeeper.schedule` keeps the
state the last tick left (its admissions taken) and brings it to the new snapshot: what
no longer runs is given back, what runs anew is taken, and an admission that now runs
under its attempt's id keeps its place. Any change to the nodes themselves (a device's
health, a cordon, a node added or gone), another packer, or a tick that failed half way
builds the state anew, as does a tick that finds the keeper busy in another thread.
The decisions are those of a state built anew (`tests/scheduling/test_keeper.py`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import scheduling
from scheduling import cycle
from scheduling.packer import ClusterState
from scheduling.types import Decision, DecisionKind, Node, Placement, Policy, Snapshot


@dataclass
class _Kept:
    nodes: tuple[Node, ...]
    packer: str
    state: ClusterState
    #: what the state holds taken: running attempts by attempt id, and the last tick's
    #: admissions by "+" and their request id
    taken: dict[str, Placement]


class StateKeeper:
    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self._lock = threading.Lock()

    def schedule(
        self, snapshot: Snapshot, now_ms: int | None = None, policy: Policy | None = None
    ) -> list[Decision]:
        """`scheduling.schedule`, from the state the last tick left where it still
        applies."""
        policy = policy or Policy()
        if not self._lock.acquire(blocking=False):
            return scheduling.schedule(snapshot, now_ms, policy)
        try:
            # A tick that fails half way leaves its state behind it.
            kept, self._kept = self._kept, None
            if policy.packer == "random":
                # its draws follow the order a state made its groups in (`ClusterState.retarget`)
                return scheduling.schedule(snapshot, now_ms, policy)
            if kept is None or kept.packer != policy.packer or kept.nodes != snapshot.nodes:
                state = cycle.cluster_state(snapshot, policy)
                taken = {r.attempt_id: r.placement for r in snapshot.running}
            else:
                state, taken = kept.state, kept.taken
                _bring(state, taken, snapshot)
            decisions = scheduling.schedule(snapshot, now_ms, policy, state)
            for d in decisions:
                if d.kind is DecisionKind.ADMIT and d.placement is not None:
                    taken["+" + d.request_id] = d.placement
            self._kept = _Kept(snapshot.nodes, policy.packer, state, taken)
            return decisions
        finally:
            self._lock.release()


def _bring(state: ClusterState, taken: dict[str, Placement], snapshot: Snapshot) -> None:
    """Make `state` hold exactly the snapshot's running attempts, `taken` say so."""
    now = {r.attempt_id: r for r in snapshot.running}
    admitted: dict[str, Placement] = {}
    for key in [k for k in taken if k not in now]:
        placement = taken.pop(key)
        if key[0] == "+":
            admitted[key[1:]] = placement
        else:
            state.give(placement)
    for attempt_id, run in now.items():
        had = taken.get(attempt_id)
        if had is None:
            had = admitted.pop(run.request_id, None)
        elif had is run.placement or had == run.placement:
            continue
        if had is None or had != run.placement:
            if had is not None:
                state.give(had)
            state.take(run.placement)
        taken[attempt_id] = run.placement
    for placement in admitted.values():
        state.give(placement)
