"""Forms of team pages: quotas, member caps and roles, new teams and members."""

from __future__ import annotations

from typing import Any

from django import forms

from portal.forms.fields import GpuField, MarksRequired, to_gpus, to_milli


class QuotaForm(MarksRequired, forms.Form):
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
        reason: str = self.cleaned_data["reason"].strip()
        if not reason:
            raise forms.ValidationError("Say why: the reason goes into the audit log.")
        return reason

    @classmethod
    def initial_for(cls, quota: Any) -> dict[str, Any]:
        if quota is None:
            return {"nominal": 0}
        return {
            "nominal": to_gpus(quota.nominal_milli),
            "borrowing_limit": to_gpus(quota.borrowing_limit_milli),
            "lending_limit": to_gpus(quota.lending_limit_milli),
            "granted": to_gpus(quota.granted_milli),
        }

    def service_kwargs(self) -> dict[str, Any]:
        d = self.cleaned_data
        out = {
            "nominal_milli": to_milli(d["nominal"]),
            "borrowing_limit_milli": to_milli(d.get("borrowing_limit")),
            "lending_limit_milli": to_milli(d.get("lending_limit")),
            "reason": d["reason"],
        }
        if "granted" in self.fields and d.get("granted") is not None:
            out["granted_milli"] = to_milli(d["granted"])
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


class TeamRetireForm(forms.Form):
    """Retiring a team with work in it: confirm (its waiting requests are cancelled)."""

    confirm = forms.BooleanField(required=False, label="Retire it")
