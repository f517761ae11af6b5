"""Forms validate and convert input; services decide and write."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from portal import selectors, services, shapes, validation
from portal.models import (
    Decision,
    DeviceProfile,
    GpuRequest,
    NotificationPreference,
    Pool,
    Team,
    WorkloadClass,
)
from scheduling import profile as scheduling_profile


def _milli(value: Decimal | None) -> int | None:
    return None if value is None else int(value * 1000)


def _gpus(milli: int | None) -> Decimal | None:
    return None if milli is None else Decimal(milli) / 1000


class GpuField(forms.DecimalField):
    """GPUs for people (0.5, 4), milli-GPU for the services."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("max_value", 1_000_000)
        kwargs.setdefault("decimal_places", 3)
        kwargs.setdefault("max_digits", 10)
        super().__init__(**kwargs)


class ProfileChoiceField(forms.ModelChoiceField):  # type: ignore[type-arg]
    def label_from_instance(self, obj: Any) -> str:
        return str(obj.label)


class SubmitForm(forms.Form):
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
            self.fields["team"].queryset = teams  # type: ignore[attr-defined]
            if teams.count() == 1:
                self.fields["team"].initial = teams.first()
        self.fields["profile"].queryset = selectors.offered_profiles(self._chosen_pool())  # type: ignore[attr-defined]

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
            try:
                data = json.loads(raw)
            except ValueError:
                raise forms.ValidationError("Give NAME=value lines or a JSON object.") from None
            if not isinstance(data, dict):
                raise forms.ValidationError("Give NAME=value lines or a JSON object.")
            env = {str(k): str(v) for k, v in data.items()}
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
            return services.validate_env(env)
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
                "profile_kind",
                "mig_profile",
                "milli",
                "gpu_memory_mib",
                "count",
                "pods",
                "cpu_milli",
                "memory_mib",
                "priority",
            )
        }


