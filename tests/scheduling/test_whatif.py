"""What-if on a small site: the same jobs under current and proposed settings."""

from __future__ import annotations

import pytest

from scheduling.simulate import REPLAY_CLASSES, Job
from scheduling.types import Policy, Quota, Team
from scheduling.whatif import SettingError, Site, apply_settings, compare, replay, summarize
from tests.scheduling.builders import node, pool, shape

HOUR = 3600 * 1000


def _site() -> Site:
    return Site(
        nodes=(node("n1", gpus=8), node("n2", gpus=8)),
        pools=(pool("a100"),),
        classes=REPLAY_CLASSES,
        teams=(Team("a"), Team("b")),
        # b may not borrow: its 8-GPU jobs queue behind each other on its own 8
        quotas=(Quota("a", "a100", 8000, None), Quota("b", "a100", 8000, 0)),
        policy=Policy(),
    )


def _jobs() -> list[Job]:
    # team b: four 8-GPU training jobs of an hour at once; team a: nothing
    return [
        Job(f"b{i}", "b", "training", shape(gpus=8), HOUR, arrival_ms=0, pool="a100")
        for i in range(4)
    ]


def test_a_quota_raise_shortens_the_teams_wait_and_the_output_has_every_figure() -> None:
    site = _site()
    proposed = apply_settings(site, {"quota.b.a100.borrowing": "none"})
    result = compare(site, proposed, _jobs(), start_ms=0, end_ms=4 * HOUR, tick_ms=1000)
    assert set(result) == {"current", "proposed", "teams"}
    now, then = result["current"], result["proposed"]
    # one at a time on its 8 GPUs vs two at a time borrowing a's idle 8
    assert now["wait_max_s"] == 3 * 3600 and then["wait_max_s"] == 3600
    b = result["teams"]["b"]
    assert b["current"]["classes"]["training"]["wait_p95_s"] == 3 * 3600
    assert b["proposed"]["share_pct"] == 100.0 and b["proposed"]["entitlement_pct"] == 50.0
    # the same GPU-time over the window, delivered sooner
    assert then["utilization_pct"] == now["utilization_pct"] == 50.0
    assert then["wait_p50_s"] < now["wait_p50_s"]
    for key in ("wait_p50_s", "preemptions", "gpu_hours_lost", "utilization_pct"):
        assert key in now and key in b["current"]


def test_a_smaller_pool_can_leave_work_rejected_or_waiting() -> None:
    site = apply_settings(_site(), {"pool.a100.nodes": "0"})
    jobs = _jobs()
    out = replay(site, jobs, end_ms=HOUR, tick_ms=1000)
    summary = summarize(site, jobs, out, 0, HOUR)
    assert summary["overall"]["rejected"] + summary["overall"]["never_started"] == 4
    bigger = apply_settings(_site(), {"pool.a100.nodes": "4"})
    assert len(bigger.nodes) == 4 and bigger.nodes[-1].name == "n1-whatif-2"


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("quota.nope.a100", "4", "quota.nope.a100"),
        ("quota.a.a100", "lots", "quota.a.a100"),
        ("class.training.preemption", "sometimes", "class.training.preemption"),
        ("policy.no_such_knob", "1", "policy.no_such_knob"),
        ("policy.preempt_after_s", "soon", "policy.preempt_after_s"),
        ("pool.a100.colour", "red", "pool.a100.colour"),
        ("nonsense", "1", "nonsense"),
    ],
)
def test_a_bad_setting_names_its_key(key: str, value: str, named: str) -> None:
    with pytest.raises(SettingError) as err:
        apply_settings(_site(), {key: value})
    assert err.value.key == named


def test_settings_change_only_what_they_name() -> None:
    site = apply_settings(
        _site(),
        {
            "class.training.band": "150",
            "policy.preempt_after_s": "0",
            "pool.a100.inference_floor": "2",
            "quota.a.a100": "4.5",
        },
    )
    assert {c.name: c.band for c in site.classes}["training"] == 150
    assert site.policy.preempt_after_s == 0 and site.pools[0].inference_floor_milli == 2000
    assert site.quotas[0].nominal_milli == 4500 and site.quotas[1] == _site().quotas[1]


def test_replaying_the_two_sides_in_parallel_gives_the_same_comparison() -> None:
    site = _site()
    proposed = apply_settings(site, {"quota.b.a100.borrowing": "none"})
    seen: list[tuple[int, int]] = []
    kw = {"start_ms": 0, "end_ms": 4 * HOUR, "tick_ms": 1000}
    one_by_one = compare(site, proposed, _jobs(), **kw)  # type: ignore[arg-type]
    together = compare(
        site, proposed, _jobs(), parallel=True, progress=lambda d, t: seen.append((d, t)), **kw
    )  # type: ignore[arg-type]
    assert together == one_by_one
    assert seen[-1] == (1, 1)
