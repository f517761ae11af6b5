"""Give stored scheduling profiles a knob new in a release, at the shipped value.

Without it a stored profile would run the new rule through `Policy()`'s default while its
decisions still recorded the old version. Each profile missing a knob gets it written, its
version bumped, and the change audited and numbered like an admin's edit. (A module of
the migrations package that Django does not load as a migration: its name starts with _.)
"""

from django.db.migrations.state import StateApps


def add_knobs(apps: StateApps, new_knobs: dict[str, object]) -> None:
    PolicyProfile = apps.get_model("portal", "PolicyProfile")
    AuditEvent = apps.get_model("portal", "AuditEvent")
    PolicyVersion = apps.get_model("portal", "PolicyVersion")
    for row in PolicyProfile.objects.order_by("pk"):
        missing = {k: v for k, v in new_knobs.items() if k not in row.knobs}
        if not missing:
            continue
        before = {"version": row.version, **{k: None for k in missing}}
        row.knobs = {**row.knobs, **missing}
        row.version += 1
        row.save(update_fields=["knobs", "version"])
        after = {"version": row.version, **missing}
        fields = dict(
            action="profile.update",
            object_type="policyprofile",
            object_id=str(row.pk),
            actor_name="upgrade",
            before=before,
            after=after,
        )
        AuditEvent.objects.create(
            **fields, reason="a knob new in this release, at the shipped value"
        )
        latest = PolicyVersion.objects.order_by("-number").first()
        PolicyVersion.objects.create(number=(latest.number if latest else 0) + 1, **fields)