class QuotaForm(forms.Form):
    """A team's quota in one pool, in GPUs. Leads edit nominal and limits; admins also grant."""

    nominal = GpuField(label="Guaranteed GPUs")
    borrowing_limit = GpuField(
        required=False, label="May borrow (GPUs)", help_text="empty = no limit"
    )
    lending_limit = GpuField(required=False, label="May lend (GPUs)", help_text="empty = no limit")
    granted = GpuField(required=False, label="Granted by admins (GPUs)")
    reason = forms.CharField(
        max_length=500,
        label="Reason for the change",
        help_text="goes into the audit log",
        error_messages={"required": "Say why: the reason goes into the audit log."},
    )

    def __init__(self, *args: Any, admin: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not admin:
            del self.fields["granted"]

    def clean_reason(self) -> str:
        reason = self.cleaned_data["reason"].strip()
        if not reason:
            raise forms.ValidationError("Say why: the reason goes into the audit log.")
        return reason

    @classmethod
    def initial_for(cls, quota: Any) -> dict[str, Any]:
        if quota is None:
            return {"nominal": 0}
        return {
            "nominal": _gpus(quota.nominal_milli),
            "borrowing_limit": _gpus(quota.borrowing_limit_milli),
            "lending_limit": _gpus(quota.lending_limit_milli),
            "granted": _gpus(quota.granted_milli),
        }

    def service_kwargs(self) -> dict[str, Any]:
        d = self.cleaned_data
        out = {
            "nominal_milli": _milli(d["nominal"]),
            "borrowing_limit_milli": _milli(d.get("borrowing_limit")),
            "lending_limit_milli": _milli(d.get("lending_limit")),
            "reason": d["reason"],
        }
        if "granted" in self.fields and d.get("granted") is not None:
            out["granted_milli"] = _milli(d["granted"])
        return out

    FIELD_FOR = {
        "nominal_milli": "nominal",
        "borrowing_limit_milli": "borrowing_limit",
        "lending_limit_milli": "lending_limit",
        "granted_milli": "granted",
    }


class MemberCapForm(forms.Form):
    gpu_cap = GpuField(
        required=False, label="Cap (GPUs)", help_text="empty = the team's quota is the only cap"
    )
    role = forms.ChoiceField(choices=[("member", "member"), ("lead", "lead")], required=False)

    def __init__(self, *args: Any, admin: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not admin:
            del self.fields["role"]


class WorkloadClassForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = WorkloadClass
        fields = [*services.CLASS_FIELDS, "teams"]
        widgets = {"teams": forms.CheckboxSelectMultiple}
        labels = {
            "band": "Priority band",
            "min_runtime_s": "Minimum runtime before preemption (seconds)",
            "max_queue_s": "Maximum queue time (seconds)",
            "latency_objective_ms": "Latency objective (milliseconds)",
            "priority_class_name": "Kubernetes priority class",
        }


class TeamCreateForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text="lower-case letters, digits and dashes")
    display_name = forms.CharField(max_length=200, required=False)
    namespace = forms.SlugField(
        max_length=63, required=False, help_text="Kubernetes namespace; empty = qm-<name>"
    )


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=[("member", "member"), ("lead", "lead")], required=False)

    def __init__(self, *args: Any, admin: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not admin:
            del self.fields["role"]


class TaintsField(forms.CharField):
    """Taints as kubectl writes them, one a line: `key=value:Effect` (value optional)."""

    widget = forms.Textarea(attrs={"rows": 2})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return "\n".join(
                f"{t.get('key', '')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect', 'NoSchedule')}"
                for t in value
                if isinstance(t, dict)
            )
        return value

    def to_python(self, value: Any) -> list[dict[str, str]]:
        text = super().to_python(value) or ""
        out = []
        for n, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line:
                continue
            head, sep, effect = line.rpartition(":")
            if not sep:
                head, effect = line, "NoSchedule"
            key, _, val = head.partition("=")
            taint = {"key": key.strip(), "value": val.strip(), "effect": effect.strip()}
            try:
                validation.validate_taints([taint], "taints")
            except ValidationError as exc:
                raise ValidationError(
                    f"Line {n} ({line}): {' '.join(exc.messages)} Write key=value:Effect."
                ) from None
            out.append(taint)
        return out


class NodeSelectorField(forms.CharField):
    """Node labels as `key=value`, separated by commas or new lines."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return ", ".join(f"{k}={v}" for k, v in value.items())
        return value

    def to_python(self, value: Any) -> dict[str, str]:
        text = super().to_python(value) or ""
        out: dict[str, str] = {}
        for item in text.replace("\n", ",").split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, val = item.partition("=")
            if not sep:
                raise ValidationError(f"{item!r}: write label=value.")
            out[key.strip()] = val.strip()
        try:
            validation.validate_node_selector(out, "node_selector")
        except ValidationError as exc:
            raise ValidationError(" ".join(exc.messages)) from None
        return out


class MigLayoutField(forms.CharField):
    """MIG profiles each GPU is cut into, separated by commas: `3g.40gb, 2g.20gb`."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return ", ".join(str(p) for p in value)
        return value

    def to_python(self, value: Any) -> list[str]:
        text = super().to_python(value) or ""
        out = [p.strip() for p in text.replace("\n", ",").split(",") if p.strip()]
        try:
            validation.validate_mig_layout(out, "mig_layout")
        except ValidationError as exc:
            raise ValidationError(" ".join(exc.messages)) from None
        return out


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
    inference_floor_milli = GpuField(
        label="Inference floor (GPUs)",
        help_text="kept for production inference; training uses it only preemptibly",
    )

    class Meta:
        model = Pool
        fields = services.POOL_FIELDS
        labels = {
            "time_slicing_replicas": "Time-slicing replicas (per GPU)",
            "interconnect": "Interconnect",
            "architecture": "Architecture",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound and self.instance.pk:
            self.initial["inference_floor_milli"] = _gpus(self.instance.inference_floor_milli)

    def clean_inference_floor_milli(self) -> int:
        return _milli(self.cleaned_data["inference_floor_milli"]) or 0


class DecisionFilterForm(forms.Form):
    team = forms.ModelChoiceField(
        queryset=Team.objects.all(), required=False, empty_label="all teams"
    )
    request = forms.IntegerField(required=False, min_value=1, label="Request #")
    node = forms.CharField(required=False, max_length=253)
    kind = forms.ChoiceField(choices=[("", "all kinds"), *Decision.Kind.choices], required=False)

    def __init__(self, *args: Any, teams: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if teams is not None:
            self.fields["team"].queryset = teams  # type: ignore[attr-defined]


class QueueFilterForm(forms.Form):
    workload_class = forms.ModelChoiceField(
        queryset=WorkloadClass.objects.all(), required=False, empty_label="all classes"
    )
    team = forms.ModelChoiceField(
        queryset=Team.objects.all(), required=False, empty_label="all teams"
    )
    pool = forms.ModelChoiceField(
        queryset=Pool.objects.all(), required=False, empty_label="all pools"
    )

    def __init__(self, *args: Any, teams: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if teams is not None:
            self.fields["team"].queryset = teams  # type: ignore[attr-defined]


class CapacityFilterForm(forms.Form):
    pool = forms.ModelChoiceField(
        queryset=Pool.objects.all(), required=False, empty_label="all pools"
    )
    node = forms.CharField(required=False, max_length=253, label="Node name contains")


class RequestFilterForm(forms.Form):
    """My jobs: search and filters."""

    q = forms.CharField(
        required=False, max_length=100, label="Search", help_text="name, image or #"
    )
    state = forms.ChoiceField(
        choices=[("", "all states"), *GpuRequest.State.choices], required=False
    )
    team = forms.ModelChoiceField(
        queryset=Team.objects.all(), required=False, empty_label="all teams"
    )
    workload_class = forms.ModelChoiceField(
        queryset=WorkloadClass.objects.all(), required=False, empty_label="all classes"
    )

    def __init__(self, *args: Any, teams: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if teams is not None:
            self.fields["team"].queryset = teams  # type: ignore[attr-defined]


class NotificationPreferenceForm(forms.ModelForm):  # type: ignore[type-arg]
    webhook_url = forms.URLField(
        required=False,
        max_length=500,
        assume_scheme="https",
        label="Webhook URL",
        help_text=NotificationPreference._meta.get_field("webhook_url").help_text,
    )

    class Meta:
        model = NotificationPreference
        fields = [
            "email",
            "webhook_url",
            "on_start",
            "on_end",
            "on_failure",
            "on_preemption",
            "on_long_wait",
        ]


class TemplateSaveForm(forms.Form):
    template_name = forms.CharField(max_length=100, label="Save as template")


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


def _knob_label(name: str) -> str:
    """The knob's own name (as in the profile file), with its unit where the name has one."""
    if name.endswith("_gpu_s"):
        return f"{name} (GPU-seconds)"
    if name.endswith("_s"):
        return f"{name} (seconds)"
    return name


def _knob_form_field(knob: scheduling_profile.Knob) -> forms.Field:
    """A form field with the core's own bounds for one knob (`scheduling.profile`)."""
    kw: dict[str, Any] = {"label": _knob_label(knob.name), "help_text": knob.help}
    if knob.choices:
        return forms.ChoiceField(choices=[(c, c) for c in knob.choices], **kw)
    if knob.type is str:
        return forms.CharField(**kw)
    bounds = {"min_value": knob.minimum, "max_value": knob.maximum}
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


# ---------------------------------------------------------------------------
# Admin and lead pages: the audit log's filters, reasons, bulk actions


class AuditFilterForm(forms.Form):
    q = forms.CharField(
        required=False,
        max_length=100,
        label="Search",
        help_text="who, what, pool, node, team, reason or value",
    )
    date_from = forms.DateField(
        required=False, label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    date_to = forms.DateField(
        required=False, label="To", widget=forms.DateInput(attrs={"type": "date"})
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("date_from"), data.get("date_to")
        if start and end and end < start:
            self.add_error("date_to", "“To” is before “From”.")
        return data

    def bounds(self) -> dict[str, Any]:
        """The selector's filters: whole UTC days, `to` included."""
        from datetime import UTC, datetime, time, timedelta

        d = self.cleaned_data
        out: dict[str, Any] = {"q": d.get("q") or ""}
        if d.get("date_from"):
            out["since"] = datetime.combine(d["date_from"], time.min, tzinfo=UTC)
        if d.get("date_to"):
            out["until"] = datetime.combine(d["date_to"] + timedelta(days=1), time.min, tzinfo=UTC)
        return out


class ReasonForm(forms.Form):
    """The confirmation of cancel, cordon, drain and quota changes: why, in words."""

    reason = forms.CharField(
        max_length=500,
        label="Reason",
        help_text="goes into the audit log",
        error_messages={"required": "Say why: the reason goes into the audit log."},
    )

    def clean_reason(self) -> str:
        reason = self.cleaned_data["reason"].strip()
        if not reason:
            raise forms.ValidationError("Say why: the reason goes into the audit log.")
        return reason


class BulkIdsForm(ReasonForm):
    """Bulk actions: the selected ids (each checked on the server) and one reason."""

    ids = forms.TypedMultipleChoiceField(
        coerce=int,
        choices=[],
        label="Selected",
        error_messages={"required": "Select at least one."},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Any id is a valid choice here; access checks each one.
        raw = self.data.getlist("ids") if hasattr(self.data, "getlist") else []
        self.fields["ids"].choices = [(v, v) for v in raw if str(v).isdigit()]  # type: ignore[attr-defined]
