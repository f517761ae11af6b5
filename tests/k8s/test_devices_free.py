"""`devices_free(report, grants)`: no start on a busy device (FI-15)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from portal import node_agent
from portal.backends.base import GrantSpec
from portal.lib.readiness import devices_free
from tests.fakes.fake_pynvml import standard_node

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def report(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    fake = standard_node()
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    return node_agent.NodeAgent(node_agent.load_nvml(), "gpu-a", clock=lambda: NOW).report()


def whole(i: int) -> GrantSpec:
    return GrantSpec(device=i, milli=1000)


def test_an_idle_healthy_device_is_free(report: dict[str, Any]) -> None:
    assert devices_free(report, [whole(0)], now=NOW) == (True, "")


def test_a_stray_process_makes_the_device_busy(report: dict[str, Any]) -> None:
    ok, why = devices_free(report, [whole(0), whole(2)], now=NOW)
    assert not ok and "device 2 is busy: pid 4242 holds 20480 MiB" in why


def test_memory_held_by_no_visible_process_is_busy(report: dict[str, Any]) -> None:
    report["devices"][0]["memory_used_mib"] = 4096
    ok, why = devices_free(report, [whole(0)], now=NOW)
    assert not ok and "4096 MiB" in why


def test_an_nvml_error_makes_the_device_unavailable(report: dict[str, Any]) -> None:
    ok, why = devices_free(report, [whole(3)], now=NOW)
    assert not ok and "unhealthy" in why and "GPU is lost" in why


def test_critical_xid_blocks_and_application_xid_does_not(report: dict[str, Any]) -> None:
    """FI-15: Xid 79 on the device -> not free (and not packed); Xid 13 -> no quarantine."""
    report["devices"][0]["xids"] = [{"xid": 13, "critical": False, "at": "x"}]
    assert devices_free(report, [whole(0)], now=NOW)[0]
    report["devices"][0]["xids"].append({"xid": 79, "critical": True, "at": "x"})
    ok, why = devices_free(report, [whole(0)], now=NOW)
    assert not ok and "Xid 79" in why


def test_mig_instances_are_checked_one_by_one(report: dict[str, Any]) -> None:
    free = GrantSpec(device=1, milli=285, mig_profile="2g.20gb", mig_start=2)
    busy = GrantSpec(device=1, milli=428, mig_profile="3g.40gb", mig_start=4)
    absent = GrantSpec(device=1, milli=428, mig_profile="3g.40gb", mig_start=0)
    assert devices_free(report, [free], now=NOW) == (True, "")
    ok, why = devices_free(report, [busy], now=NOW)
    assert not ok and "pid 777" in why
    ok, why = devices_free(report, [absent], now=NOW)
    assert not ok and "does not exist" in why


def test_a_shared_slice_needs_room_not_an_empty_device(report: dict[str, Any]) -> None:
    fits = GrantSpec(device=2, milli=250, gpu_memory_mib=40960)
    too_big = GrantSpec(device=2, milli=250, gpu_memory_mib=70000)
    assert devices_free(report, [fits], now=NOW) == (True, "")
    ok, why = devices_free(report, [too_big], now=NOW)
    assert not ok and "61440 MiB free" in why


def test_devices_are_found_by_uuid_when_the_pod_says_which(report: dict[str, Any]) -> None:
    """The readiness init container passes NVIDIA_VISIBLE_DEVICES: the device plugin's choice wins."""
    grants = [whole(0)]
    assert devices_free(report, grants, now=NOW, uuids=["GPU-0000"]) == (True, "")
    assert not devices_free(report, grants, now=NOW, uuids=["GPU-2222"])[0]
    assert devices_free(report, grants, now=NOW, uuids=["MIG-2a"]) == (True, "")
    assert not devices_free(report, grants, now=NOW, uuids=["MIG-3a"])[0]
    assert (
        "not in the node agent report" in devices_free(report, grants, now=NOW, uuids=["GPU-9"])[1]
    )


def test_no_or_stale_report_is_not_free(report: dict[str, Any]) -> None:
    """FI-20 (admission side): a stale heartbeat means nothing is known to be free."""
    assert devices_free(None, [whole(0)]) == (False, "no node agent report for this node")
    assert devices_free(report, [whole(0)], now=NOW + timedelta(seconds=119), stale_after_s=120)[0]
    ok, why = devices_free(report, [whole(0)], now=NOW + timedelta(seconds=121), stale_after_s=120)
    assert not ok and "stale" in why
    assert not devices_free(report, [whole(9)], now=NOW)[0]
