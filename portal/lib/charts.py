"""Server-rendered SVG line charts: no JavaScript, no network, no chart library.

`line_chart` draws one or more series of (epoch seconds, value or None) over a shared
time axis, with optional vertical markers (revision changes) and a horizontal objective
line. Gaps (None) break the line. Every text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

from django.utils.safestring import SafeString, mark_safe

COLOURS = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed")
Point = tuple[float, float | None]


def _fmt(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}".removesuffix(".0")
    return f"{v:.2f}".rstrip("0").rstrip(".") if v else "0"


#: an axis ends at one of these times a power of ten, so its middle mark is round too
_NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def _nice_ceiling(v: float) -> float:
    """The smallest round number (see _NICE) at or above v > 0."""
    scale = 10.0 ** math.floor(math.log10(v))
    return next(n * scale for n in _NICE if n * scale >= v * (1 - 1e-9))


def line_chart(
    series: Sequence[tuple[str, Sequence[Point]]],
    *,
    title: str,
    unit: str = "",
    width: int = 640,
    height: int = 160,
    y_max: float | None = None,
    markers: Sequence[tuple[float, str]] = (),
    objective: float | None = None,
) -> SafeString:
    left, right, top, bottom = 44, 8, 20, 22
    pw, ph = width - left - right, height - top - bottom
    times = [t for _, pts in series for t, v in pts if v is not None]
    values = [v for _, pts in series for _, v in pts if v is not None]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-label="{escape(title)}">',
        f'<text x="{left}" y="13" class="chart-title" font-size="12">{escape(title)}'
        f"{escape(f' ({unit})' if unit else '')}</text>",
    ]
    if not times:
        out.append(
            f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" '
            f'font-size="12" fill="#888">no data yet</text></svg>'
        )
        return mark_safe("".join(out))  # noqa: S308 - built from escaped parts
    t0, t1 = min(times), max(times)
    for t, _ in markers:
        t0, t1 = min(t0, t), max(t1, t)
    if t1 <= t0:
        t1 = t0 + 1
    peak = max(max(values), objective or 0) * 1.1
    top_v = y_max if y_max is not None else _nice_ceiling(peak) if peak > 0 else 1.0

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        return top + ph - min(v, top_v) / top_v * ph

    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ddd"/>')
    for frac in (0, 0.5, 1):
        level = top_v * frac
        out.append(
            f'<text x="{left - 4}" y="{y(level) + 4:.1f}" text-anchor="end" font-size="10">'
            f"{_fmt(level)}</text>"
        )
    for t, label in ((t0, ""), (t1, "")):
        stamp = datetime.fromtimestamp(t, tz=UTC).strftime("%m-%d %H:%M")
        anchor = "start" if t == t0 else "end"
        out.append(
            f'<text x="{x(t):.1f}" y="{height - 6}" text-anchor="{anchor}" font-size="10">'
            f"{stamp}{escape(label)}</text>"
        )
    if objective is not None:
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y(objective):.1f}" y2="{y(objective):.1f}" '
            f'stroke="#dc2626" stroke-dasharray="4 3"><title>objective {_fmt(objective)}</title>'
            "</line>"
        )
    for t, label in markers:
        out.append(
            f'<line class="marker" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{top + ph}" '
            f'stroke="#7c3aed" stroke-dasharray="2 2"><title>{escape(label)}</title></line>'
            f'<text x="{x(t) + 2:.1f}" y="{top + 10}" font-size="9" fill="#7c3aed">'
            f"{escape(label)}</text>"
        )
    for i, (name, pts) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        runs: list[list[str]] = [[]]
        for t, v in pts:
            if v is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(t):.1f},{y(v):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="1.5" fill="{colour}"/>')
            elif run:
                out.append(
                    f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                    f'points="{" ".join(run)}"><title>{escape(name)}</title></polyline>'
                )
        out.append(
            f'<text x="{left + pw - 4 - 90 * i}" y="13" text-anchor="end" font-size="10" '
            f'fill="{colour}">{escape(name)}</text>'
        )
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - built from escaped parts
