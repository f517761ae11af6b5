"""Template filters for the portal pages."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django import template

from portal import access

register = template.Library()


@register.filter
def sees_all(user: Any) -> bool:
    """Admins and auditors: the platform pages (capacity, audit log, settings) in the menu."""
    return access.sees_all(user)


@register.filter
def read_only(user: Any) -> bool:
    """Auditors: pages show no buttons that change anything (the server refuses them anyway)."""
    return access.is_read_only(user)


@register.filter
def gpus(milli: int | None) -> str:
    """Milli-GPU for people, to two decimals: 16000 -> "16", 1500 -> "1.5", 4666 -> "4.67",
    None -> "". Below 0.01 GPU the third decimal stays (5 -> "0.005"). A missing value
    (a template variable that does not resolve, such as a quota a team has not got) is ""."""
    if milli is None or milli == "":
        return ""
    value = Decimal(int(milli)) / 1000
    step = Decimal("0.01") if value >= Decimal("0.01") or not value else Decimal("0.001")
    text = str(value.quantize(step, rounding=ROUND_HALF_UP))
    return text.rstrip("0").rstrip(".") if "." in text else text


@register.filter
def gpu_count(milli: int | None) -> str:
    """With the unit, singular when it is one: "1 GPU", "0.5 GPU", "2 GPUs", "1.5 GPUs"."""
    if milli is None or milli == "":
        return ""
    text = gpus(milli)
    return f"{text} GPU" if float(text) <= 1 else f"{text} GPUs"


@register.filter
def plural(n: int | None, word: str) -> str:
    """{{ n|plural:"pod" }} -> "1 pod", "3 pods"."""
    n = int(n or 0)
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@register.filter
def duration(seconds: float | int | None) -> str:
    """A length of time as people read it: 45 s, 12 min, 2 h 5 min, 3 d 4 h."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


@register.simple_tag
def runtime(req: object, now: object) -> str:
    """How long a request has run: from its first start to its last end (or now)."""
    started = getattr(req, "first_started", None)
    if started is None:
        return ""
    ended = getattr(req, "last_ended", None)
    if getattr(req, "state", "") in ("running", "admitted") or ended is None:
        ended = now
    return duration((ended - started).total_seconds())  # type: ignore[operator]


@register.filter
def gpu_hours(milli_seconds: int | None) -> str:
    """GPU milli-seconds as GPU-hours: 3_600_000 -> "1.00", None -> ""."""
    if milli_seconds is None:
        return ""
    return f"{int(milli_seconds) / 1000 / 3600:.2f}"


@register.filter
def seconds(value: int | None) -> str:
    """45 s, 10 min, 2 h 5 min: a number of seconds as a person reads it."""
    s = max(0, int(value or 0))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    hours, minutes = divmod(s // 60, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
