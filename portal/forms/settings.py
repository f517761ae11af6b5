"""Forms of the settings page: pools, workload classes, scheduling profiles."""

from __future__ import annotations

from typing import Any

from django import forms

from portal.forms.fields import (
    GpuField,
    MigLayoutField,
    NodeSelectorField,
    TaintsField,
    to_gpus,
    to_milli,
)
from portal.models import GpuRequest, PolicyProfile, Pool, Team, WorkloadClass
from portal.services.pools import CLASS_FIELDS, POOL_FIELDS, POOL_FIXED_FIELDS
from scheduling import profile as scheduling_profile


class WorkloadClassForm(forms.ModelForm):  # type: ignore[type-arg]
    kinds = forms.MultipleChoiceField(
        choices=GpuRequest.Kind.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Workload kinds",
        help_text=WorkloadClass._meta.get_field("kinds").help_text,
    )

    class Meta:
        model = WorkloadClass
        fields = [*CLASS_FIELDS, "teams", "pools"]
        widgets = {"teams": forms.CheckboxSelectMultiple, "pools": forms.CheckboxSelectMultiple}
        labels = {
            "band": "Priority band",
            "min_runtime_s": "Minimum runtime before preemption (seconds)",
            "max_queue_s": "Maximum queue time (seconds)",
            "latency_objective_ms": "Latency objective (milliseconds)",
            "priority_class_name": "Kubernetes priority class",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a retired team is kept for the logs, not offered
        field = self.fields["teams"]
        assert isinstance(field, forms.ModelMultipleChoiceField)
        field.queryset = Team.objects.filter(retired_at=None)


class PoolForm(forms.ModelForm):  # type: ignore[type-arg]
    """A pool's settings in plain fields (no JSON): taints, labels and MIG layout as text
    in the forms kubectl and nvidia-smi use, the inference floor in GPUs."""

    taints = TaintsField(
        required=False,
        label="Taints",
        help_text="one a line: key=value:Effect (NoSchedule, PreferNoSchedule or NoExecute)",
    )
    node_selector = NodeSelectorField(
        required=False,
        label="Node selector",
        help_text="node labels, e.g. qm.example.com/pool=a100, gpu=a100 (comma-separated)",
    )
    mig_layout = MigLayoutField(
        required=False,
        label="MIG layout",
        help_text="profiles each GPU is cut into, e.g. 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb",
    )
    sharing_engine = forms.ChoiceField(
        choices=Pool.SharingEngine.choices,
        required=False,
        label="Sharing engine (time-slicing pools)",
        help_text="time-slicing: memory is not isolated; mps and hami enforce each slice's caps",
    )
    inference_floor_milli = GpuField(
        label="Inference floor (GPUs)",
        help_text="kept for production inference; training uses it only preemptibly",
    )

    class Meta:
        model = Pool
        fields = POOL_FIELDS
        labels = {
            "time_slicing_replicas": "Time-slicing replicas (per GPU)",
            "interconnect": "Interconnect",
            "architecture": "Architecture",
            "burn_in_new_nodes": "Burn in nodes before they join",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound and self.instance.pk:
            self.initial["inference_floor_milli"] = to_gpus(self.instance.inference_floor_milli)

    def clean_sharing_engine(self) -> str:
        # a form posted without the field (an older page) keeps the pool's engine
        value = self.cleaned_data.get("sharing_engine") or ""
        return value or (self.instance.sharing_engine if self.instance.pk else "none")

    def clean_inference_floor_milli(self) -> int:
        return to_milli(self.cleaned_data["inference_floor_milli"]) or 0


def _knob_label(knob: scheduling_profile.Knob) -> str:
    """The knob in words, with its unit where its name has one."""
    if knob.name.endswith("_gpu_s"):
        return f"{knob.label} (GPU-seconds)"
    if knob.name.endswith("_s"):
        return f"{knob.label} (seconds)"
    return knob.label


def _knob_form_field(knob: scheduling_profile.Knob) -> forms.Field:
    """A form field with the core's own bounds for one knob (`scheduling.profile`)."""
    # the knob's own name (as in profile files, the API and what-if keys) as the hint
    hint = f"{knob.name}: {knob.help}" if knob.help else knob.name
    kw: dict[str, Any] = {"label": _knob_label(knob), "help_text": hint}
    if knob.choices:
        return forms.ChoiceField(choices=[(c, c) for c in knob.choices], **kw)
    if knob.type is str:
        return forms.CharField(**kw)
    bounds: dict[str, Any] = {"min_value": knob.minimum, "max_value": knob.maximum}
    if knob.type is int:
        return forms.IntegerField(**bounds, **kw)
    return forms.FloatField(**bounds, **kw)


class PolicyProfileForm(forms.Form):
    """One field per knob of the scheduling core; the services check them again."""

    def __init__(self, *args: Any, with_name: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if with_name:
            self.fields["name"] = forms.CharField(
                max_length=63, help_text="lower-case letters, digits, '-', '_' or '.'"
            )
        for name, knob in scheduling_profile.KNOBS.items():
            self.fields[name] = _knob_form_field(knob)

    def knobs(self) -> dict[str, Any]:
        return {k: self.cleaned_data[k] for k in scheduling_profile.KNOBS}


class PoolCreateForm(PoolForm):
    """A new pool: what its nodes are (fixed once made), then the settings any pool has."""

    class Meta(PoolForm.Meta):
        fields = [*POOL_FIXED_FIELDS, *POOL_FIELDS]
        help_texts = {
            "gpu_model": "as GPU Feature Discovery labels it (nvidia.com/gpu.product)",
            "gpu_memory_mib": "per GPU, MiB (nvidia.com/gpu.memory)",
        }


class WorkloadClassCreateForm(WorkloadClassForm):
    class Meta(WorkloadClassForm.Meta):
        fields = ["name", *CLASS_FIELDS, "teams"]


class RetireForm(forms.Form):
    """Retiring a pool or class with work in it: confirm, and say where waiting work goes."""

    confirm = forms.BooleanField(required=False, label="Retire it")
    move_to = forms.ModelChoiceField(
        queryset=Pool.objects.none(),
        required=False,
        label="Move waiting requests to",
        empty_label="(cancel them)",
    )

    def __init__(self, *args: Any, choices: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["move_to"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = choices


class ProfileDiffForm(forms.Form):
    """Two scheduling profiles to compare."""

    a = forms.ModelChoiceField(queryset=PolicyProfile.objects.order_by("name"), label="Profile")
    b = forms.ModelChoiceField(queryset=PolicyProfile.objects.order_by("name"), label="against")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("a") is not None and data.get("a") == data.get("b"):
            self.add_error("b", "Pick another profile than the first.")
        return data
