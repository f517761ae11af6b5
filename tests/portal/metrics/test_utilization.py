"""Utilization samples, rollups, bounded retention, history pages as SVG, and
the node agent's readings exported."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client, override_settings

from portal.lib import charts
from portal.models import Device, Node, Pool, UtilizationRollup, UtilizationSample
from portal.services import utilization
from portal.tick.run import run_tick
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def _minutes(n: int, util_of: dict[int, int], start: datetime = T0) -> None:
    for m in range(n):
        for pk, u in util_of.items():
            Device.objects.filter(pk=pk).update(utilization_pct=u, memory_used_mib=1000)
        utilization.record_samples(start + timedelta(minutes=m, seconds=5))


def test_samples_fold_into_rollups_per_node_pool_and_team() -> None:
    w = make_world()
    submit(w.bob, w.vision, count=2)
    run_tick()
    pool = Pool.objects.get(name="a100-train")
    devices = list(Device.objects.filter(node__pool=pool).order_by("node__name", "index"))
    held = {d.pk for d in devices if d.allocations.filter(active=True).exists()}
    assert len(held) == 2
    util = {d.pk: (90 if d.pk in held else 0) for d in Device.objects.all()}
    _minutes(65, util)
    # a second call within the same minute stores nothing more
    assert utilization.record_samples(T0 + timedelta(minutes=64, seconds=30)) == 0
    assert utilization.rollup(T0 + timedelta(minutes=65)) > 0
    team = UtilizationRollup.objects.get(scope="team", key="vision", resolution_s=3600, start=T0)
    assert team.utilization_avg == pytest.approx(90) and team.samples == 2 * 60
    pool_h = UtilizationRollup.objects.get(scope="pool", key=pool.name, resolution_s=3600, start=T0)
    assert pool_h.utilization_avg == pytest.approx(90 * 2 / len(devices))
    assert pool_h.utilization_max == 90
    fives = UtilizationRollup.objects.filter(scope="pool", key=pool.name, resolution_s=300)
    assert fives.count() == 13  # 10:00 … 11:00, the bucket of 11:00-11:05 not yet over
    # rolling up again writes nothing new; the next finished bucket is added
    assert utilization.rollup(T0 + timedelta(minutes=65)) == 0
    points = utilization.history("pool", pool.name, "24h", now=T0 + timedelta(minutes=65))
    assert len(points) == 13 and points[0][1] == pytest.approx(pool_h.utilization_avg)


@override_settings(UTILIZATION_RAW_HOURS=1, UTILIZATION_5M_DAYS=1, UTILIZATION_1H_DAYS=2)
def test_retention_is_bounded() -> None:
    make_world()
    one = Device.objects.order_by("pk").first()
    assert one is not None
    _minutes(3, {one.pk: 50})
    utilization.rollup(T0 + timedelta(hours=1))
    assert UtilizationSample.objects.exists()
    later = T0 + timedelta(days=1, hours=1)
    utilization.prune(later)
    assert not UtilizationSample.objects.exists()
    assert not UtilizationRollup.objects.filter(resolution_s=300).exists()
    assert UtilizationRollup.objects.filter(resolution_s=3600).exists()
    utilization.prune(T0 + timedelta(days=2, hours=1))
    assert not UtilizationRollup.objects.exists()


def test_simulated_readings_follow_what_runs() -> None:
    w = make_world()
    submit(w.bob, w.vision, count=1)
    run_tick()
    utilization.simulate_device_load(T0)
    busy = Device.objects.filter(allocations__active=True).get()
    assert 50 <= busy.utilization_pct <= 100
    assert not Device.objects.exclude(pk=busy.pk).filter(utilization_pct__gt=0).exists()


def test_history_pages_render_svg_and_check_access() -> None:
    w = make_world()
    pool = Pool.objects.get(name="a100-train")
    node = Node.objects.filter(pool=pool).first()
    assert node is not None
    now = datetime.now(tz=UTC).replace(second=0, microsecond=0)
    for scope, key in (("pool", pool.name), ("node", node.name), ("team", "vision")):
        UtilizationRollup.objects.create(
            scope=scope,
            key=key,
            resolution_s=300,
            start=now - timedelta(hours=1),
            utilization_avg=42.0,
            utilization_max=77.0,
            samples=60,
        )
    c = Client()
    c.force_login(w.dave)
    r = c.get(f"/pools/{pool.pk}/history/")
    body = r.content.decode()
    assert r.status_code == 200 and "<svg" in body and "<polyline" not in body  # one point
    assert "<circle" in body and "http://" not in body.replace("http://www.w3.org/2000/svg", "")
    assert "<svg" in c.get(f"/ops/nodes/{node.pk}/history/?range=7d").content.decode()
    bob = Client()
    bob.force_login(w.bob)
    assert "<svg" in bob.get(f"/teams/{w.vision.pk}/history/?range=30d").content.decode()
    # another team's history, and the pool and node pages (admins), are not bob's
    assert bob.get(f"/teams/{w.nlp.pk}/history/").status_code == 404
    assert bob.get(f"/ops/nodes/{node.pk}/history/").status_code == 403
    assert bob.get(f"/pools/{pool.pk}/history/").status_code == 403


def test_the_chart_escapes_and_breaks_lines_at_gaps() -> None:
    svg = str(
        charts.line_chart(
            [("<b>", [(0, 1.0), (60, 2.0), (120, None), (180, 3.0), (240, 4.0)])],
            title="a & b",
            markers=[(100, "rev <x>")],
        )
    )
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "a &amp; b" in svg
    assert svg.count("<polyline") == 2 and "rev &lt;x&gt;" in svg


def test_the_node_agents_readings_are_exported(client: Client) -> None:
    make_world()
    d = Device.objects.order_by("pk").first()
    assert d is not None
    Device.objects.filter(pk=d.pk).update(utilization_pct=87, memory_used_mib=2048, reported_at=T0)
    text = client.get("/metrics").content.decode()
    line = f'quartermaster_device_utilization_ratio{{gpu="{d.index}",node="{d.node.name}",pool="{d.node.pool.name}"}} 0.87'
    assert line in text
    assert "quartermaster_device_memory_used_bytes{" in text and "2.147483648e+09" in text


def test_the_charts_axis_ends_at_a_round_number() -> None:
    """The top of the axis is the next round number above the data (10 % headroom), so its
    marks read 0 / 2.5 / 5, not 0 / 2.1 / 4.21, and 50, not 50.0."""

    def marks(peak: float, objective: float | None = None) -> list[str]:
        svg = str(
            charts.line_chart([("s", [(0, 0.5), (60, peak)])], title="t", objective=objective)
        )
        return re.findall(r'<text x="40" [^>]*text-anchor="end" font-size="10">([^<]+)</text>', svg)

    assert marks(3.83) == ["0", "2.5", "5"]
    assert marks(0.5) == ["0", "0.3", "0.6"]
    assert marks(633) == ["0", "400", "800"]
    assert marks(14752) == ["0", "10000", "20000"]
    assert marks(90) == ["0", "50", "100"]
    # an objective above the data is on the chart
    assert marks(0.3, objective=0.5) == ["0", "0.3", "0.6"]
