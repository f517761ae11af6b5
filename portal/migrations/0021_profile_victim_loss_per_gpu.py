"""Profiles stored before `victim_loss_per_gpu_s` existed get it, at the shipped value
(versioned and audited: see `_profile_knobs`)."""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from portal.migrations._profile_knobs import add_knobs


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    add_knobs(apps, {"victim_loss_per_gpu_s": 900})


class Migration(migrations.Migration):
    dependencies = [("portal", "0020_decision_log_without_fk_constraints")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
