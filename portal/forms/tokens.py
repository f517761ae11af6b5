"""The form that creates a personal access token."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator

from portal.models import PersonalToken


class TokenCreateForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="what uses it, e.g. “laptop” or “nightly eval script”"
    )
    scope = forms.ChoiceField(
        choices=PersonalToken.Scope.choices,
        initial=PersonalToken.Scope.SUBMIT,
        help_text="read: look only; read and submit: everything you may do but admin work",
    )
    expires_in_days = forms.IntegerField(
        label="Expires in (days)", min_value=1, initial=settings.PERSONAL_TOKEN_DAYS
    )

    def __init__(self, *args: Any, admin: bool = False, read_only: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        field = self.fields["expires_in_days"]
        assert isinstance(field, forms.IntegerField)
        field.max_value = settings.PERSONAL_TOKEN_MAX_DAYS
        field.widget.attrs["max"] = settings.PERSONAL_TOKEN_MAX_DAYS
        field.validators.append(MaxValueValidator(settings.PERSONAL_TOKEN_MAX_DAYS))
        field.help_text = f"at most {settings.PERSONAL_TOKEN_MAX_DAYS} (the site's maximum)"
        scopes = PersonalToken.Scope.choices
        if read_only:
            scopes = [(v, n) for v, n in scopes if v == PersonalToken.Scope.READ]
            self.fields["scope"].initial = PersonalToken.Scope.READ
        elif not admin:
            scopes = [(v, n) for v, n in scopes if v != PersonalToken.Scope.ADMIN]
        scope = self.fields["scope"]
        assert isinstance(scope, forms.ChoiceField)
        scope.choices = scopes
