"""The what-if draft: a team's guarantee in a pool, or one scheduling knob, or KEY=VALUE lines."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms

from portal.models import PolicyProfile, Pool, Team
from scheduling import profile as scheduling_profile


def _knob_choices() -> list[tuple[str, str]]:
    now = PolicyProfile.objects.active_profile().knobs
    return [("", "—")] + [
        (name, f"{knob.label} ({name}, now {now.get(name)})")
        for name, knob in scheduling_profile.KNOBS.items()
    ]


class WhatIfChangeForm(forms.Form):
    """The change to replay; each part optional, at least one given (the service says so)."""

    team = forms.ModelChoiceField(
        queryset=Team.objects.filter(retired_at=None).order_by("name"), required=False
    )
    pool = forms.ModelChoiceField(
        queryset=Pool.objects.filter(retired_at=None).order_by("name"), required=False
    )
    quota = forms.DecimalField(
        min_value=Decimal(0),
        max_value=Decimal(100000),
        decimal_places=3,
        required=False,
        label="New guarantee (GPUs)",
    )
    knob = forms.ChoiceField(required=False, label="Scheduling knob")
    knob_value = forms.CharField(max_length=100, required=False, label="New value")
    settings = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        max_length=2000,
        label="Other changes, one KEY=VALUE a line",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        knob = self.fields["knob"]
        assert isinstance(knob, forms.ChoiceField)
        # read at each form: the active profile's values change
        knob.choices = _knob_choices()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        team, pool, quota = data.get("team"), data.get("pool"), data.get("quota")
        if team or pool or quota is not None:
            for name, value in (("team", team), ("pool", pool), ("quota", quota)):
                if value is None and name not in self.errors:
                    self.add_error(name, "Pick the team, the pool and the new guarantee.")
        if data.get("knob") and not data.get("knob_value"):
            self.add_error("knob_value", "Give the knob's new value.")
        if data.get("knob_value") and not data.get("knob"):
            self.add_error("knob", "Pick the knob to change.")
        return data

    def lines(self) -> str:
        """The change as the service's KEY=VALUE lines."""
        data = self.cleaned_data
        out = []
        if data.get("team") and data.get("pool") and data.get("quota") is not None:
            gpus = data["quota"].normalize()
            out.append(f"quota.{data['team'].name}.{data['pool'].name}={gpus:f}")
        if data.get("knob"):
            out.append(f"policy.{data['knob']}={data['knob_value']}")
        return "\n".join([*out, data.get("settings", "")]).strip()
