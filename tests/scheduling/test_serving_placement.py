"""Serving replicas ask for the `spread` policy on their own shape (`Shape.placement`)."""

from __future__ import annotations

import dataclasses

from scheduling.cycle import schedule
from scheduling.packer import ClusterState
from scheduling.types import DecisionKind, Shape
from scheduling.workload import shape_key
from tests.scheduling.builders import node, pool, quota, req, rules, run, snapshot


def test_a_spread_shape_spreads_where_the_state_packs() -> None:
    nodes = [node("a", 4), node("b", 4), node("c", 4)]
    for placement, want in (("", ("a", "b")), ("spread", ("b", "c"))):
        state = ClusterState(nodes, "bestfit")
        first = state.find(Shape(count=1, cpu_milli=1000))
        assert first is not None and first.nodes == ("a",)
        state.take(first)
        replicas = state.find(Shape(count=1, pods=2, placement=placement))
        assert replicas is not None and replicas.nodes == want, placement


def test_the_shape_history_ignores_the_placement() -> None:
    s = Shape(count=1, pods=3, placement="spread")
    assert shape_key(s) == Shape(count=1)


def test_serving_replicas_spread_in_the_tick_and_use_the_inference_floor() -> None:
    nodes = [node("n1", gpus=4), node("n2", gpus=4), node("n3", gpus=4)]
    busy = run("t0", node="n1", devices=(0,))
    serving = req("s1", gpus=1, pods=2, cls="inference")
    serving = dataclasses.replace(
        serving, shape=dataclasses.replace(serving.shape, placement="spread")
    )
    # The floor holds 8 of 12 GPUs for inference: training cannot take them unpreemptibly,
    # the serving replicas can.
    decisions = schedule(
        snapshot(
            nodes,
            pending=[serving],
            running=[busy],
            pools=[pool(floor=8)],
            quotas=[quota("a", 12)],
        ),
        policy=rules(packer="bestfit"),
    )
    admit = [d for d in decisions if d.request_id == "s1"]
    assert admit and admit[0].kind is DecisionKind.ADMIT
    assert admit[0].placement is not None
    assert sorted(admit[0].placement.nodes) == ["n2", "n3"]
