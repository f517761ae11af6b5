"""Nodes joining a pool serve only after a burn-in; the canary pool leads every rollout; the
GPU Operator's upgrade states read (docs/lifecycle.md). The real control plane's twin is
tests/cluster/test_gpu_operator.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.backends import get_backend
from portal.lib import lifecycle
from portal.models import Node, Pool, ValidationRun
from portal.services.nodes import inventory_sync
from portal.services.rollouts import rollout_plan, rollout_start, rollouts_advance
from tests.base import World, make_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(settings: pytest.FixtureRequest) -> World:
    settings.SIMULATED_VALIDATION_SECONDS = 0  # type: ignore[attr-defined]
    return make_world()


def _joining(name: str, *, ready: bool = True) -> list:
    inv = get_backend().inventory()
    [a100] = [n for n in inv if n.name == "a100-01"]
    return [*inv, replace(a100, name=name, ready=ready)]


def test_a_new_node_stays_cordoned_until_its_burn_in_passes(world: World) -> None:
    inventory_sync(nodes=_joining("a100-09"))
    node = Node.objects.get(name="a100-09")
    assert node.cordoned
    assert node.maintenance_reason == "burn-in before serving: new in pool a100-train"
    # The pool's first nodes were adopted as they were.
    assert not Node.objects.exclude(name="a100-09").filter(cordoned=True).exists()
    assert rollouts_advance()["burn_ins"] == 1  # the beat starts its burn-in
    [run] = ValidationRun.objects.filter(node=node)
    assert run.state == "running" and run.cordoned_it
    assert rollouts_advance()["burn_ins"] == 0  # one at a time
    # The simulated burn-in has passed meanwhile (a100-09 has no failure listed).
    run.refresh_from_db()
    node.refresh_from_db()
    assert run.state == "passed"
    assert not node.cordoned and node.maintenance_reason == ""


def test_a_pool_may_let_nodes_join_without_a_burn_in(world: World) -> None:
    Pool.objects.filter(name="a100-train").update(burn_in_new_nodes=False)
    inventory_sync(nodes=_joining("a100-09"))
    assert not Node.objects.get(name="a100-09").cordoned
    assert not ValidationRun.objects.exists()


def test_a_node_back_after_a_long_absence_is_burnt_in_again(world: World, settings) -> None:
    settings.BURN_IN_RETURN_AFTER_SECONDS = 600
    inv = get_backend().inventory()
    down = [replace(n, ready=False) if n.name == "a100-02" else n for n in inv]
    inventory_sync(nodes=down)
    node = Node.objects.get(name="a100-02")
    assert node.not_ready_since is not None and not node.ready
    # A short blip is no return: nothing to burn in.
    inventory_sync(nodes=inv)
    assert not Node.objects.get(name="a100-02").cordoned
    inventory_sync(nodes=down)
    Node.objects.filter(name="a100-02").update(
        not_ready_since=timezone.now() - timedelta(seconds=601)
    )
    inventory_sync(nodes=inv)
    node.refresh_from_db()
    assert node.cordoned and node.not_ready_since is None
    assert "back in pool a100-train after" in node.maintenance_reason
    rollouts_advance()
    assert ValidationRun.objects.filter(node=node, state="running").count() == 1


def test_the_canary_pool_is_the_first_wave_of_every_rollout(world: World) -> None:
    Pool.objects.filter(name="l4-shared").update(lifecycle=Pool.Lifecycle.CANARY)
    pool = Pool.objects.get(name="a100-train")
    waves, impact = rollout_plan(pool, canary_nodes=1, wave_percent=50, kind="driver")
    assert waves == [["l4-01", "l4-02", "l4-03"], ["a100-01"], ["a100-02", "a100-03"], ["a100-04"]]
    assert impact[0]["canary_pool"] and impact[0]["canary"]
    assert not impact[1]["canary_pool"]
    # A MIG re-layout is the pool's own geometry: no canary pool before it.
    mig = Pool.objects.get(name="h100-mig")
    waves, _ = rollout_plan(mig, canary_nodes=1, wave_percent=100, kind="mig-layout")
    assert waves == [["h100-01"], ["h100-02"]]
    # The canary pool's nodes are in one running rollout at a time.
    rollout_start(actor=world.dave, pool=pool, kind="driver", target="550.127.05")
    with pytest.raises(ValidationError) as exc:
        rollout_start(
            actor=world.dave, pool=Pool.objects.get(name="h100-mig"), kind="driver", target="x"
        )
    assert "l4-01 is in a running rollout" in str(exc.value)


@pytest.mark.parametrize(
    ("labels", "where"),
    [
        ({}, "waiting"),
        ({lifecycle.DRIVER_UPGRADE_STATE: "drain-required"}, "waiting"),
        # upgrade-done left from the last upgrade: this one has not begun
        (
            {lifecycle.DRIVER_UPGRADE_STATE: "upgrade-done", lifecycle.DRIVER_FULL: "550.1"},
            "waiting",
        ),
        (
            {lifecycle.DRIVER_UPGRADE_STATE: "upgrade-done", lifecycle.DRIVER_FULL: "570.124.06"},
            "done",
        ),
        ({lifecycle.DRIVER_UPGRADE_STATE: "upgrade-failed"}, "failed"),
    ],
)
def test_the_operators_upgrade_state_is_read_with_the_driver_version(
    labels: dict[str, str], where: str
) -> None:
    assert lifecycle.driver_upgrade(labels, "570.124.06")[0] == where


def test_a_device_plugin_through_the_operator_waits_for_the_nodes_plugin_version() -> None:
    for api in lifecycle.OPERATOR_APIS:
        change = lifecycle.change_for("device-plugin", "v0.17.1", api, "ignored")
        # No config label and no NVIDIADriver wave label: the version is the ClusterPolicy's.
        assert change.labels == {lifecycle.ROLLOUT_TARGET: "v0.17.1"}
        assert (change.converged_label, change.converged_value) == (
            lifecycle.DEVICE_PLUGIN_VERSION,
            "v0.17.1",
        )
    by_labels = lifecycle.change_for("device-plugin", "mps-4", "labels")
    assert by_labels.labels == {lifecycle.DEVICE_PLUGIN_CONFIG: "mps-4"}


def test_the_dcgm_level_is_a_threshold_of_one_to_four() -> None:
    assert lifecycle.thresholds_check({"dcgm_diag_level": 3})["dcgm_diag_level"] == 3.0
    with pytest.raises(ValueError, match="1, 2, 3 or 4"):
        lifecycle.thresholds_check({"dcgm_diag_level": 5})
    # The default images run no model warm-up: its absence is no failure.
    ok, _ = lifecycle.verdict(
        {"devices_visible": 8, "nccl_busbw_gbps": 200, "dcgm_diag": "pass"},
        {"nccl_busbw_gbps": 100},
        8,
    )
    assert ok
    ok, why = lifecycle.verdict(
        {"devices_visible": 8, "nccl_busbw_gbps": 200, "dcgm_diag": "fail: pcie"},
        {"dcgm_diag_level": 2},
        8,
    )
    assert not ok and why == "DCGM diagnostics level 2: fail: pcie"


def test_an_autoscaled_pools_added_nodes_are_not_held_out(world: World) -> None:
    Pool.objects.filter(name="a100-train").update(autoscaled=True, max_nodes=8)
    inventory_sync(nodes=_joining("a100-09"))
    assert not Node.objects.get(name="a100-09").cordoned
