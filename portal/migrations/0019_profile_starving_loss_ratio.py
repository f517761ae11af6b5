"""Profiles stored before `starving_loss_ratio` existed get it, at the shipped value
(versioned and audited: see `_profile_knobs`)."""

from django.db import migrations

from portal.migrations._profile_knobs import add_knobs


def forwards(apps, schema_editor):
    add_knobs(apps, {"starving_loss_ratio": 1.0})


class Migration(migrations.Migration):
    dependencies = [("portal", "0018_write_indexes")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
