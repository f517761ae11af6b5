"""A what-if's result read as a comparison: current against proposed, with the difference in
words, and the exact changes an Apply would make."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from portal.lib import words
from portal.models import PolicyProfile, Quota

#: (key in a replay's figures, label, kind): "s" durations, "pct" percentages, "n" counts
METRICS = (
    ("wait_p50_s", "Wait, median", "s"),
    ("wait_p95_s", "Wait, p95", "s"),
    ("wait_max_s", "Wait, longest", "s"),
    ("utilization_pct", "Utilization", "pct"),
    ("preemptions", "Preemptions", "n"),
    ("gpu_hours_lost", "GPU-hours lost", "n"),
    ("never_started", "Never started", "n"),
)


@dataclass(frozen=True)
class Line:
    label: str
    current: str
    proposed: str
    #: "" when equal
    delta: str


def _words(value: Any, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "s":
        return words.duration(value)
    return f"{value} %" if kind == "pct" else str(value)


def _delta(a: Any, b: Any, kind: str) -> str:
    if a is None or b is None or a == b:
        return ""
    diff = b - a
    sign = "+" if diff > 0 else "−"
    if kind == "s":
        return f"{sign}{words.duration(abs(diff))}"
    amount = round(abs(diff), 2)
    return f"{sign}{amount}{' points' if kind == 'pct' else ''}"


def lines(current: dict[str, Any], proposed: dict[str, Any]) -> list[Line]:
    return [
        Line(
            label,
            _words(current.get(key), kind),
            _words(proposed.get(key), kind),
            _delta(current.get(key), proposed.get(key), kind),
        )
        for key, label, kind in METRICS
        if key in current or key in proposed
    ]


def comparison(result: dict[str, Any] | None) -> dict[str, Any]:
    """Overall and per team, each metric's two values and their difference; `same` when the
    change makes no difference at all."""
    result = result or {}
    overall = lines(result.get("current", {}), result.get("proposed", {}))
    teams = []
    for team, sides in sorted(result.get("teams", {}).items()):
        a, b = sides.get("current", {}), sides.get("proposed", {})
        ca, cb = a.get("classes", {}), b.get("classes", {})
        classes = [(c, lines(ca.get(c, {}), cb.get(c, {}))) for c in sorted(set(ca) | set(cb))]
        teams.append((team, lines(a, b), classes))
    same = all(not x.delta for x in overall) and all(
        not x.delta for _, ls, cs in teams for x in [*ls, *(y for _, c in cs for y in c)]
    )
    return {"overall": overall, "team_lines": teams, "same": same}


def change_words(changes: dict[str, str]) -> list[str]:
    """Each change an Apply makes, with the value it replaces where the portal holds one."""
    out = []
    knobs = PolicyProfile.objects.active_profile().knobs
    for key, value in changes.items():
        parts = key.split(".")
        if parts[0] == "quota" and len(parts) in (3, 4):
            q = Quota.objects.filter(team__name=parts[1], pool__name=parts[2]).first()
            limit = parts[3] if len(parts) == 4 else ""
            field = f"{limit}_limit_milli" if limit else "nominal_milli"
            what = f"{limit} limit" if limit else "guarantee"
            old = getattr(q, field, None) if q is not None else None
            before = words.gpu_count(old) if old is not None else "none"
            out.append(f"{what} of {parts[1]} in {parts[2]}: {before} → {value} GPUs")
        elif parts[0] == "policy" and len(parts) == 2:
            out.append(f"{parts[1]} of the active profile: {knobs.get(parts[1], '—')} → {value}")
        else:
            out.append(f"{key} → {value}")
    return out
