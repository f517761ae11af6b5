"""Two scheduling profiles side by side: the knobs on which they differ."""

from __future__ import annotations

from dataclasses import dataclass

from portal.models import PolicyProfile
from scheduling import profile as scheduling_profile


@dataclass(frozen=True)
class KnobDiff:
    name: str
    label: str
    help: str
    a: object
    b: object


def profile_diff(a: PolicyProfile, b: PolicyProfile) -> list[KnobDiff]:
    """The knobs whose values differ, in the core's order (a knob a profile lacks has its
    default, as the tick would run it)."""
    ka, kb = a.profile().knobs, b.profile().knobs
    return [
        KnobDiff(name, knob.label, knob.help, ka[name], kb[name])
        for name, knob in scheduling_profile.KNOBS.items()
        if ka[name] != kb[name]
    ]
