"""Utilization history: per-minute device samples, downsampled, with bounded retention.

* `record_samples` (every minute) stores one `UtilizationSample` per device from what
  the node agent last reported (`Device.utilization_pct`, `memory_used_mib`), with the
  team holding the device. The simulated cluster has no agent: `simulate_device_load`
  first writes the numbers an agent would have (serving replicas: their server's GPU
  utilization; other work: a steady busy level with some noise; idle devices: 0).
* `rollup` folds finished buckets into `UtilizationRollup` rows per node, pool and team:
  5-minute buckets (the 24 h charts) and 1-hour buckets (the 7 d and 30 d charts).
* `prune` keeps raw samples UTILIZATION_RAW_HOURS, 5-minute rollups UTILIZATION_5M_DAYS,
  1-hour rollups UTILIZATION_1H_DAYS.
* `history` reads one node's, pool's or team's chart points: from Prometheus when
  `PROMETHEUS_URL` is set (dcgm-exporter's series, so MIG instances, for which NVML and so
  the node agent report no utilization, count too), else, or when it does not answer or
  holds no series of it, from the rollups.
"""

from __future__ import annotations

import logging
import math
import random
import zlib
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Min
from django.utils import timezone

from portal.lib import dcgm
from portal.lib.bulk import insert_rows
from portal.lib.prometheus import Prometheus, PrometheusError
from portal.models import (
    Allocation,
    Device,
    Node,
    ServingSample,
    Team,
    UtilizationRollup,
    UtilizationSample,
)
from portal.services.prometheus import client as prometheus

log = logging.getLogger(__name__)

RESOLUTIONS = (300, 3600)
#: chart range -> (seconds, rollup resolution)
RANGES = {"24h": (24 * 3600, 300), "7d": (7 * 24 * 3600, 3600), "30d": (30 * 24 * 3600, 3600)}


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def _floor(t: datetime, seconds: int) -> datetime:
    epoch = int(t.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=t.tzinfo)


def _holders() -> dict[int, tuple[str, int]]:
    """device id -> (team holding it, request id)."""
    return {
        device_id: (team, request_id)
        for device_id, team, request_id in Allocation.objects.filter(active=True).values_list(
            "device_id", "attempt__request__team__name", "attempt__request_id"
        )
    }


