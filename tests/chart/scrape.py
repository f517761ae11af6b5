"""Turn scrapes of the real /metrics into promtool input series.

Each scrape is one step of a promtool test's `interval`; a series missing from
a scrape is written as `_` (no sample). Timestamp-valued gauges (`*_timestamp_seconds`)
are rebased so that the first scrape's wall-clock time is promtool's time 0.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def parse(text: str) -> dict[str, float]:
    """{'name{a="x",b="y"}': value} for every sample of a scrape."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def label_names(text: str) -> dict[str, set[str]]:
    """Metric family name -> the label names its samples carry (besides le)."""
    out: dict[str, set[str]] = defaultdict(set)
    for family in text_string_to_metric_families(text):
        out[family.name]  # noqa: B018 - a family with no samples still exists
        for s in family.samples:
            out[s.name].update(k for k in s.labels if k != "le")
            out[family.name].update(k for k in s.labels if k != "le")
    return dict(out)


def _fmt(v: float) -> str:
    return repr(float(v)) if v != int(v) else str(int(v))


def input_series(scrapes: list[tuple[datetime, str]]) -> list[dict[str, Any]]:
    """promtool `input_series` from (wall-clock time, scrape text) pairs, one per interval."""
    t0 = scrapes[0][0].timestamp()
    parsed = [parse(text) for _, text in scrapes]
    names = sorted({k for p in parsed for k in p})
    series = []
    for name in names:
        values = []
        for p in parsed:
            if name not in p:
                values.append("_")
                continue
            v = p[name]
            if name.split("{")[0].endswith("_timestamp_seconds"):
                v = v - t0
            values.append(_fmt(v))
        series.append({"series": name, "values": " ".join(values)})
    return series
