"""Filters of list pages: decisions, the queue, capacity, requests, the audit log."""

from __future__ import annotations

from typing import Any

from django import forms

from portal.models import Decision, GpuRequest, Pool, Team, WorkloadClass


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
