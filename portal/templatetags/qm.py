"""Template filters for the portal pages."""

from __future__ import annotations

from django import template

register = template.Library()


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
