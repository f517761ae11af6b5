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
