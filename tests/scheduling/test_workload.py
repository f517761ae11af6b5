"""The shape history behind FGD's target workload (`scheduling.workload`)."""

from __future__ import annotations

import json

import pytest

from scheduling import workload
from scheduling.cycle import schedule
from scheduling.packer import ClusterState
from scheduling.types import (
    Device,
    Node,
    Partitioning,
    PendingRequest,
    PoolWorkload,
    ProfileKind,
    Shape,
    Snapshot,
    Taint,
)
from tests.scheduling.builders import CLASSES, NOW, S, node, pool

HOUR = 3600
ONE = Shape(count=1, cpu_milli=4000)
HALF = Shape(kind=ProfileKind.SHARED, milli=500, cpu_milli=2000)


def test_weight_halves_after_one_half_life() -> None:
    h = workload.ShapeHistory(half_life_s=HOUR)
    h.observe(ONE, NOW)
    assert h.weights(NOW)[workload.shape_key(ONE)] == pytest.approx(1.0)
    assert h.weights(NOW + HOUR * S)[workload.shape_key(ONE)] == pytest.approx(0.5)
    assert h.weights(NOW + 3 * HOUR * S)[workload.shape_key(ONE)] == pytest.approx(0.125)


def test_recent_shapes_outweigh_old_ones() -> None:
    h = workload.ShapeHistory(half_life_s=HOUR)
    for _ in range(3):
        h.observe(ONE, NOW)
    for _ in range(2):
        h.observe(HALF, NOW + 2 * HOUR * S)
    w = h.weights(NOW + 2 * HOUR * S)
    assert w[workload.shape_key(ONE)] == pytest.approx(0.75)
    assert w[workload.shape_key(HALF)] == pytest.approx(2.0)
    target = workload.target_workload(w, coverage_pct=100)
    assert [s for s, _ in target] == [workload.shape_key(HALF), workload.shape_key(ONE)]


def test_late_observation_is_decayed_to_now() -> None:
    a = workload.ShapeHistory(half_life_s=HOUR)
    a.observe(ONE, NOW)
    a.observe(HALF, NOW + HOUR * S)
    b = workload.ShapeHistory(half_life_s=HOUR)
    b.observe(HALF, NOW + HOUR * S)
    b.observe(ONE, NOW)  # arrives late: counts as decayed by one half-life
    assert a.weights(NOW + HOUR * S) == pytest.approx(b.weights(NOW + HOUR * S))


def test_key_is_one_pod_without_host_memory() -> None:
    gang = Shape(count=8, cpu_milli=1000, memory_mib=4096, pods=4)
    assert workload.shape_key(gang) == Shape(count=8, cpu_milli=1000)


def test_json_round_trip() -> None:
    tol = (Taint("gpu", "a100"),)
    h = workload.ShapeHistory(half_life_s=HOUR)
    h.observe(ONE, NOW)
    h.observe(Shape(kind=ProfileKind.MIG, mig_profile="3g.40gb", tolerations=tol), NOW)
    h.observe(Shape(count=2, gpu_models=frozenset({"V100", "A100"})), NOW + S)
    data = json.loads(json.dumps(h.to_dict()))
    back = workload.ShapeHistory.from_dict(data)
    assert back.half_life_s == HOUR and back.as_of_ms == NOW + S
    assert back.weights(NOW + S) == pytest.approx(h.weights(NOW + S))
    assert workload.ShapeHistory.from_dict(data, half_life_s=60).half_life_s == 60


def test_keeps_at_most_max_shapes() -> None:
    h = workload.ShapeHistory(half_life_s=HOUR)
    for i in range(workload.MAX_SHAPES + 5):
        h.observe(Shape(cpu_milli=i + 1), NOW)
    h.observe(ONE, NOW)
    h.observe(ONE, NOW)
    assert len(h.counts) == workload.MAX_SHAPES
    assert h.counts[workload.shape_key(ONE)] == pytest.approx(2.0)


