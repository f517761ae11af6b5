"""Rollout waves end to end on the simulated cluster (docs/lifecycle.md).

The test world's a100-train pool has four 8-GPU nodes; the simulated burn-in fails
a100-02's NCCL test (tests/world_cluster.yaml). A driver rollout with one canary node and
waves of 50 % runs three waves: [a100-01], [a100-02, a100-03], [a100-04]. It halts after
the second, and the work running on the nodes loses nothing beyond its last checkpoint.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.models import (
    Attempt,
    AuditEvent,
    GpuRequest,
    Node,
    Pool,
    Rollout,
    RolloutNode,
    SimulatedWorkload,
    UsageRecord,
    ValidationRun,
)
from portal.services.checkpoints import attempt_checkpoint_record
from portal.services.nodes import node_return
from portal.services.requests import gpu_request_cancel
from portal.services.rollouts import mig_relayout_start, rollout_start, rollouts_advance
from portal.services.validations import validation_start
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)

TARGET = "550.127.05"


@pytest.fixture
def world(settings: pytest.FixtureRequest) -> World:
    settings.SIMULATED_VALIDATION_SECONDS = 0  # type: ignore[attr-defined]
    return make_world()


def _running(req: GpuRequest, *, ran_s: int) -> Attempt:
    """Make the request's attempt one that has run `ran_s` seconds (past its min runtime)."""
    attempt = Attempt.objects.get(request=req)
    begun = timezone.now() - timedelta(seconds=ran_s)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=Attempt.State.RUNNING, admitted_at=begun, started_at=begun
    )
    UsageRecord.objects.filter(attempt=attempt).update(started_at=begun)
    attempt.refresh_from_db()
    return attempt


def _fill_pool(world: World) -> dict[str, Attempt]:
    """One 8-GPU training run per a100 node: node -> its attempt. The one on a100-01 (the
    canary) and the one on a100-02 checkpoint; the one on a100-03 does not."""
    reqs = [
        submit(
            world.alice if i % 2 == 0 else world.carol,
            world.vision if i % 2 == 0 else world.nlp,
            count=8,
            checkpoint_interval_s=600,
            estimated_runtime_s=36000,
            max_runtime_s=0,
        )
        for i in range(4)
    ]
    run_tick()
    by_node = {}
    for req in reqs:
        attempt = _running(req, ran_s=3600)
        by_node[attempt.nodes[0]] = attempt
    assert sorted(by_node) == ["a100-01", "a100-02", "a100-03", "a100-04"]
    # a100-03's run does not checkpoint: it is waited for, never stopped.
    GpuRequest.objects.filter(pk=by_node["a100-03"].request_id).update(checkpoint_interval_s=0)
    return by_node


def _step(times: int = 1) -> None:
    for _ in range(times):
        rollouts_advance()
        reconcile()


def _members(rollout: Rollout) -> dict[str, str]:
    return {m.node.name: m.step for m in rollout.members.select_related("node")}


def test_a_three_wave_driver_rollout_with_a_failing_node_halts_after_that_wave(
    world: World,
) -> None:
    attempts = _fill_pool(world)
    pool = Pool.objects.get(name="a100-train")
    rollout = rollout_start(
        actor=world.dave,
        pool=pool,
        kind="driver",
        target=TARGET,
        canary_nodes=1,
        wave_percent=50,
        max_failed_nodes=0,
    )
    assert rollout.waves == [["a100-01"], ["a100-02", "a100-03"], ["a100-04"]]
    assert [w["gpu_milli_out"] for w in rollout.impact["waves"]] == [8000, 16000, 8000]
    assert [w["attempts_to_drain"] for w in rollout.impact["waves"]] == [1, 2, 1]
    assert "more than 0 node(s) fail" in rollout.rollback_criteria

    # Canary: cordoned, then drained only once its run has reported a fresh checkpoint.
    _step()
    canary = Node.objects.get(name="a100-01")
    assert canary.cordoned and _members(rollout)["a100-01"] == "draining"
    _step(2)
    assert Attempt.objects.get(pk=attempts["a100-01"].pk).state == Attempt.State.RUNNING
    assert "checkpoint" in RolloutNode.objects.get(rollout=rollout, node=canary).reason
    attempt_checkpoint_record(attempts["a100-01"].pk, timezone.now())
    _step(8)
    assert _members(rollout)["a100-01"] == "returned"
    canary.refresh_from_db()
    assert not canary.cordoned and canary.software["driver"] == TARGET
    assert canary.labels["nvidia.com/gpu-driver-upgrade-state"] == "upgrade-done"
    rollout.refresh_from_db()
    assert rollout.current_wave == 1

    # Wave 1: a100-02's run checkpoints and is stopped; a100-03's does not and is waited for.
    _step(2)
    attempt_checkpoint_record(attempts["a100-02"].pk, timezone.now())
    _step(3)
    assert _members(rollout)["a100-03"] == "draining"
    a3 = Attempt.objects.get(pk=attempts["a100-03"].pk)
    assert a3.state == Attempt.State.RUNNING
    # ...until it finishes on its own.
    SimulatedWorkload.objects.filter(name=a3.workload_name).update(
        ends_at=timezone.now() - timedelta(seconds=1)
    )
    _step(10)
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.HALTED
    assert "halted after wave 1" in rollout.halt_reason
    assert _members(rollout) == {
        "a100-01": "returned",
        "a100-02": "failed",
        "a100-03": "returned",
        "a100-04": "waiting",
    }
    failed = Node.objects.get(name="a100-02")
    assert failed.cordoned and "NCCL all-reduce" in failed.maintenance_reason
    assert not Node.objects.get(name="a100-04").cordoned
    assert Node.objects.get(name="a100-04").software["driver"] == "535.183.01"
    run = ValidationRun.objects.get(node=failed)
    assert run.state == ValidationRun.State.FAILED and run.results["nccl_busbw_gbps"] < 100

    # No running attempt lost work beyond its last checkpoint.
    for node, attempt in attempts.items():
        attempt.refresh_from_db()
        if attempt.state == Attempt.State.PREEMPTED:
            assert attempt.last_checkpoint_at is not None, node
            lost = UsageRecord.objects.get(attempt=attempt).lost_gpu_milli_seconds
            since = (attempt.ended_at - attempt.last_checkpoint_at).total_seconds()
            assert lost <= (since + 1) * attempt.gpus_milli, node
    assert Attempt.objects.get(pk=attempts["a100-01"].pk).state == Attempt.State.PREEMPTED
    assert Attempt.objects.get(pk=attempts["a100-03"].pk).state == Attempt.State.SUCCEEDED
    assert Attempt.objects.get(pk=attempts["a100-04"].pk).state == Attempt.State.RUNNING

    actions = set(
        AuditEvent.objects.filter(object_type="rollout", object_id=str(rollout.pk)).values_list(
            "action", flat=True
        )
    )
    assert actions >= {
        "rollout.start",
        "rollout.cordon",
        "rollout.preempt",
        "rollout.apply",
        "rollout.applied",
        "rollout.return",
        "rollout.wave",
        "rollout.node_failed",
        "rollout.halt",
    }


