"""Template filters for the portal pages."""

from __future__ import annotations

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
    """Milli-GPU for people: 16000 -> "16", 1500 -> "1.5", None -> ""."""
    if milli is None:
        return ""
    whole, rest = divmod(int(milli), 1000)
    if rest == 0:
        return str(whole)
    return f"{int(milli) / 1000:.3f}".rstrip("0").rstrip(".")


@register.filter
def gpu_hours(milli_seconds: int | None) -> str:
    """GPU milli-seconds as GPU-hours: 3_600_000 -> "1.00", None -> ""."""
    if milli_seconds is None:
        return ""
    return f"{int(milli_seconds) / 1000 / 3600:.2f}"
