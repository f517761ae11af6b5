"""Template filters for the portal pages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from portal import access
from portal.lib import words

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
    """Milli-GPU for people, to two decimals (`words.gpus`)."""
    return words.gpus(milli)


@register.filter
def gpu_count(milli: int | None) -> str:
    """With the unit, singular when it is one (`words.gpu_count`)."""
    return words.gpu_count(milli)


@register.filter
def cpus(milli: int | None) -> str:
    """Milli-CPU with the unit (`words.cpus`)."""
    return words.cpus(milli)


@register.filter
def memory(mib: int | None) -> str:
    """MiB as people read it, GiB from 1 GiB up (`words.memory`)."""
    return words.memory(mib)


@register.filter
def starts_in(when: datetime | None) -> str:
    """When an estimated start is, from now: "in 12 min", "in 2 h 5 min"; an estimate that is
    now or past (the next tick starts it) is "within a minute", never "0 minutes"."""
    if when is None:
        return ""
    seconds = (when - timezone.now()).total_seconds()
    return "within a minute" if seconds < 60 else f"in {words.duration(seconds)}"


@register.filter
def plural(n: int | None, word: str) -> str:
    """{{ n|plural:"pod" }} -> "1 pod", "3 pods"."""
    n = int(n or 0)
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@register.filter
def duration(seconds: float | int | None) -> str:
    """A length of time as people read it: 45 s, 12 min, 2 h 5 min, 3 d 4 h."""
    return words.duration(seconds)


@register.simple_tag
def runtime(req: object, now: object) -> str:
    """How long a request has run: from its first start to its last end (or now)."""
    started = getattr(req, "first_started", None)
    if started is None:
        return ""
    ended = getattr(req, "last_ended", None)
    if getattr(req, "state", "") in ("running", "admitted") or ended is None:
        ended = now
    return duration((ended - started).total_seconds())


@register.filter
def gpu_hours(milli_seconds: int | None) -> str:
    """GPU milli-seconds as GPU-hours: 3_600_000 -> "1.00", None -> ""."""
    if milli_seconds is None:
        return ""
    return f"{int(milli_seconds) / 1000 / 3600:.2f}"


@register.filter
def seconds(value: int | None) -> str:
    """45 s, 10 min, 2 h 5 min: a number of seconds as a person reads it."""
    return words.duration(value or 0)


@register.filter
def token_state(token: Any) -> str:
    """A personal token's state now: "active", "revoked" or "expired"."""
    return str(token.state_at(timezone.now()))
