"""Profiles stored before `starving_loss_ratio` existed get it, at the shipped value.

Without it a stored profile would run the new rule through `Policy()`'s default while
its decisions still recorded the old version. Each such profile gets the knob written,
its version bumped, and the change audited and numbered like an admin's edit.
"""

from django.db import migrations

NEW_KNOBS = {"starving_loss_ratio": 1.0}


def add_knobs(apps, schema_editor):
    PolicyProfile = apps.get_model("portal", "PolicyProfile")
    AuditEvent = apps.get_model("portal", "AuditEvent")
    PolicyVersion = apps.get_model("portal", "PolicyVersion")
    for row in PolicyProfile.objects.order_by("pk"):
        missing = {k: v for k, v in NEW_KNOBS.items() if k not in row.knobs}
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


class Migration(migrations.Migration):
    dependencies = [("portal", "0018_write_indexes")]

    operations = [migrations.RunPython(add_knobs, migrations.RunPython.noop)]
