"""Scheduling profiles: named, versioned sets of the core's knobs; created, changed, activated."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.models import PolicyProfile
from portal.services.audit import audit
from scheduling import profile as scheduling_profile


def _profile_errors(exc: scheduling_profile.ProfileError) -> ValidationError:
    key = "__all__" if exc.key == "profile" else exc.key
    return ValidationError({key: exc.message})


def _check_profile(name: str, version: int, knobs: dict[str, Any]) -> dict[str, Any]:
    """Every knob, checked by the core's own rules (`scheduling.profile`)."""
    try:
        return scheduling_profile.parse({"name": name, "version": version, **knobs}).dump()
    except scheduling_profile.ProfileError as exc:
        raise _profile_errors(exc) from None


def _knobs_of(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in scheduling_profile.KNOBS}


def policy_profile_create(
    *, actor: User | None, name: str, knobs: dict[str, Any] | None = None
) -> PolicyProfile:
    """A new, inactive profile: the shipped default's knobs with `knobs` over them."""
    base = dict(scheduling_profile.load().knobs)
    checked = _check_profile(name, 1, {**base, **(knobs or {})})
    with transaction.atomic():
        if PolicyProfile.objects.filter(name=name).exists():
            raise ValidationError({"name": "A profile with this name exists."})
        row = PolicyProfile.objects.create(
            name=name, version=1, knobs=_knobs_of(checked), updated_by=_real(actor)
        )
        audit(
            actor=actor,
            action="profile.create",
            obj=row,
            after={"name": name, "version": 1, **row.knobs},
        )
    return row


def policy_profile_update(
    *, actor: User | None, profile: PolicyProfile, knobs: dict[str, Any]
) -> PolicyProfile:
    """Change some knobs; the version goes up by one when anything changed. Audited with the
    changed knobs, old and new."""
    with transaction.atomic():
        row = PolicyProfile.objects.select_for_update().get(pk=profile.pk)
        checked = _knobs_of(_check_profile(row.name, row.version, {**row.knobs, **knobs}))
        old = row.profile().knobs
        changed = sorted(k for k in checked if checked[k] != old.get(k))
        if not changed:
            return row
        before = {"version": row.version, **{k: old.get(k) for k in changed}}
        row.knobs = checked
        row.version += 1
        row.updated_by = _real(actor)
        row.save()
        audit(
            actor=actor,
            action="profile.update",
            obj=row,
            before=before,
            after={"version": row.version, **{k: checked[k] for k in changed}},
        )
    return row


def policy_profile_activate(*, actor: User | None, profile: PolicyProfile) -> PolicyProfile:
    """Make this the profile the tick runs; the one active before stops being active."""
    with transaction.atomic():
        rows = list(PolicyProfile.objects.select_for_update().order_by("pk"))
        row = next((r for r in rows if r.pk == profile.pk), None)
        if row is None:
            raise ValidationError({"__all__": "No such profile."})
        _check_profile(row.name, row.version, row.knobs)
        was = next((r for r in rows if r.active), None)
        if was is not None and was.pk == row.pk:
            return row
        # Off first: the database allows one active row at a time.
        PolicyProfile.objects.filter(active=True).update(active=False)
        PolicyProfile.objects.filter(pk=row.pk).update(
            active=True, updated_by=_real(actor), updated_at=timezone.now()
        )
        row.refresh_from_db()
        audit(
            actor=actor,
            action="profile.activate",
            obj=row,
            before={"active": str(was) if was else None},
            after={"active": str(row)},
        )
    return row


def policy_profile_ensure() -> PolicyProfile:
    """The active profile; when none is (a new or emptied database), the shipped default is
    stored and made active. Idempotent: the tick and the demo call it."""
    row = PolicyProfile.objects.filter(active=True).first()
    if row is not None:
        return row
    shipped = scheduling_profile.load()
    with transaction.atomic():
        row = PolicyProfile.objects.filter(name=shipped.name).first()
        if row is None:
            row = policy_profile_create(actor=None, name=shipped.name, knobs=dict(shipped.knobs))
        return policy_profile_activate(actor=None, profile=row)


def _real(actor: Any) -> Any:
    return actor if actor is not None and getattr(actor, "is_authenticated", False) else None