def test_a_second_rollout_on_the_pool_and_bad_fields_are_refused_naming_the_field(
    world: World,
) -> None:
    pool = Pool.objects.get(name="a100-train")
    with pytest.raises(ValidationError) as exc:
        rollout_start(actor=world.dave, pool=pool, kind="mig-layout", target="all-1g")
    assert "kind" in exc.value.message_dict
    with pytest.raises(ValidationError) as exc:
        rollout_start(actor=world.dave, pool=pool, kind="driver", target="5 5", wave_percent=0)
    assert set(exc.value.message_dict) == {"target", "wave_percent"}
    rollout_start(actor=world.dave, pool=pool, kind="driver", target=TARGET)
    with pytest.raises(ValidationError) as exc:
        rollout_start(actor=world.dave, pool=pool, kind="driver", target=TARGET)
    assert "pool" in exc.value.message_dict
    assert Rollout.objects.count() == 1


def test_a_lone_validation_returns_a_passing_node_and_keeps_a_failing_one_cordoned(
    world: World,
) -> None:
    good, bad = Node.objects.get(name="a100-01"), Node.objects.get(name="a100-02")
    for node in (good, bad):
        validation_start(actor=world.dave, node=node)
    assert Node.objects.get(name="a100-01").cordoned
    rollouts_advance()
    good.refresh_from_db()
    bad.refresh_from_db()
    assert not good.cordoned and good.maintenance_reason == ""
    assert bad.cordoned and bad.maintenance_reason.startswith("validation failed: NCCL")
    with pytest.raises(ValidationError) as exc:
        validation_start(actor=world.dave, node=good, thresholds={"speed": 1})
    assert "thresholds" in exc.value.message_dict
    # A stricter threshold fails the node that passed.
    validation_start(actor=world.dave, node=good, thresholds={"nccl_busbw_gbps": 300})
    rollouts_advance()
    good.refresh_from_db()
    assert good.cordoned and "below 300" in good.maintenance_reason


def test_an_admin_returns_a_node_that_failed_validation_for_good(world: World) -> None:
    bad = Node.objects.get(name="a100-02")
    validation_start(actor=world.dave, node=bad)
    rollouts_advance()
    reconcile()  # the inventory sync sees the cluster's cordon
    bad.refresh_from_db()
    assert bad.cordoned and bad.maintenance_reason
    node_return(actor=world.dave, node=bad)
    reconcile()
    bad.refresh_from_db()
    assert not bad.cordoned and bad.maintenance_reason == ""
    assert AuditEvent.objects.filter(action="node.return", object_id=str(bad.pk)).exists()


def test_the_proposed_mig_layout_rolls_out_and_becomes_the_pools(
    world: World, settings: pytest.FixtureRequest
) -> None:
    pool = Pool.objects.get(name="h100-mig")
    # Learned demand: small inference slices (the requests are gone; their shapes stay).
    for _ in range(6):
        req = submit(
            world.carol,
            world.nlp,
            cls="inference",
            pool_name="h100-mig",
            profile_kind="mig",
            mig_profile="1g.10gb",
        )
        gpu_request_cancel(user=world.carol, gpu_request=req)
    _step(3)
    with pytest.raises(ValidationError) as exc:
        mig_relayout_start(actor=world.dave, pool=pool)
    assert "not open to MIG re-layout" in exc.value.message_dict["pool"][0]
    settings.MIG_RELAYOUT_POOLS = ["h100-mig"]  # type: ignore[attr-defined]
    rollout = mig_relayout_start(actor=world.dave, pool=pool)
    assert rollout.kind == "mig-layout" and rollout.target == "qm-" + "-".join(["1g.10gb"] * 7)
    _step(12)
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.SUCCEEDED, rollout.halt_reason
    pool.refresh_from_db()
    assert pool.mig_layout == ["1g.10gb"] * 7
    node = Node.objects.get(name="h100-01")
    assert node.labels["nvidia.com/mig.config"] == rollout.target
    assert [m["profile"] for m in node.devices.first().mig_instances] == ["1g.10gb"] * 7
    assert AuditEvent.objects.filter(action="pool.update", object_id=str(pool.pk)).exists()
