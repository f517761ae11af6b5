"""`schedule()` with a `ClusterState` kept by its caller (the replay keeps one across ticks
instead of rebuilding it from every running attempt): the same decisions as a new one."""

from __future__ import annotations

import pytest

from scheduling.cycle import cluster_state, schedule
from scheduling.types import DecisionKind, Snapshot
from tests.scheduling.builders import node, req, rules, run, snapshot


def _snap(*running_ids: str) -> Snapshot:
    running = {
        "r1": run("r1", team="a", node="n1", devices=(0, 1, 2, 3)),
        "r2": run("r2", team="b", node="n2", devices=(0, 1)),
    }
    return snapshot(
        nodes=[node("n1", gpus=8), node("n2", gpus=4)],
        running=[running[r] for r in running_ids],
        pending=[
            req("p1", team="a", gpus=4, created_s=30),
            req("p2", team="b", gpus=2, created_s=20),
            req("p3", team="c", gpus=4, created_s=10),
        ],
    )


def _free(state: object, names: tuple[str, ...] = ("n1", "n2")) -> list[object]:
    return [state.free_capacity(n) for n in names]  # type: ignore[attr-defined]


def test_a_kept_state_decides_as_a_new_one_and_keeps_the_admissions() -> None:
    snap = _snap("r1", "r2")
    state = cluster_state(snap, rules())
    fresh = schedule(snap, policy=rules())
    kept = schedule(snap, policy=rules(), state=state)
    assert kept == fresh
    admitted = [d.placement for d in kept if d.kind is DecisionKind.ADMIT]
    assert admitted, "the scenario must admit something"
    # the state now holds the running attempts and this tick's admissions, nothing else
    expected = cluster_state(snap, rules())
    for placement in admitted:
        assert placement is not None
        expected.take(placement)
    assert _free(state) == _free(expected)


def test_a_kept_state_that_gave_back_a_stopped_attempt_decides_as_a_new_one() -> None:
    before = _snap("r1", "r2")
    state = cluster_state(before, rules())
    state.give(before.running[0].placement)  # r1 ended between the ticks
    after = _snap("r2")
    assert schedule(after, policy=rules(), state=state) == schedule(after, policy=rules())


def test_a_state_built_for_other_pools_is_refused() -> None:
    state = cluster_state(snapshot(nodes=[node("n1", pool="h100")]), rules())
    with pytest.raises(ValueError, match="state"):
        schedule(_snap("r1"), policy=rules(), state=state)


def test_a_state_with_random_tie_breaks_is_refused() -> None:
    # its draws follow the order its groups were made in, not a new state's
    snap = _snap("r1")
    state = cluster_state(snap, rules(packer="random"))
    with pytest.raises(ValueError, match="random"):
        schedule(snap, policy=rules(packer="random"), state=state)
