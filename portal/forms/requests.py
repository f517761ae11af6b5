"""The submit form, what a saved template or an earlier request fills it with, and a user's
notification preferences."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from portal.forms.fields import MarksRequired, ProfileChoiceField
from portal.lib import shapes, validation
from portal.models import (
    DeviceProfile,
    GpuRequest,
    NotificationPreference,
    Pool,
    Team,
    WorkloadClass,
)
from portal.selectors.capacity import offered_profiles
from portal.services.requests import validate_env


class SubmitForm(MarksRequired, forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none())
    name = forms.CharField(max_length=100, required=False)
    workload_class = forms.ModelChoiceField(queryset=WorkloadClass.objects.all())
    pool = forms.ModelChoiceField(
        queryset=Pool.objects.exclude(lifecycle="maintenance"),
        required=False,
        empty_label="any pool",
    )
    profile = ProfileChoiceField(queryset=DeviceProfile.objects.none(), label="Device profile")
    count = forms.IntegerField(min_value=1, max_value=16, initial=1, label="Devices per pod")
    pods = forms.IntegerField(
        min_value=1,
        max_value=64,
        initial=1,
        required=False,
        label="Pods",
        help_text="more than 1: a gang, one pod per node, started and stopped together",
    )
    cpu_milli = forms.IntegerField(
        min_value=0,
        max_value=10**9,
        initial=1000,
        required=False,
        label="CPU per pod (millicores)",
    )
    memory_mib = forms.IntegerField(
        min_value=0,
        max_value=10**9,
        initial=4096,
        required=False,
        label="Host memory per pod (MiB)",
    )
    image = forms.CharField(max_length=500, initial="registry.example.com/team/train:1.0")
    command = forms.CharField(max_length=2000, required=False, help_text="space-separated")
    env = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        label="Environment",
        help_text="NAME=value, one per line; NVIDIA_*, CUDA_VISIBLE_DEVICES and QM_* are set "
        "by the platform",
    )
    checkpoint_interval_s = forms.IntegerField(
        min_value=0,
        max_value=10**9,
        initial=0,
        label="Checkpoint every (s)",
        help_text="0 = no checkpoints. Otherwise the workload gets a checkpoint directory "
        "(QM_CHECKPOINT_DIR) kept across its attempts, reports each checkpoint, and a retry "
        "after preemption resumes (QM_RESUME=1): see docs/checkpoints.md",
    )
    max_runtime_s = forms.IntegerField(
        min_value=0,
        max_value=10**9,
        initial=0,
        label="Maximum runtime (s)",
        help_text="0 = no limit",
    )
    estimated_runtime_s = forms.IntegerField(
        min_value=1, max_value=10**9, initial=3600, label="Estimated runtime (s)"
    )
    priority = forms.IntegerField(
        min_value=-100,
        max_value=100,
        initial=0,
        required=False,
        help_text="within the class band; members may lower it, leads raise it within limits",
    )
    kind = forms.ChoiceField(
        choices=GpuRequest.Kind.choices,
        initial=GpuRequest.Kind.BATCH,
        required=False,
        help_text="serving: runs until stopped, pods = replicas, one per node (docs/serving.md)",
    )
    model_name = forms.CharField(max_length=200, required=False, label="Model")
    model_revision = forms.CharField(max_length=100, required=False, label="Model revision")
    runtime = forms.ChoiceField(
        choices=[("", "—"), *GpuRequest.Runtime.choices], required=False, label="Runtime"
    )

    def __init__(self, *args: Any, teams: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if teams is not None:
            # a retired team takes no new requests: not offered
            teams = teams.filter(retired_at=None)
            self.fields["team"].queryset = teams  # type: ignore[attr-defined]
            if teams.count() == 1:
                self.fields["team"].initial = teams.first()
        self.fields["profile"].queryset = offered_profiles(self._chosen_pool())  # type: ignore[attr-defined]

    def _chosen_pool(self) -> Pool | None:
        """The pool named in the bound data, if valid: it decides which profiles are offered."""
        raw = self.data.get("pool") if self.is_bound else None
        if not raw:
            return None
        try:
            return Pool.objects.exclude(lifecycle="maintenance").get(pk=int(raw))
        except (Pool.DoesNotExist, ValueError, TypeError):
            return None

    def clean_env(self) -> dict[str, str]:
        raw = self.cleaned_data.get("env") or ""
        if raw.strip().startswith("{"):
            if validation.json_text_too_deep(raw):
                raise forms.ValidationError(
                    f"JSON nested deeper than {validation.MAX_JSON_DEPTH} levels is not accepted."
                )
            try:
                data = json.loads(raw)
            except ValueError:
                raise forms.ValidationError("Give NAME=value lines or a JSON object.") from None
            if not isinstance(data, dict):
                raise forms.ValidationError("Give NAME=value lines or a JSON object.")
            # Values as given: validate_env refuses a list or an object rather than stringify it.
            env = dict(data)
        else:
            env = {}
            for line in raw.splitlines():
                if not line.strip():
                    continue
                if "=" not in line:
                    raise forms.ValidationError(f"{line.strip()!r} is not NAME=value.")
                key, value = line.split("=", 1)
                env[key.strip()] = value.strip()
        try:
            return validate_env(env)
        except ValidationError as exc:
            raise forms.ValidationError(exc.message_dict["env"]) from None

    def service_kwargs(self) -> dict[str, Any]:
        d = self.cleaned_data
        profile: DeviceProfile = d["profile"]
        return {
            "team": d["team"],
            "name": d["name"],
            "workload_class": d["workload_class"],
            "pool": d["pool"],
            **shapes.profile_fields(profile),
            "count": d["count"],
            # Empty means the defaults the API uses too.
            "pods": d.get("pods") or 1,
            "cpu_milli": 1000 if d.get("cpu_milli") is None else d["cpu_milli"],
            "memory_mib": 4096 if d.get("memory_mib") is None else d["memory_mib"],
            "image": d["image"],
            "command": (d["command"] or "").split(),
            "env": d["env"],
            "checkpoint_interval_s": d["checkpoint_interval_s"],
            "max_runtime_s": d["max_runtime_s"],
            "estimated_runtime_s": d["estimated_runtime_s"],
            "priority": d.get("priority") or 0,
            "kind": d.get("kind") or GpuRequest.Kind.BATCH,
            "model_name": d.get("model_name") or "",
            "model_revision": d.get("model_revision") or "",
            "runtime": d.get("runtime") or "",
        }

    def preview_kwargs(self) -> dict[str, Any]:
        """What the preview needs: the shape and where, nothing about the container."""
        k = self.service_kwargs()
        return {
            key: k[key]
            for key in (
                "team",
                "workload_class",
                "pool",
                *shapes.DEVICE_FIELDS,
                "priority",
                "kind",
            )
        }


class NotificationPreferenceForm(forms.ModelForm):  # type: ignore[type-arg]
    webhook_url = forms.URLField(
        required=False,
        max_length=500,
        assume_scheme="https",
        label="Webhook URL",
        help_text=NotificationPreference._meta.get_field("webhook_url").help_text,
    )

    webhook_format = forms.ChoiceField(
        choices=NotificationPreference.WebhookFormat.choices,
        required=False,
        label="Webhook format",
        help_text=NotificationPreference._meta.get_field("webhook_format").help_text,
    )

    class Meta:
        model = NotificationPreference
        fields = [
            "email",
            "webhook_url",
            "webhook_format",
            "on_start",
            "on_end",
            "on_failure",
            "on_preemption",
            "on_long_wait",
        ]

    def clean_webhook_format(self) -> str:
        # Left out (an older form, the API): the format follows the address.
        return str(self.cleaned_data.get("webhook_format") or "auto")


class TemplateSaveForm(forms.Form):
    # A field named like BaseForm.template_name: the form's metaclass takes fields out of the
    # class, so the attribute stays the template's; the posted name is kept as it is.
    template_name = forms.CharField(max_length=100, label="Save as template")  # type: ignore[assignment]


#: the submit form's fields a template keeps (the same names, as posted)
TEMPLATE_FIELDS = [
    "team",
    "name",
    "workload_class",
    "pool",
    "profile",
    "count",
    "pods",
    "cpu_milli",
    "memory_mib",
    "image",
    "command",
    "env",
    "checkpoint_interval_s",
    "max_runtime_s",
    "estimated_runtime_s",
    "priority",
    "kind",
    "model_name",
    "model_revision",
    "runtime",
]


def initial_from_request(req: GpuRequest) -> dict[str, Any]:
    """The submit form filled from an earlier request (resubmit)."""
    profile = (
        DeviceProfile.objects.filter(
            kind=req.profile_kind,
            mig_profile=req.mig_profile,
            milli=req.milli,
            gpu_memory_mib=req.gpu_memory_mib if req.profile_kind == "shared" else 0,
        )
        .values_list("pk", flat=True)
        .first()
    )
    return {
        "team": req.team_id,
        "name": req.name,
        "workload_class": req.workload_class_id,
        "pool": req.pool_id or "",
        "profile": profile,
        "count": req.count,
        "pods": req.pods,
        "cpu_milli": req.cpu_milli,
        "memory_mib": req.memory_mib,
        "image": req.image,
        "command": " ".join(str(c) for c in req.command),
        "env": "\n".join(f"{k}={v}" for k, v in sorted(req.env.items())),
        "checkpoint_interval_s": req.checkpoint_interval_s,
        "max_runtime_s": req.max_runtime_s,
        # a serving workload has no estimate (0): the form asks for one all the same
        "estimated_runtime_s": req.estimated_runtime_s or 3600,
        "priority": req.priority,
        "kind": req.kind,
        "model_name": req.model_name,
        "model_revision": req.model_revision,
        "runtime": req.runtime,
    }
