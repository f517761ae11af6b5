from __future__ import annotations

import json
from typing import Any

from django import forms

from portal.models import DeviceProfile, Pool, Team, WorkloadClass


class SubmitForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none())
    name = forms.CharField(max_length=100, required=False)
    workload_class = forms.ModelChoiceField(queryset=WorkloadClass.objects.all())
    pool = forms.ModelChoiceField(queryset=Pool.objects.exclude(lifecycle="maintenance"), required=False, empty_label="any pool")
    profile = forms.ModelChoiceField(queryset=DeviceProfile.objects.all(), label="Device profile")
    count = forms.IntegerField(min_value=1, max_value=16, initial=1)
    image = forms.CharField(max_length=500, initial="registry.example.com/team/train:1.0")
    command = forms.CharField(max_length=2000, required=False, help_text="space-separated")
    env = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False, help_text="NAME=value, one per line")
    checkpoint_interval_s = forms.IntegerField(min_value=0, initial=0, label="Checkpoint every (s)")
    max_runtime_s = forms.IntegerField(min_value=0, initial=0, label="Maximum runtime (s)")
    estimated_runtime_s = forms.IntegerField(min_value=1, initial=3600, label="Estimated runtime (s)")

    def __init__(self, *args: Any, teams: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if teams is not None:
            self.fields["team"].queryset = teams  # type: ignore[attr-defined]

    def clean_env(self) -> dict[str, str]:
        raw = self.cleaned_data.get("env") or ""
        if raw.strip().startswith("{"):
            try:
                data = json.loads(raw)
            except ValueError:
                raise forms.ValidationError("Give NAME=value lines or a JSON object.") from None
            return {str(k): str(v) for k, v in data.items()}
        env: dict[str, str] = {}
        for line in raw.splitlines():
            if not line.strip():
                continue
            if "=" not in line:
                raise forms.ValidationError(f"{line.strip()!r} is not NAME=value.")
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip()
        return env

    def service_kwargs(self) -> dict[str, Any]:
        d = self.cleaned_data
        profile: DeviceProfile = d["profile"]
        return {
            "team": d["team"],
            "name": d["name"],
            "workload_class": d["workload_class"],
            "pool": d["pool"],
            "profile_kind": profile.kind,
            "mig_profile": profile.mig_profile,
            "milli": profile.milli,
            "gpu_memory_mib": profile.gpu_memory_mib,
            "count": d["count"],
            "image": d["image"],
            "command": (d["command"] or "").split(),
            "env": d["env"],
            "checkpoint_interval_s": d["checkpoint_interval_s"],
            "max_runtime_s": d["max_runtime_s"],
            "estimated_runtime_s": d["estimated_runtime_s"],
        }