def simulate_device_load(now: datetime | None = None) -> int:
    """The simulated cluster's stand-in for the node agent's NVML readings."""
    now = now or timezone.now()
    holders = _holders()
    serving_util: dict[int, tuple[float, float]] = {}
    for rid in {r for _, r in holders.values()}:
        s = (
            ServingSample.objects.filter(request_id=rid, at__gte=now - timedelta(minutes=5))
            .order_by("-at")
            .values_list("gpu_utilization", "gpu_memory_used_mib")
            .first()
        )
        if s is not None and s[0] is not None:
            serving_util[rid] = (s[0], s[1] or 0.0)
    minute = int(now.timestamp() // 60)
    changed = []
    for d in Device.objects.only("id", "memory_mib", "utilization_pct", "memory_used_mib"):
        held = holders.get(d.pk)
        if held is None:
            util, mem = 0, 0
        elif held[1] in serving_util:
            u, m = serving_util[held[1]]
            util, mem = round(u), round(m)
        else:
            # Training: busy, with a slow wave and noise, different per device.
            rng = random.Random(minute * 7919 + d.pk)
            wave = 8 * math.sin((minute + zlib.crc32(str(d.pk).encode()) % 60) / 9)
            util = max(0, min(100, round(80 + wave + rng.uniform(-6, 6))))
            mem = int(d.memory_mib * 0.7)
        mem = min(mem, d.memory_mib)
        if (d.utilization_pct, d.memory_used_mib) != (util, mem):
            d.utilization_pct, d.memory_used_mib = util, mem
            changed.append(d)
    Device.objects.bulk_update(changed, ["utilization_pct", "memory_used_mib"], batch_size=500)
    return len(changed)


def record_samples(now: datetime | None = None) -> int:
    """One sample per device for this minute (a second call in the same minute is a no-op)."""
    at = _minute(now or timezone.now())
    if UtilizationSample.objects.filter(at=at).exists():
        return 0
    holders = _holders()
    rows = [
        {
            "device_id": pk,
            "at": at,
            "node": node,
            "pool": pool,
            "team": holders.get(pk, ("", 0))[0],
            "utilization_pct": util,
            "memory_used_mib": mem,
        }
        for pk, node, pool, util, mem in Device.objects.values_list(
            "pk", "node__name", "node__pool__name", "utilization_pct", "memory_used_mib"
        )
    ]
    insert_rows(UtilizationSample, rows)
    return len(rows)


def _aggregate(rows: list[tuple[str, str, str, int, int]]) -> dict[tuple[str, str], list[float]]:
    """(scope, key) -> [sum util, max util, sum memory, n] over (node, pool, team, u, mem)."""
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for node, pool, team, util, mem in rows:
        for scope, key in (("node", node), ("pool", pool), ("team", team)):
            if not key:
                continue
            a = acc[(scope, key)]
            a[0] += util
            a[1] = max(a[1], util)
            a[2] += mem
            a[3] += 1
    return acc


def rollup(now: datetime | None = None) -> int:
    """Fold every finished bucket not folded yet into rollups; returns rows written."""
    now = now or timezone.now()
    written = 0
    first_raw = UtilizationSample.objects.aggregate(t=Min("at"))["t"]
    if first_raw is None:
        return 0
    for res in RESOLUTIONS:
        last = UtilizationRollup.objects.filter(resolution_s=res).aggregate(t=Max("start"))["t"]
        start = last + timedelta(seconds=res) if last else _floor(first_raw, res)
        start = max(start, _floor(first_raw, res))
        end = _floor(now, res)
        while start < end:
            stop = start + timedelta(seconds=res)
            rows = list(
                UtilizationSample.objects.filter(at__gte=start, at__lt=stop).values_list(
                    "node", "pool", "team", "utilization_pct", "memory_used_mib"
                )
            )
            with transaction.atomic():
                UtilizationRollup.objects.filter(resolution_s=res, start=start).delete()
                batch = [
                    UtilizationRollup(
                        scope=scope,
                        key=key,
                        resolution_s=res,
                        start=start,
                        utilization_avg=a[0] / a[3],
                        utilization_max=a[1],
                        memory_used_mib_avg=a[2] / a[3],
                        samples=int(a[3]),
                    )
                    for (scope, key), a in _aggregate(rows).items()
                ]
                UtilizationRollup.objects.bulk_create(batch, batch_size=1000)
            written += len(batch)
            start = stop
    return written


def prune(now: datetime | None = None) -> int:
    now = now or timezone.now()
    n = UtilizationSample.objects.filter(
        at__lt=now - timedelta(hours=settings.UTILIZATION_RAW_HOURS)
    ).delete()[0]
    for res, days in ((300, settings.UTILIZATION_5M_DAYS), (3600, settings.UTILIZATION_1H_DAYS)):
        n += UtilizationRollup.objects.filter(
            resolution_s=res, start__lt=now - timedelta(days=days)
        ).delete()[0]
    return int(n)


def history(
    scope: str, key: str, span: str = "24h", now: datetime | None = None
) -> list[tuple[float, float, float]]:
    """[(epoch seconds, mean utilization %, peak %)] of a node, pool or team over `span`."""
    now = now or timezone.now()
    prom = prometheus()
    if prom is not None:
        try:
            points = prometheus_history(prom, scope, key, span, now)
        except PrometheusError as exc:
            log.warning("Prometheus unavailable, using stored rollups: %s", exc)
        else:
            if points:
                return points
            # no dcgm-exporter series (yet): the node agent's samples are better than none
    seconds, res = RANGES[span]
    return [
        (start.timestamp(), avg, peak)
        for start, avg, peak in UtilizationRollup.objects.filter(
            scope=scope, key=key, resolution_s=res, start__gte=now - timedelta(seconds=seconds)
        )
        .order_by("start")
        .values_list("start", "utilization_avg", "utilization_max")
    ]


def device_selector(scope: str, key: str) -> str | None:
    """dcgm-exporter's series of a node (`Hostname` is the node name in Kubernetes mode), a
    pool (its nodes) or a team (pods in its namespace); None: nothing to select."""
    if scope == "node":
        return f"Hostname={dcgm.quote(key)}"
    if scope == "pool":
        nodes = sorted(Node.objects.filter(pool__name=key).values_list("name", flat=True))
        if not nodes:
            return None
        return f"Hostname=~{dcgm.quote('|'.join(dcgm.regex_literal(n) for n in nodes))}"
    if scope == "team":
        namespace = Team.objects.filter(name=key).values_list("namespace", flat=True).first()
        return f"namespace={dcgm.quote(namespace)}" if namespace else None
    raise ValueError(f"unknown scope {scope!r}")


def history_queries(sel: str, res: int) -> tuple[str, str]:
    """(mean, peak) over each `res`-second bucket of every device or MIG instance selected."""
    return (
        f"avg({dcgm.utilization_over('avg_over_time', sel, res)})",
        f"max({dcgm.utilization_over('max_over_time', sel, res)})",
    )


def prometheus_history(
    prom: Prometheus, scope: str, key: str, span: str, now: datetime
) -> list[tuple[float, float, float]]:
    seconds, res = RANGES[span]
    sel = device_selector(scope, key)
    if sel is None:
        return []
    start = now - timedelta(seconds=seconds)
    mean_q, peak_q = history_queries(sel, res)
    points: dict[float, list[float]] = {}
    for i, expr in enumerate((mean_q, peak_q)):
        for r in prom.query_range(expr, start, now, res)[:1]:
            for t, v in r["values"]:
                value = float(v)
                if math.isfinite(value):
                    points.setdefault(float(t), [math.nan, math.nan])[i] = value
    return [
        (t, mean, peak)
        for t, (mean, peak) in sorted(points.items())
        if math.isfinite(mean) and math.isfinite(peak)
    ]


def utilization_tick(now: datetime | None = None) -> dict[str, Any]:
    """The minute's work: (simulated readings,) samples, rollups, retention."""
    now = now or timezone.now()
    out: dict[str, Any] = {}
    if settings.CLUSTER_BACKEND != "kubernetes":
        out["simulated"] = simulate_device_load(now)
    out["samples"] = record_samples(now)
    out["rollups"] = rollup(now)
    out["pruned"] = prune(now)
    return out
