"""Pool shape histories: every submit feeds them, the snapshot carries them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import ShapeHistory
from portal.tick.snapshot import build_snapshot
from scheduling import types as st
from scheduling import workload
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


def weights(pool: str) -> dict[st.Shape, float]:
    row = ShapeHistory.objects.get(pool__name=pool)
    h = workload.ShapeHistory.from_dict(row.histogram)
    return h.weights(h.as_of_ms)


def test_submit_updates_the_pool_history() -> None:
    w = make_world()
    assert not ShapeHistory.objects.exists()
    submit(w.alice, w.vision, count=2, cpu_milli=8000)
    assert weights("a100-train") == {st.Shape(count=2, cpu_milli=8000): pytest.approx(1.0)}
    submit(w.alice, w.vision, count=2, cpu_milli=8000, memory_mib=1024)
    submit(w.bob, w.vision, count=1, cpu_milli=8000)
    assert weights("a100-train") == {
        st.Shape(count=2, cpu_milli=8000): pytest.approx(2.0, rel=1e-4),
        st.Shape(count=1, cpu_milli=8000): pytest.approx(1.0, rel=1e-4),
    }
    assert ShapeHistory.objects.count() == 1


def test_pools_stay_separate() -> None:
    w = make_world()
    submit(w.alice, w.vision, count=4)
    submit(w.alice, w.vision, pool_name="h100-mig", profile_kind="mig", mig_profile="3g.40gb")
    train, mig = weights("a100-train"), weights("h100-mig")
    assert set(train) == {st.Shape(count=4, cpu_milli=1000)}
    (shape,) = mig
    assert shape.kind is st.ProfileKind.MIG and shape.mig_profile == "3g.40gb"
    # recorded as the pool's own requests see it: tolerating its taint
    assert shape.tolerations == (st.Taint("quartermaster.io/inference", "true"),)
    assert not ShapeHistory.objects.filter(pool__name="l4-shared").exists()


def test_any_pool_request_feeds_every_pool_that_could_serve_it() -> None:
    w = make_world()
    submit(w.alice, w.vision, pool=None, profile_kind="shared", milli=500, gpu_memory_mib=10240)
    # only the time-sliced pool offers shared slices
    assert set(ShapeHistory.objects.values_list("pool__name", flat=True)) == {"l4-shared"}
    submit(w.alice, w.vision, pool=None, count=1)
    assert set(ShapeHistory.objects.values_list("pool__name", flat=True)) == {
        "l4-shared",
        "a100-train",
    }


def test_weight_halves_after_one_half_life(monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_world()
    t0 = timezone.now()
    half = timedelta(seconds=st.Policy().shape_half_life_s)
    monkeypatch.setattr(timezone, "now", lambda: t0)
    submit(w.alice, w.vision, count=8)
    monkeypatch.setattr(timezone, "now", lambda: t0 + half)
    submit(w.alice, w.vision, count=1)
    assert weights("a100-train") == {
        st.Shape(count=8, cpu_milli=1000): pytest.approx(0.5),
        st.Shape(count=1, cpu_milli=1000): pytest.approx(1.0),
    }


def test_snapshot_carries_the_histories() -> None:
    w = make_world()
    submit(w.alice, w.vision, count=2)
    submit(w.alice, w.vision, count=2)
    submit(w.alice, w.vision, pool_name="l4-shared", profile_kind="shared", milli=250)
    snap, _ = build_snapshot(timezone.now())
    assert snap.workloads is not None
    by_pool = {p.pool: dict(p.weights) for p in snap.workloads}
    assert set(by_pool) == {"a100-train", "l4-shared"}
    assert by_pool["a100-train"] == {st.Shape(count=2, cpu_milli=1000): pytest.approx(2.0)}
    (shared,) = by_pool["l4-shared"]
    assert shared.kind is st.ProfileKind.SHARED and shared.milli == 250
    # the pool without history falls back to its nodes' prior in the core
    targets = workload.pool_targets(snap.nodes, snap.workloads)
    assert targets["a100-train"] == [(st.Shape(count=2, cpu_milli=1000), workload.TARGET_SCALE)]
    assert {s.mig_profile for s, _ in targets["h100-mig"]} >= {"3g.40gb", "1g.10gb"}