def test_prior_offers_whole_mig_and_shared_shapes() -> None:
    taint = Taint("dedicated", "ml")
    nodes = [
        Node(
            "mig-0",
            "p",
            64_000,
            256_000,
            tuple(Device(i, "A100-SXM4-40GB", 40_960, Partitioning.MIG) for i in range(2)),
            taints=(taint,),
        ),
        Node(
            "ts-0",
            "p",
            64_000,
            256_000,
            tuple(Device(i, "T4", 16_384, Partitioning.TIME_SLICING, 4) for i in range(4)),
        ),
        Node("cpu-0", "p", 64_000, 256_000, ()),
    ]
    p = workload.prior(nodes)
    assert sum(p.values()) == pytest.approx(workload.PRIOR_WEIGHT)
    shapes = set(p)
    assert Shape(kind=ProfileKind.MIG, mig_profile="3g.20gb", tolerations=(taint,)) in shapes
    assert Shape(kind=ProfileKind.MIG, mig_profile="7g.40gb", tolerations=(taint,)) in shapes
    assert Shape(count=4) in shapes and Shape(count=8) not in shapes
    assert Shape(kind=ProfileKind.SHARED, milli=250) in shapes
    assert Shape(count=0) in shapes


def test_prior_of_uncordoned_nodes_only() -> None:
    busy = node("n1", gpus=8, cordoned=True)
    assert workload.prior([busy]) == {}


def test_target_covers_95_percent_with_integer_weights() -> None:
    weights = {Shape(cpu_milli=i + 1): float(w) for i, w in enumerate([60, 30, 6, 3, 1])}
    target = workload.target_workload(weights)
    assert [w for _, w in target] == [6000, 3000, 600]
    assert workload.target_workload({}) == []


def test_pool_targets_use_history_else_prior() -> None:
    nodes = [node("a1", gpus=8, pool="a"), node("b1", gpus=2, pool="b")]
    hist = PoolWorkload("a", ((HALF, 3.0),))
    targets = workload.pool_targets(nodes, (hist,))
    assert targets["a"] == [(HALF, workload.TARGET_SCALE)]
    assert {s.count for s, _ in targets["b"]} == {1, 2}


def test_schedule_takes_the_target_from_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packer gets the pools' histories, not the tick's one request."""
    seen: list[object] = []
    real = ClusterState.__init__

    def spy(self: ClusterState, *args: object, **kw: object) -> None:
        seen.append(kw.get("pool_shape_weights"))
        real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ClusterState, "__init__", spy)
    snap = Snapshot(
        now_ms=NOW,
        pools=(pool("a"), pool("b")),
        nodes=(node("a1", gpus=8, pool="a"), node("b1", gpus=8, pool="b")),
        pending=(PendingRequest("r1", "t", "training", ONE, NOW, pool="a"),),
        classes=CLASSES,
        workloads=(PoolWorkload("a", ((HALF, 5.0),)),),
    )
    schedule(snap)
    assert seen == [
        {
            "a": [(HALF, workload.TARGET_SCALE)],
            "b": workload.target_workload(workload.prior([node("b1", gpus=8, pool="b")])),
        }
    ]


def test_pool_targets_change_fgd_placement() -> None:
    """Per-pool targets: a node is scored by its own pool's target workload."""
    ts = Partitioning.TIME_SLICING
    nodes = [
        node("a1", gpus=2, pool="a", partitioning=ts),
        node("a2", gpus=4, pool="a", partitioning=ts),
    ]
    half = Shape(kind=ProfileKind.SHARED, milli=500)

    def where(**kw: object) -> tuple[str, ...]:
        placed = ClusterState(nodes, **kw).find(half)  # type: ignore[arg-type]
        assert placed is not None
        return placed.nodes

    # pool a sees 4-GPU requests: keep the 4-GPU node whole
    assert where(pool_shape_weights={"a": [(Shape(count=4), 10)]}) == ("a1",)
    # pool a sees 2-GPU requests: a1 would lose its only pair, a2 keeps one
    assert where(pool_shape_weights={"a": [(Shape(count=2), 10)]}) == ("a2",)
    # another pool's target does not apply to pool a; the default one does
    assert where(
        pool_shape_weights={"b": [(Shape(count=4), 10)]}, shape_weights=[(Shape(count=2), 1)]
    ) == ("a2",)
