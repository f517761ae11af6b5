"""Form fields and small forms every page shares: GPUs, device profiles, taints, node selectors,
MIG layouts, a reason, a set of ids."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from portal.lib import validation


def to_milli(value: Decimal | None) -> int | None:
    return None if value is None else int(value * 1000)


def to_gpus(milli: int | None) -> Decimal | None:
    return None if milli is None else Decimal(milli) / 1000


class MarksRequired:
    """Says `aria-required` on each required field's widget (the label's asterisk is for eyes)."""

    fields: dict[str, forms.Field]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for f in self.fields.values():
            if f.required:
                f.widget.attrs["aria-required"] = "true"


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

    # A CharField's text, parsed: it cleans to the structure the services store, not a str.
    def to_python(self, value: Any) -> list[dict[str, str]]:  # type: ignore[override]
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

    def to_python(self, value: Any) -> dict[str, str]:  # type: ignore[override]
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

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        out = [p.strip() for p in text.replace("\n", ",").split(",") if p.strip()]
        try:
            validation.validate_mig_layout(out, "mig_layout")
        except ValidationError as exc:
            raise ValidationError(" ".join(exc.messages)) from None
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
        reason: str = self.cleaned_data["reason"].strip()
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
